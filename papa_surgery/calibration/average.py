"""Calibration (paper 3.1): C[l, h, i, j] = sum A * (m_i m_j) / sum (m_i m_j) over a corpus, in slots.

Batches are dynamically padded (never padded to L). A forward hook on each self-attention module
takes that layer's attention probabilities A (B, H, N, N) and adds them into the (slot_i, slot_j)
cells of running fp64 sums, together with A**2 for the per-head input-dependence score. Memory is
O(layers * heads * L^2), independent of the corpus size.

Determinism: the sums are race-free on CPU and CUDA (see ``accumulate.py``). Under ``torch.distributed``
(``accelerate launch``, ``torchrun``) the corpus is cut into the same batches as in one process and process
r runs batches r, r + world_size, ...; after each round of forwards the processes exchange the real
attention entries of their batches and every process adds all of them in batch order, exactly as one
process would. So the constants (means, counts, variance) are bitwise those of a single-process run with
the same batch size (and the same kernels: same device type and thread count), whatever the process count;
only the forward passes are split, the fp64 additions are not.
"""

from __future__ import annotations

import torch

from ..distributed import exchange, shared_failures
from ..hub_code.modeling_papa import attention_modules
from ..hub_code.slots import compute_slots
from ..models.families import get_family, num_heads_layers
from .accumulate import BatchCells, SlotAccumulator, SlotLayout
from .constants import Constants
from .corpus import load_corpus
from .coverage import warn_coverage
from .encoding import encode, model_inputs
from .passes import borrow, pass_metadata, process_batches


@torch.no_grad()
def calibrate(
    model,
    tokenizer,
    corpus,
    max_length: int = 128,
    pairs: bool = False,
    batch_size: int = 32,
    device: str | torch.device | None = None,
    progress: bool = True,
    max_examples: int | None = None,
    source_name: str | None = None,
    fill: bool = True,
    storage: str = "dense",
    compact_band: int | None = None,
    compact_rank: int | None = None,
    variance: bool = True,
):
    """Average every head's attention over an unlabelled corpus, in the slot layout.

    Args:
        model: a source model of a supported family (its weights are not changed; it runs with eager
            attention in eval mode and any dtype, with fp64 accumulation, then gets back its attention
            implementation, train/eval mode and device).
        tokenizer: its tokenizer.
        corpus: anything :func:`papa_surgery.calibration.corpus.load_corpus` accepts.
        max_length: L, the slot count (``--max-length``).
        pairs: examples are sentence pairs (middle separator at slot L/2).
        batch_size: examples per forward pass (under torch.distributed each process runs whole batches of it).
        device: where to run; defaults to the model's device.
        progress: show a progress bar.
        max_examples: use at most this many examples of the corpus.
        source_name: the source's Hub id or path, recorded in the provenance.
        fill: fill the cells no example reached from each head's measured profile (``Constants.fill``);
            ``False`` keeps the raw averages (zeros there).
        storage, compact_band, compact_rank: how the constants will be stored (``convert``'s options). With
            ``compact``, and with ``auto`` above L = ``registry.DENSE_CALIBRATION_UP_TO`` (512), attention streams
            straight into the compact structure (:mod:`.into_structure`: no (L, L) sums per head) and the result is
            :class:`~papa_surgery.calibration.structured_constants.StructuredConstants`. ``dense`` (the default
            here) keeps the dense sums whatever L.
        variance: structured calibration only: run the pass that measures the per-head variance.

    Returns:
        ``Constants`` (``StructuredConstants``: see ``storage``) of kind ``average`` with per-cell counts and
        per-head variance. When the corpus reaches fewer than ``max_length`` slots a ``CoverageWarning`` says so,
        once, with the fix.
    """
    corpus = load_corpus(corpus, pairs=pairs, max_examples=max_examples)
    layout = structured_layout(storage, max_length, pairs, compact_band, compact_rank)
    if layout is not None:
        from .into_structure import calibrate_structured

        constants = calibrate_structured(
            model, tokenizer, corpus, layout, pairs, batch_size, device, progress, source_name, fill, variance
        )
        warn_coverage(constants, stacklevel=4)
        return constants
    family = get_family(model)
    num_heads, num_layers = num_heads_layers(model.config)
    device, restore = borrow(model, device)
    previous_impl = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the probabilities must be materialised

    acc = SlotAccumulator(num_layers, num_heads, max_length, device)
    bar, world = process_batches(corpus, batch_size, "calibrate", progress)
    sink = _Sink(acc, world > 1)
    handles = [
        m.register_forward_hook(lambda _m, _in, out, layer=layer: sink.add(layer, out[1]))
        for layer, m in enumerate(attention_modules(model))
    ]

    tokens = [0]

    def forward(batch):
        enc = encode(tokenizer, batch, max_length, pairs=pairs).to(device)
        slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)
        sink.start_batch(SlotLayout(slots, max_length))
        model(**model_inputs(model, enc), output_attentions=family.needs_output_attentions)
        tokens[0] += int((slots >= 0).sum())
        bar.set_postfix(tokens=tokens[0], refresh=False)  # batches of long examples are worth more

    try:
        if world == 1:
            for batch in bar:
                forward(batch)
        else:
            _ordered_rounds(bar, forward, sink, device)
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous_impl)
        restore()
    if acc.examples == 0:
        raise ValueError(f"the corpus {corpus.description} gave no examples to calibrate on")
    values, counts, variance = acc.result()
    metadata = pass_metadata(model, corpus, acc.examples, batch_size, world, source_name)
    constants = Constants(values, "average", max_length, pairs, counts, variance, metadata)
    warn_coverage(constants, stacklevel=4)  # past this function and torch.no_grad's wrapper
    return constants.fill() if fill else constants


def structured_layout(storage: str, max_length: int, pairs: bool, band=None, rank=None):
    """The compact layout calibration streams into for ``storage``, or ``None`` for dense sums (see ``calibrate``).

    The layout is the one ``convert`` stores (``compaction.layout_for``), residual included: its rank-r factors come
    from a second pass over the corpus (``sketch.py``)."""
    from .. import registry
    from .compaction import layout_for

    if storage == "auto" and max_length <= registry.DENSE_CALIBRATION_UP_TO:
        return None
    return layout_for(storage, max_length, pairs, band, rank)


def structure_of(kind: str, storage: str, max_length: int, pairs: bool, band, rank) -> tuple[int, int] | None:
    """(band, rank) constants of ``kind`` are calibrated into (only the ``average`` streams into one), else ``None``."""
    layout = structured_layout(storage, max_length, pairs, band, rank) if kind == "average" else None
    return None if layout is None else (layout.band, layout.rank)


class _Sink:
    """Where the hooks' attention goes: straight into the sums (one process), or kept for the exchange."""

    def __init__(self, acc: SlotAccumulator, keep: bool):
        self.acc, self.keep = acc, keep
        self.cells: BatchCells | None = None
        self.slots: torch.Tensor | None = None
        self.parts: list[tuple[int, torch.Tensor]] = []

    def start_batch(self, layout: SlotLayout) -> None:
        if self.keep:
            self.slots, self.cells, self.parts = layout.slots, BatchCells(layout), []
        else:
            self.acc.start_batch(layout)

    def add(self, layer: int, matrices: torch.Tensor) -> None:  # matrices: (B, H, N, N)
        if self.keep:  # the real entries, in the model's dtype (the fp64 cast happens when they are added)
            self.parts.append((layer, self.cells.gather(matrices, dtype=matrices.dtype).cpu()))  # (H, cells)
        else:
            self.acc.add(layer, matrices)


def _ordered_rounds(batches, forward, sink: _Sink, device) -> None:
    """Each process runs its next batch; all exchange the real entries and add every batch in global order.

    The additions are the very ``start_batch``/``add_gathered`` calls one process makes, in the same order
    (``add_gathered`` of the gathered entries equals ``add`` of the matrices on CPU and CUDA), so the sums
    are bitwise a single process's.
    """
    mine = iter(batches)
    with shared_failures():
        while True:
            batch = next(mine, None)
            payload = None
            if batch is not None:
                forward(batch)
                payload = (sink.slots.cpu(), sink.parts)
            received = exchange(payload)
            if all(p is None for p in received):
                break
            for item in received:  # rank order = batch order within the round
                if item is None:
                    continue
                slots, parts = item
                sink.acc.start_batch(SlotLayout(slots.to(device), sink.acc.max_length))
                for layer, part in parts:
                    sink.acc.add_gathered(layer, part.to(device, torch.float64))
