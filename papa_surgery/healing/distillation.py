"""Distilled constants: healing that trains the constant matrices only (the ``distilled`` kind).

Averaging (paper 3.1) is a lower bound on the best constant matrices (the paper's Limitations). ``distill``
starts from given constants (the average) and, with every backbone weight frozen, optimises the matrices of
the heads being made constant so that the converted model's hidden states match the source's on the
unlabelled calibration corpus. It is the healing loop (:mod:`.loop`) with ``train="constants"``
(:mod:`.trainable`) at a constant learning rate, returning ``Constants`` instead of a model:

- ``objective="layers"`` (default): the mean over layers of each layer's hidden-state error, relative to the
  source's variance there (:func:`.objective.hidden_error`);
- ``objective="last"``: the last hidden states only (end to end).

Constants stay non-negative (``exp(theta)``, theta initialised at ``log C``) and are masked and row-normalised at
use exactly as averaged ones. Deterministic for a seed; under ``torch.distributed`` N processes with ``batch_size``
each take the steps of one process with N times that batch (:mod:`.loop`).
"""

from __future__ import annotations

import math

import torch

from ..calibration.constants import Constants
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow, process_batches
from ..conversion.surgery import convert, normalize_heads
from ..hub_code.modeling_papa import attention_modules, heads_by_layer
from .objective import hidden_error

OBJECTIVES = ("layers", "last")
__all__ = ["OBJECTIVES", "distill", "distillation_loss", "hidden_error"]


def distill(
    model,
    tokenizer,
    corpus,
    constants: Constants,
    heads,
    *,
    steps: int = 200,
    lr: float = 0.01,
    batch_size: int = 16,
    objective: str = "layers",
    seed: int = 0,
    max_examples: int | None = None,
    device=None,
    progress: bool = True,
) -> Constants:
    """Constants whose ``heads`` are trained to reproduce the source's hidden states (module docstring).

    Args:
        model: the source model (never changed: it runs frozen as the teacher).
        tokenizer: its tokenizer.
        corpus: the unlabelled corpus (anything :func:`papa_surgery.calibration.load_corpus` accepts), usually the
            calibration corpus.
        constants: the starting matrices (usually ``average`` from :func:`papa_surgery.calibrate`).
        heads: ``[[layer, head], ...]`` that will be constant (e.g. ``ranking.select(fraction)``); the other
            heads keep their attention while training and their matrices are returned unchanged.
        steps: optimisation steps (the step budget); one batch per step over a seeded order of the corpus.
        lr: Adam learning rate on ``theta = log C`` (constant through the run).
        batch_size: examples per step (per process).
        objective: ``"layers"`` or ``"last"``.
        seed: the seed of the batch order.
        max_examples: use at most this many examples of the corpus.
        device: where to train (default: the model's device).
        progress: show a progress bar.

    Returns:
        ``Constants`` of kind ``distilled``, with the counts and variance of ``constants`` and the run's settings
        and loss before/after in ``metadata["distilled"]``.
    """
    from ..arguments import check_fit_arguments
    from .loop import LoopSettings, train
    from .objective import Objective
    from .trainable import prepare

    numbers = dict(steps=steps, lr=lr, batch_size=batch_size, seed=seed, max_examples=max_examples, device=device)
    constants, heads = check_fit_arguments(model, tokenizer, constants, heads, numbers)
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown distillation objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    constants = constants.to_dense()  # trained as dense (L, L) matrices
    corpus = load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
    heads = normalize_heads(heads, constants.num_layers, constants.num_heads)
    if not heads:
        return constants
    examples = list(corpus)
    if not examples:
        raise ValueError(f"the corpus {corpus.description} gave no examples to distil on")
    settings = LoopSettings(steps, batch_size, lr, lr, warmup=0.0, seed=seed, eval_every=0, decay=False)
    device, restore = borrow(model, device)
    try:
        papa = convert(model, constants, heads, tokenizer=tokenizer, storage="dense")
        trainable = prepare(papa, "constants")
        trainable.model.to(device)
        history = train(
            trainable,
            model,
            tokenizer,
            examples,
            max_length=constants.max_length,
            pairs=constants.pairs,
            objective=Objective.resolve(objective),
            settings=settings,
            progress=progress,
        )
        trained = {layer: m.papa_constants.detach().float().cpu() for layer, m in _constant_modules(trainable.student)}
    finally:
        restore()
    values = constants.values.clone()
    for layer, hs in heads_by_layer(heads).items():
        values[layer, sorted(hs)] = trained[layer]
    losses = history["losses"]
    window = max(1, min(10, steps // 5))
    metadata = {
        **constants.metadata,
        "distilled": {
            "from_kind": constants.kind,
            "heads": heads,
            "steps": steps,
            "lr": lr,
            "batch_size": batch_size,
            "objective": objective,
            "seed": seed,
            "corpus": corpus.description,
            "loss_first_steps": sum(losses[:window]) / window,
            "loss_last_steps": sum(losses[-window:]) / window,
        },
    }
    c = constants
    out = Constants(values, "distilled", c.max_length, c.pairs, c.counts, c.variance, metadata)
    out._coverage_warned = getattr(c, "_coverage_warned", False)  # the same corpus: warn once
    return out


def _constant_modules(student):
    """(layer, attention module) of every layer with constant heads (their ``papa_constants`` = exp(theta))."""
    return [(layer, m) for layer, m in enumerate(attention_modules(student)) if hasattr(m, "papa_constants")]


def distillation_loss(model, tokenizer, corpus, constants: Constants, heads, objective="layers", batch_size=16):
    """The objective of :func:`distill` averaged over one pass of ``corpus`` (for comparing constants)."""
    corpus = load_corpus(corpus, pairs=constants.pairs)
    papa = convert(model, constants, heads, tokenizer=tokenizer, storage="dense")
    total, count = 0.0, 0
    with torch.no_grad():
        bar, _ = process_batches(corpus, batch_size, "loss", progress=False)
        for batch in bar:
            enc = encode(tokenizer, batch, constants.max_length, pairs=constants.pairs)
            inputs = model_inputs(model, enc)
            targets = model(**inputs, output_hidden_states=True).hidden_states
            outputs = papa(**inputs, output_hidden_states=True).hidden_states
            loss = hidden_error(outputs, targets, enc["attention_mask"], objective)
            total, count = total + float(loss) * len(batch), count + len(batch)
    return total / max(count, 1) if count else math.nan
