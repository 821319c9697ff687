"""Sharpened constants (the ``sharpened`` kind): the average, with a sharpness per layer fitted label-free.

Why: the average of many inputs' attention is flatter than any one input's attention. Every constant layer then
mixes each token with more of the sequence than the source did, the tokens of one input drift toward their mean,
and the loss compounds layer after layer (on all-mpnet-base-v2 at L=512, fraction 1, the tokens of a document end
nearly identical). Raising each constant row to a power p > 1 (rows are renormalised at use, as every constant's)
gives back some of the concentration one input's attention has, at no cost at inference: the result is again one
constant matrix per head, stored and run as any other.

The exponent is fitted per layer on unlabelled text, greedily from the first layer up. For a layer with constant
heads, each exponent of ``grid`` is tried with the layers below at their fitted exponents (and those above still
the average), and the one whose hidden states from that layer to the last are closest to the source's (the mean
squared error over real tokens relative to the source's variance, per layer, averaged: healing's ``layers``
objective over the layers the choice reaches) is kept for every constant head of that layer. Scoring only the
layer's own output missed what sharpening is for, the compounding: on all-MiniLM-L6-v2 it chose the average
everywhere. ``p = 1`` (the average itself) is always a candidate, so on the fitting text no choice leaves the model
farther from the source than the average did, given the layers below.
"""

from __future__ import annotations

import torch

from ..calibration.constants import Constants
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow
from ..conversion.surgery import convert, normalize_heads
from ..hub_code.modeling_papa import attention_modules, heads_by_layer
from .objective import hidden_error

GRID = (0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
__all__ = ["GRID", "sharpen", "sharpened_values"]


def sharpened_values(constants: Constants, exponents: dict[int, float], heads) -> torch.Tensor:
    """The (layers, heads, L, L) values of ``constants`` with the rows of ``heads`` raised to their layer's exponent."""
    values = constants.values.clone()
    for layer, hs in heads_by_layer(heads).items():
        p = exponents.get(layer, 1.0)
        if p != 1.0:
            chosen = sorted(hs)
            values[layer, chosen] = values[layer, chosen].double().clamp_min(0).pow(p).to(values.dtype)
    return values


def sharpen(
    model,
    tokenizer,
    corpus,
    constants: Constants,
    heads,
    *,
    grid: tuple[float, ...] = GRID,
    max_examples: int = 128,
    batch_size: int = 16,
    device=None,
    progress: bool = True,
) -> Constants:
    """Constants whose ``heads`` are sharpened by an exponent per layer, fitted to the source (module docstring).

    Args:
        model: the source model (never changed).
        tokenizer: its tokenizer.
        corpus: unlabelled text (anything :func:`papa_surgery.calibration.load_corpus` accepts), usually the
            calibration corpus; its first ``max_examples`` examples are the fitting text.
        constants: the starting matrices (the ``average`` from :func:`papa_surgery.calibrate`).
        heads: ``[[layer, head], ...]`` that will be constant (e.g. ``ranking.select(fraction)``); the other heads
            keep their attention while fitting and their matrices are returned unchanged.
        grid: the exponents tried per layer (1, the average, is always added).
        max_examples: how many corpus examples to fit on.
        batch_size: examples per forward pass.
        device: where to run (default: the model's device).
        progress: show a progress bar over the layers.

    Returns:
        ``Constants`` of kind ``sharpened``, with the counts and variance of ``constants`` and, in
        ``metadata["sharpened"]``, the exponent per layer and the ``layers`` objective on the fitting text before
        (the average) and after.
    """
    from tqdm.auto import tqdm

    grid = tuple(sorted({float(p) for p in grid} | {1.0}))
    if any(p <= 0 for p in grid):
        raise ValueError(f"grid: exponents must be positive, got {grid}")
    constants = constants.to_dense()
    heads = normalize_heads(heads, constants.num_layers, constants.num_heads)
    corpus = load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
    examples = list(corpus)
    if heads and not examples:
        raise ValueError(f"the corpus {corpus.description} gave no examples to fit the sharpness on")
    exponents: dict[int, float] = {}
    before = after = None
    if heads:
        device, restore = borrow(model, device)
        try:
            papa = convert(model, constants, heads, tokenizer=tokenizer, storage="dense").to(device).eval()
            batches = _batches(model, tokenizer, examples, constants, batch_size, device)
            modules = dict(enumerate(attention_modules(papa)))
            starts = {layer: modules[layer].papa_constants.detach().clone() for layer in heads_by_layer(heads)}
            before = _objective(papa, batches)
            for layer in tqdm(sorted(starts), desc="sharpness", unit="layer", disable=not progress):
                scores = {}
                for p in grid:
                    _set(modules[layer], starts[layer], p)
                    scores[p] = _objective(papa, batches, first=layer + 1)
                exponents[layer] = min(grid, key=lambda p: (scores[p], abs(p - 1.0)))  # ties: nearest the average
                _set(modules[layer], starts[layer], exponents[layer])
            after = _objective(papa, batches)
        finally:
            restore()
    metadata = {
        **constants.metadata,
        "sharpened": {
            "from_kind": constants.kind,
            "heads": heads,
            "exponents": {str(layer): p for layer, p in sorted(exponents.items())},
            "grid": list(grid),
            "examples": len(examples),
            "corpus": corpus.description,
            "objective": "layers",
            "loss_average": before,
            "loss_sharpened": after,
        },
    }
    c = constants
    values = sharpened_values(c, exponents, heads)
    out = Constants(values, "sharpened", c.max_length, c.pairs, c.counts, c.variance, metadata)
    out._coverage_warned = getattr(c, "_coverage_warned", False)  # the same corpus: warn once
    return out


@torch.no_grad()
def _set(module, start: torch.Tensor, p: float) -> None:
    """The layer's (Hc, L, L) constants raised to ``p``, in place (bumping the tensor's version: the runtime's
    prepared matrices are rebuilt)."""
    module.papa_constants.copy_(start.double().clamp_min(0).pow(p))


def _batches(model, tokenizer, examples, constants: Constants, batch_size: int, device):
    """[(inputs, the source's hidden states), ...] of the fitting text, computed once."""
    out = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            enc = encode(tokenizer, examples[start : start + batch_size], constants.max_length, pairs=constants.pairs)
            inputs = {k: v.to(device) for k, v in model_inputs(model, enc).items()}
            targets = model(**inputs, output_hidden_states=True).hidden_states
            out.append((inputs, targets))
    return out


@torch.no_grad()
def _objective(papa, batches, first: int = 1) -> float:
    """The relative hidden-state error over the fitting text, averaged over the hidden states from index ``first``
    on (1: every layer's; a layer's choice reaches its own, ``layer + 1``, and every later one)."""
    total, count = 0.0, 0
    for inputs, targets in batches:
        outputs = papa(**inputs, output_hidden_states=True).hidden_states
        # hidden_error skips index 0 of what it is given: hand it the states from first - 1 on
        loss = hidden_error(outputs[first - 1 :], targets[first - 1 :], inputs["attention_mask"], "layers")
        count += len(targets[0])
        total += float(loss) * len(targets[0])
    return total / count
