"""Sharpened constants (the ``sharpened`` kind): the average, with a sharpness per layer fitted label-free.

Why: the average of many inputs' attention is flatter than any one input's attention. Every constant layer then
mixes each token with more of the sequence than the source did, the tokens of one input drift toward their mean,
and the loss compounds layer after layer (on all-mpnet-base-v2 at L=512, fraction 1, the tokens of a document end
nearly identical). Raising each constant row to a power p > 1 (rows are renormalised at use, as every constant's)
gives back some of the concentration one input's attention has, at no cost at inference: the result is again one
constant matrix per head, stored and run as any other.

The exponent is fitted per head by default (``search="per-head"``): gradient descent on one exponent per constant
head, over every layer at once (:mod:`.head_sharpness`), minimising the mean squared error of each layer's hidden
states over real tokens relative to the source's variance, averaged (healing's ``layers`` objective). The heads of a
layer differ, and measured on all-MiniLM-L6-v2 and all-mpnet-base-v2 (``docs/kinds-ranking.md``) it came out at
least as close to the source as one exponent per layer in every setting, for no more time.

``search="walk"`` and ``search="grid"`` fit one exponent per layer instead, greedily from the first layer up. For a
layer with constant heads, exponents of ``grid`` are tried with the layers below at their fitted exponents (and
those above still the average), and the one whose hidden states from that layer to the last are closest to the
source's (the same objective over the layers the choice reaches) is kept for every constant head of that layer.
``walk`` tries 1, then walks the grid upward while each step scores better, and downward only if the first step up
did not: the grid's best wherever the score has one strict minimum along the grid (measured on all-MiniLM-L6-v2 and
all-mpnet-base-v2: the same exponents as trying every one, ``benchmarks/results/bench_sharpen_search.txt``), in
about half the trials. ``grid`` tries every exponent. The scores of the trials made are kept in the metadata.
Scoring only the layer's own output missed what sharpening is for, the compounding: on all-MiniLM-L6-v2 it chose the
average everywhere. ``p = 1`` (the average itself) is always a candidate, so on the fitting text no choice leaves the
model farther from the source than the average did, given the layers below; a per-head fit that ends farther keeps
the average.

What it costs: a per-head step runs forward and backward over one batch of at most ``STEP_EXAMPLES`` examples and
``STEP_TOKENS`` tokens, the same steps for any ``batch_size`` that is a multiple of ``STEP_EXAMPLES``
(:func:`.head_sharpness.step_batches`). A layer's trials run only that layer and the ones above it. The layers below
are already fitted, so what they return on each batch is kept (one hidden state per batch, the input of the layer
being fitted) and they are skipped; fitting n layers runs about (n + 1) / 2 forward passes per exponent instead of
n. The fitting text is batched by length, so a batch is padded to about its own examples' length.
"""

from __future__ import annotations

import torch

from ..calibration.constants import Constants
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow
from ..conversion.surgery import convert, normalize_heads
from ..hub_code.modeling_papa import attention_modules, heads_by_layer
from ..registry import DEFAULT_SHARPEN_SEARCH, SHARPEN_SEARCHES
from .blocks import recording, returned_by, skipped
from .head_sharpness import STEP_EXAMPLES, STEP_TOKENS, fit_head_exponents, step_batches
from .objective import hidden_error
from .trainable import layer_modules

GRID = (0.75, 1.0, 1.25, 1.5, 2.0, 2.5, 3.0)
SEARCHES = SHARPEN_SEARCHES
PER_HEAD = "per-head"
__all__ = ["GRID", "SEARCHES", "raised", "sharpen", "sharpened_values"]


def sharpened_values(constants: Constants, exponents: dict, heads) -> torch.Tensor:
    """The (layers, heads, L, L) values of ``constants`` with the rows of ``heads`` raised to their exponent:
    ``exponents[layer]`` is the layer's (a number) or each of its heads' (``{head: p}``); missing ones are 1. A raised
    row is divided by its largest value (:func:`raised`)."""
    values = constants.values.clone()
    for layer, hs in heads_by_layer(heads).items():
        chosen = sorted(hs)
        p = exponents.get(layer, 1.0)
        p = [p.get(h, 1.0) for h in chosen] if isinstance(p, dict) else [p] * len(chosen)
        values[layer, chosen] = raised(values[layer, chosen], p).to(values.dtype)  # (heads, L, L)
    return values


def raised(rows: torch.Tensor, p) -> torch.Tensor:
    """(heads, L, L) ``rows`` to the power ``p`` (a number, or one per head), in float64, each raised row divided by
    its largest value: rows are renormalised at use, so the scale is free, and a row of small values raised to a
    large power would otherwise underflow to zeros in float32 (a head that silently contributes nothing). A head at
    ``p = 1`` keeps its values as they are (the average itself, bit for bit once cast back)."""
    p = torch.as_tensor(p, dtype=torch.float64, device=rows.device).reshape(-1, 1, 1).expand(len(rows), 1, 1)
    up = rows.double().clamp_min(0).pow(p)
    up = up / up.amax(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
    return torch.where(p == 1.0, rows.double(), up)


def sharpen(
    model,
    tokenizer,
    corpus,
    constants: Constants,
    heads,
    *,
    grid: tuple[float, ...] = GRID,
    search: str = DEFAULT_SHARPEN_SEARCH,
    steps: int = 64,
    lr: float = 0.05,
    max_examples: int = 128,
    batch_size: int = 16,
    device=None,
    progress: bool = True,
) -> Constants:
    """Constants whose ``heads`` are sharpened by an exponent per layer (or per head), fitted to the source (module
    docstring).

    Args:
        model: the source model (never changed).
        tokenizer: its tokenizer.
        corpus: unlabelled text (anything :func:`papa_surgery.calibration.load_corpus` accepts), usually the
            calibration corpus; its first ``max_examples`` examples are the fitting text.
        constants: the starting matrices (the ``average`` from :func:`papa_surgery.calibrate`).
        heads: ``[[layer, head], ...]`` that will be constant (e.g. ``ranking.select(fraction)``); the other heads
            keep their attention while fitting and their matrices are returned unchanged.
        grid: the exponents a layer can take (1, the average, is always added); ``walk`` and ``grid`` only.
        search: ``"per-head"`` (the default: an exponent per head, by gradient: :mod:`.head_sharpness`), or an
            exponent per layer: ``"walk"`` (out from 1 while the score improves) or ``"grid"`` (every exponent);
            module docstring.
        steps: Adam steps of ``per-head`` (one batch each: at most ``STEP_EXAMPLES`` examples and ``STEP_TOKENS``
            tokens).
        lr: Adam's learning rate (on log p) of ``per-head``.
        max_examples: how many corpus examples to fit on.
        batch_size: examples per forward pass without gradients (the source's hidden states, the objective, the
            per-layer trials).
        device: where to run (default: the model's device).
        progress: show a progress bar over the layers.

    Returns:
        ``Constants`` of kind ``sharpened``, with the counts and variance of ``constants`` and, in
        ``metadata["sharpened"]``, the exponent per layer and each layer's ``trials`` (exponent: score), or with
        ``per-head`` the exponent per head (``{layer: {head: p}}``; empty where the average was kept) and each step's
        loss (``losses``), and the ``layers`` objective on the fitting text before (the average) and after.
    """
    from ..arguments import check_fit_arguments

    numbers = dict(batch_size=batch_size, max_examples=max_examples, device=device)
    if search == PER_HEAD:  # the steps and rate of its gradient fit; walk and grid take none
        numbers.update(steps=steps, lr=lr)
    constants, heads = check_fit_arguments(model, tokenizer, constants, heads, numbers)
    grid = tuple(sorted({float(p) for p in grid} | {1.0}))
    if any(p <= 0 for p in grid):
        raise ValueError(f"grid: exponents must be positive, got {grid}")
    if search not in SEARCHES:
        raise ValueError(f"search: must be one of {', '.join(SEARCHES)}, got {search!r}")
    constants = constants.to_dense().fill()  # what convert uses: the fitted model is the one a user converts
    heads = normalize_heads(heads, constants.num_layers, constants.num_heads)
    corpus = load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
    examples = list(corpus)
    if heads and not examples:
        raise ValueError(f"the corpus {corpus.description} gave no examples to fit the sharpness on")
    exponents: dict = {}
    trials: dict[int, dict[float, float]] = {}
    losses: list[float] = []
    before = after = None
    if heads:
        device, restore = borrow(model, device)
        try:
            papa = convert(model, constants, heads, tokenizer=tokenizer, storage="dense").to(device).eval()
            batches = _batches(model, tokenizer, examples, constants, batch_size, device)
            modules = dict(enumerate(attention_modules(papa)))
            starts = {layer: modules[layer].papa_constants.detach().clone() for layer in heads_by_layer(heads)}
            before = _objective(papa, batches)
            if search == PER_HEAD:
                losses = _fit_heads(papa, modules, starts, heads, batches, exponents, steps, lr, progress)
            else:
                _fit_layers(papa, modules, starts, batches, grid, search, exponents, trials, progress)
            after = _objective(papa, batches)
            if search == PER_HEAD and not after <= before:  # steps on single batches can end worse (or diverge)
                exponents.clear()  # the average, as the walk's p = 1 would have kept
                after = before
        finally:
            restore()
    metadata = {
        **constants.metadata,
        "sharpened": {
            "from_kind": constants.kind,
            "heads": heads,
            "exponents": {str(layer): _keyed(p) for layer, p in sorted(exponents.items())},
            "search": search,
            **(
                {
                    "steps": steps,
                    "lr": lr,
                    "batch_size": batch_size,
                    "step_examples": STEP_EXAMPLES,
                    "step_tokens": STEP_TOKENS,
                    "losses": losses,
                }
                if search == PER_HEAD
                else {
                    "grid": list(grid),
                    "trials": {str(la): {str(p): v for p, v in sorted(t.items())} for la, t in sorted(trials.items())},
                }
            ),
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


def _fit_heads(papa, modules, starts, heads, batches, exponents, steps, lr, progress) -> list[float]:
    """``per-head``: each constant head's exponent into ``exponents`` (``{layer: {head: p}}``) and ``papa``; the
    loss of each step."""
    fitted, losses = fit_head_exponents(
        papa,
        {layer: modules[layer] for layer in starts},
        starts,
        step_batches(batches, STEP_TOKENS, STEP_EXAMPLES),
        steps=steps,
        lr=lr,
        progress=progress,
    )
    by_layer = heads_by_layer(heads)
    for layer, ps in fitted.items():
        exponents[layer] = dict(zip(sorted(by_layer[layer]), ps, strict=True))
        _set(modules[layer], starts[layer], ps)
    return losses


def _fit_layers(papa, modules, starts, batches, grid, search, exponents, trials, progress) -> None:
    """``walk`` / ``grid``: each layer's exponent into ``exponents`` and ``papa``, greedily from the first layer up
    (module docstring); the scores of the trials into ``trials``."""
    from tqdm.auto import tqdm

    blocks = layer_modules(papa)
    known = None  # (k, what block k returns on each batch with the exponents fitted so far)
    for layer in tqdm(sorted(starts), desc="sharpness", unit="layer", disable=not progress):
        below = _returned_by(papa, blocks, batches, layer - 1, known)
        kept = []  # [(rank, what block `layer` returned on each batch)]: the best trial so far

        def score(p: float, layer=layer, below=below, kept=kept) -> float:
            _set(modules[layer], starts[layer], p)
            with recording(blocks[layer]) as returned:
                value = _objective(papa, batches, first=layer + 1, skip=(blocks[:layer], below))
            if not kept or _ranked(value, p) < kept[0][0]:
                kept[:] = [(_ranked(value, p), returned)]
            return value

        trials[layer] = {}
        exponents[layer] = _search(grid, score, trials[layer], walk=search == "walk")
        known = (layer, kept[0][1])  # the chosen trial's: both rank trials by _ranked
        _set(modules[layer], starts[layer], exponents[layer])


def _keyed(p):
    """A layer's exponent for JSON: the number, or ``{"head": p}``."""
    return {str(h): v for h, v in sorted(p.items())} if isinstance(p, dict) else p


def _ranked(score: float, p: float) -> tuple[float, float]:
    """What orders trials: the score, then (ties) the distance from the average."""
    return score, abs(p - 1.0)


def _search(grid: tuple[float, ...], score, scores: dict[float, float], walk: bool) -> float:
    """An exponent of ``grid`` (sorted, holding 1) of low ``score(p)``, ties going to the one nearer 1; every score
    taken is put in ``scores``. ``walk``: from 1 up while each step scores strictly lower, then (only if no step up
    did) down likewise: the first minimum from 1, the grid's lowest where the scores have one strict minimum along
    it. Else every exponent is scored and the lowest kept."""

    def better(p: float, q: float) -> bool:
        return _ranked(scores[p], p) < _ranked(scores[q], q)

    start = grid.index(1.0)
    if not walk:
        for p in grid:
            scores[p] = score(p)
        return min(grid, key=lambda p: _ranked(scores[p], p))
    scores[1.0] = score(1.0)
    best = 1.0
    for step in (1, -1):
        i = start + step
        while 0 <= i < len(grid):
            scores[grid[i]] = score(grid[i])
            if not better(grid[i], best):
                break
            best, i = grid[i], i + step
        if best != 1.0:  # a step up helped: with one minimum along the grid, no step down can
            break
    return best


@torch.no_grad()
def _set(module, start: torch.Tensor, p) -> None:
    """The layer's (Hc, L, L) constants raised to ``p`` (a number, or (Hc,) one per head; :func:`raised`), in place
    (bumping the tensor's version: the runtime's prepared matrices are rebuilt)."""
    module.papa_constants.copy_(raised(start, p))


def _batches(model, tokenizer, examples, constants: Constants, batch_size: int, device):
    """[(inputs, the source's hidden states), ...] of the fitting text, computed once, in batches of examples of
    about one length (sorted by characters: each batch is padded to about its own length, not the text's longest)."""
    examples = sorted(examples, key=lambda e: len(e) if isinstance(e, str) else sum(map(len, e)))
    out = []
    with torch.no_grad():
        for start in range(0, len(examples), batch_size):
            enc = encode(tokenizer, examples[start : start + batch_size], constants.max_length, pairs=constants.pairs)
            inputs = {k: v.to(device) for k, v in model_inputs(model, enc).items()}
            targets = model(**inputs, output_hidden_states=True).hidden_states
            out.append((inputs, targets))
    return out


@torch.no_grad()
def _objective(papa, batches, first: int = 1, skip=((), None)) -> float:
    """The relative hidden-state error over the fitting text, averaged over the hidden states from index ``first``
    on (1: every layer's; a layer's choice reaches its own, ``layer + 1``, and every later one).

    ``skip``: ``(blocks, returned)``, blocks not run, each returning ``returned[b]`` on batch ``b`` (what the last of
    them returns there): only the hidden states from index ``len(blocks)`` on are then the model's."""
    blocks, returned = skip
    total, count = 0.0, 0
    for b, (inputs, targets) in enumerate(batches):
        with skipped(blocks, returned[b] if blocks else None):
            outputs = papa(**inputs, output_hidden_states=True).hidden_states
        # hidden_error skips index 0 of what it is given: hand it the states from first - 1 on
        loss = hidden_error(outputs[first - 1 :], targets[first - 1 :], inputs["attention_mask"], "layers")
        count += len(targets[0])
        total += float(loss) * len(targets[0])
    return total / count


@torch.no_grad()
def _returned_by(papa, blocks, batches, k: int, known) -> list | None:
    """What block ``k`` returns on each batch with the exponents in force (None for k < 0: nothing to skip).
    ``known``: ``(j, returned)`` for a block j <= k already run with them, or None."""
    if k < 0:
        return None
    if known is not None and known[0] == k:
        return known[1]
    j, below = known if known is not None else (-1, None)
    return returned_by(papa, blocks, [inputs for inputs, _ in batches], k, j, below)
