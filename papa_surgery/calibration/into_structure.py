"""Calibration straight into the compact structure (``calibrate`` picks it when the layout is compact).

Passes over the corpus, none holding an (L, L) tensor per head:

1. the tokenizer only: the corpus's slot layouts, hence every cell's count (``layouts.py``);
2. the model: each layer's attention, by blocks of query rows (``capture.py``), streamed into band / special rows and
   columns / per-offset sums and squares, and the residual's range sketch (``structured.py``), finished into compact
   parts (``structured_result.py``);
3. with a residual (rank > 0) only, the model again: the residual's projection onto the sketched range, from which
   its rank-r factors follow (``sketch.py``), and again for the per-head variance.

The variance is the exact mean squared deviation of A from the constants the checkpoint computes with (the compact
parts, used as stored), over every real entry. Without a residual every stored value is a mean of the cells it
stands for (a band or special cell's own, a far offset's), so the first pass's sums and squares give it
(:func:`~.structured_result.variance_from_sums`); a residual's cells u_i v_j are known only after the second pass,
so a third pass measures it. The dense path's variance is the deviation from the per-cell means; the two differ by the
count-weighted compaction error (equal when the structure represents the means exactly, which the tests check).
Per-cell means of far cells are never held, so the dense definition has no exact streaming form; ``variance=False``
skips it.

Under torch.distributed each process runs its own batches and the sums are all-reduced; the residual's range basis
is the first process's, broadcast, so every process projects onto the same one. The result equals one process's up
to the order of fp64 additions (not bitwise, unlike the dense path; the residual as the product u v^T, whose
factors' signs the SVD chooses).
"""

from __future__ import annotations

import contextlib

import torch

from ..distributed import broadcast_from_main
from ..hub_code.compact_constants import CompactLayout
from ..hub_code.modeling_papa import attention_modules
from ..hub_code.slots import compute_slots
from ..hub_code.structured_constants import StructuredSlots
from ..models.families import get_family, num_heads_layers
from .capture import capturing
from .compaction import drop_cancelling_residuals
from .encoding import encode, model_inputs
from .layouts import scan_layouts
from .passes import borrow, pass_metadata, process_batches
from .structured import BlockSink, ResidualProjection, StructuredAccumulator, batch_examples
from .structured_constants import StructuredConstants
from .structured_result import residual_factors, residual_ranges, structured_parts, variance_from_sums


def _run(model, tokenizer, corpus, layout, pairs, batch_size, device, progress, desc, sink: BlockSink, tokens=None):
    """One pass of the model over ``corpus`` into ``sink`` (``sink.start_batch(slots)`` per batch, then each layer's
    attention): by blocks through ``papa_capture`` for the families of transformers' attention interface, else as
    eager (B, H, N, N) matrices through forward hooks. ``tokens``: the real tokens of each batch, for the bar."""
    family = get_family(model)
    bar, world = process_batches(corpus, batch_size, desc, progress, tokens)
    if family.style == "interface":
        context, wants = capturing(model, sink), False
    else:
        context, wants = _hooked(model, sink), family.needs_output_attentions
    with context:
        for batch in bar:
            enc = encode(tokenizer, batch, layout.max_length, pairs=pairs).to(device)
            sink.start_batch(
                compute_slots(enc["input_ids"], enc["attention_mask"], layout.max_length, tokenizer.sep_token_id)
            )
            model(**model_inputs(model, enc), output_attentions=wants)
    return world


@contextlib.contextmanager
def _hooked(model, sink: BlockSink):
    """Eager attention, each layer's probabilities handed to ``sink.add`` by a forward hook."""
    previous_impl = model.config._attn_implementation
    model.set_attn_implementation("eager")
    handles = [
        m.register_forward_hook(lambda _m, _in, out, layer=layer: sink.add(layer, out[1]))
        for layer, m in enumerate(attention_modules(model))
    ]
    try:
        yield
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous_impl)


@torch.no_grad()
def calibrate_structured(model, tokenizer, corpus, layout: CompactLayout, pairs: bool = False, batch_size: int = 32,
                         device=None, progress: bool = True, source_name=None, fill: bool = True,
                         variance: bool = True, sketch=None, seed: int = 0) -> StructuredConstants:  # fmt: skip
    """:func:`papa_surgery.calibration.calibrate` into ``layout`` (module docstring); ``corpus`` is a ``Corpus``.

    ``sketch``: :class:`~papa_surgery.calibration.structured.SketchSizes` (default ``for_rank``); ``seed`` seeds
    its test matrix.
    """
    num_heads, num_layers = num_heads_layers(model.config)
    layouts = scan_layouts(corpus, tokenizer, layout.max_length, pairs, batch_size, progress)
    if layouts.examples == 0:
        raise ValueError(f"the corpus {corpus.description} gave no examples to calibrate on")
    device, restore = borrow(model, device)
    try:
        acc = StructuredAccumulator(num_layers, num_heads, layout, layouts, sketch, device, seed)
        run = dict(tokens=layouts.batch_tokens)
        world = _run(model, tokenizer, corpus, layout, pairs, batch_size, device, progress, "calibrate", acc, **run)
        acc.reduce()
        parts = structured_parts(acc, fill)
        if layout.rank:
            # One basis on every process: QRs of the same all-reduced sketch need not agree to the last bit, and where
            # the sketch is rank-deficient the trailing columns are rounding noise; projections onto one basis add up.
            q = broadcast_from_main(residual_ranges(acc, parts, fill))
            projection = ResidualProjection(acc, q)
            _run(model, tokenizer, corpus, layout, pairs, batch_size, device, progress, "residual", projection, **run)
            u, v = residual_factors(acc, parts, q, projection.reduce(), fill)
            parts |= {"papa_constants_u": u, "papa_constants_v": v}
            drop_cancelling_residuals(parts, layout)  # before the variance pass: it measures what is stored
        parts = {name: t.float() for name, t in parts.items()}
        deviation = None
        if variance and not layout.rank:  # every cell's constant is a mean the sums already hold: no pass
            deviation = variance_from_sums(acc, parts)
        elif variance:
            pass_ = _Deviation(acc, parts)
            _run(model, tokenizer, corpus, layout, pairs, batch_size, device, progress, "variance", pass_, **run)
            deviation = pass_.result()
    finally:
        restore()
    metadata = pass_metadata(model, corpus, acc.examples, batch_size, world, source_name)
    metadata["calibrated_into"] = {"band": layout.band, "rank": layout.rank, "range_sketch": acc.sizes.k}
    if fill:
        from .coverage import FILL_METHOD

        metadata["filled"] = FILL_METHOD
    filled = layout.max_length**2 - int(acc.cells.round())
    return StructuredConstants(
        parts, layout, "average", pairs, acc.coverage.cpu(), filled, deviation, metadata,
    )  # fmt: skip


class _Deviation(BlockSink):
    """Sum over real entries of (A - C~)^2 per head, C~ the compact constants read at each example's cells (the
    residual's layouts: with no residual, :func:`variance_from_sums` needs no pass)."""

    full_rows = True  # the cells outside a local layer's window count too (A = 0 there, C~ need not be)

    def __init__(self, acc: StructuredAccumulator, parts: dict):
        self.acc, self.chunk = acc, acc.chunk
        self.parts = {name: t.to(acc.device, torch.float64) for name, t in parts.items()}  # the stored values
        layers, heads = parts["papa_constants_profile"].shape[:2]
        self.squares = torch.zeros(layers, heads, dtype=torch.float64, device=acc.device)
        self.entries = torch.zeros((), dtype=torch.float64, device=acc.device)

    def start_batch(self, slots: torch.Tensor) -> None:
        self.batch = batch_examples(slots, self.acc.special_index)
        self.entries += sum(ex.n**2 for ex in self.batch)

    def add_block(self, layer: int, e: int, a0: int, a1: int, b0: int, b1: int, p: torch.Tensor) -> None:
        ex = self.batch[e]
        parts = {name: t[layer] for name, t in self.parts.items()}
        # The constants at this example's cells, read from the parts as the checkpoint's runtime reads them.
        constants = StructuredSlots(parts, self.acc.layout, ex.slots, None, torch.float64)
        every = torch.arange(ex.n, device=ex.slots.device)
        c = constants.cells(every[a0:a1], every[b0:b1])  # (H, c, m)
        self.squares[layer] += ((p.detach().to(self.acc.device, torch.float64) - c) ** 2).sum((1, 2))

    def result(self) -> torch.Tensor:
        """(layers, heads) the mean squared deviation."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self.squares)
            torch.distributed.all_reduce(self.entries)
        return (self.squares / self.entries.clamp_min(1.0)).cpu()
