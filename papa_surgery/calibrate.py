"""Calibration (paper 3.1): C[l, h, i, j] = sum A * (m_i m_j) / sum (m_i m_j) over a corpus, in slots.

Batches are dynamically padded (never padded to L). A forward hook on each self-attention module
takes that layer's attention probabilities A (B, H, N, N) and adds them into the (slot_i, slot_j)
cells of running fp64 sums, together with A**2 for the per-head input-dependence score. Memory is
O(layers * heads * L^2), independent of the corpus size.

Determinism: examples that share a slot layout are summed first with a one-hot matrix product, then
each layout's cells (distinct within a layout) are scattered into the sums. Under ``torch.distributed``
(``accelerate launch``, ``torchrun``) each process takes every world_size-th example and the sums are
all-reduced at the end, so every process returns the same constants.
"""

from __future__ import annotations

import datetime as _dt
from collections.abc import Iterator

import torch
from tqdm.auto import tqdm

from . import __version__
from .architectures import get_family, num_heads_layers
from .constants import Constants
from .corpus import Corpus, load_corpus
from .encoding import encode, model_inputs
from .hub_code.modeling_papa import attention_modules
from .hub_code.slots import SlotLayout, compute_slots

# Families whose self-attention returns its probabilities only when asked to.
_NEEDS_OUTPUT_ATTENTIONS = ("mpnet", "deberta", "deberta-v2")


class _Accumulator:
    """Running sums of A and A**2 per (layer, head, cell), and example counts per cell."""

    def __init__(self, num_layers: int, num_heads: int, max_length: int, device: torch.device):
        cells = max_length * max_length
        self.max_length = max_length
        self.sums = torch.zeros(num_layers, num_heads, cells, dtype=torch.float64, device=device)
        self.squares = torch.zeros_like(self.sums)
        self.counts = torch.zeros(cells, dtype=torch.float64, device=device)
        self.examples = 0
        self._batch = None

    def start_batch(self, layout: SlotLayout) -> None:
        """Precompute, for one batch, the one-hot layout matrix and each layout's real cells."""
        u = layout.unique.shape[0]
        b = layout.inverse.shape[0]
        onehot = torch.zeros(u, b, dtype=torch.float64, device=layout.inverse.device)
        onehot[layout.inverse, torch.arange(b, device=onehot.device)] = 1.0  # (U, B)
        masks = layout.cell_mask.reshape(u, -1)  # (U, N*N)
        cells = [layout.cell_index[i].reshape(-1)[masks[i]] for i in range(u)]  # each (cells_u,)
        per_layout = onehot.sum(1)  # (U,) examples per layout
        for i in range(u):
            self.counts.index_add_(0, cells[i], per_layout[i].expand(cells[i].shape[0]))
        self.examples += b
        self._batch = (onehot, masks, cells)

    def add(self, layer: int, probs: torch.Tensor) -> None:
        """Add one layer's attention probabilities (B, H, N, N) of the current batch."""
        onehot, masks, cells = self._batch
        b, h = probs.shape[:2]
        a = probs.detach().to(torch.float64).reshape(b, -1)  # (B, H*N*N)
        for target, values in ((self.sums[layer], a), (self.squares[layer], a * a)):
            grouped = (onehot @ values).view(onehot.shape[0], h, -1)  # (U, H, N*N) summed per layout
            parts = [grouped[i][:, masks[i]] for i in range(len(cells))]  # each (H, cells_u)
            if target.device.type == "cpu":  # sequential on CPU: one deterministic scatter
                target.index_add_(1, torch.cat(cells), torch.cat(parts, dim=1))
            else:  # cells are distinct within a layout, so each scatter is free of races
                for idx, part in zip(cells, parts, strict=True):
                    target.index_add_(1, idx, part)

    def reduce(self) -> None:
        """Sum across processes under torch.distributed."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            for t in (self.sums, self.squares, self.counts):
                torch.distributed.all_reduce(t)
            n = torch.tensor([float(self.examples)], dtype=torch.float64, device=self.counts.device)
            torch.distributed.all_reduce(n)
            self.examples = int(n.item())

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(constants (layers, heads, L, L) float32, counts (L, L) float64, variance (layers, heads))."""
        length = self.max_length
        safe = self.counts.clamp_min(1.0)
        mean = torch.where(self.counts > 0, self.sums / safe, torch.zeros_like(self.sums))
        # Sum over real entries of (A - C)^2 = sum A^2 - (sum A)^2 / n, per head.
        sq_dev = (self.squares - self.sums * mean).sum(-1)
        variance = (sq_dev / self.counts.sum().clamp_min(1.0)).clamp_min(0.0)
        layers, heads = mean.shape[:2]
        return (
            mean.view(layers, heads, length, length).float().cpu(),
            self.counts.view(length, length).cpu(),
            variance.cpu(),
        )


def _shard(corpus: Corpus, rank: int, world: int) -> Iterator:
    for i, example in enumerate(corpus):
        if i % world == rank:
            yield example


def _batches(examples: Iterator, batch_size: int) -> Iterator[list]:
    batch = []
    for ex in examples:
        batch.append(ex)
        if len(batch) == batch_size:
            yield batch
            batch = []
    if batch:
        yield batch


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
) -> Constants:
    """Average every head's attention over an unlabelled corpus, in the slot layout.

    Args:
        model: a source model of a supported family (its weights are not changed; it runs with eager
            attention in eval mode and any dtype, with fp64 accumulation).
        tokenizer: its tokenizer.
        corpus: anything :func:`papa_surgery.corpus.load_corpus` accepts.
        max_length: L, the slot count (``--max-length``).
        pairs: examples are sentence pairs (middle separator at slot L/2).
        batch_size: examples per forward pass (per process).
        device: where to run; defaults to the model's device.
        progress: show a progress bar.
        max_examples: use at most this many examples of the corpus.
        source_name: the source's Hub id or path, recorded in the provenance.

    Returns:
        ``Constants`` of kind ``average`` with per-cell counts and per-head variance.
    """
    corpus = load_corpus(corpus, pairs=pairs, max_examples=max_examples)
    family = get_family(model)
    num_heads, num_layers = num_heads_layers(model.config)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    model.to(device).eval()
    previous_impl = model.config._attn_implementation
    model.set_attn_implementation("eager")  # the probabilities must be materialised

    distributed = torch.distributed.is_available() and torch.distributed.is_initialized()
    rank = torch.distributed.get_rank() if distributed else 0
    world = torch.distributed.get_world_size() if distributed else 1
    acc = _Accumulator(num_layers, num_heads, max_length, device)
    modules = attention_modules(model)
    handles = [
        m.register_forward_hook(lambda _m, _in, out, layer=layer: acc.add(layer, out[1]))
        for layer, m in enumerate(modules)
    ]
    try:
        total = None
        try:
            total = -(-len(corpus) // (batch_size * world))
        except TypeError:
            pass
        bar = tqdm(
            _batches(_shard(corpus, rank, world), batch_size),
            total=total,
            desc="calibrate",
            unit="batch",
            disable=not progress or rank != 0,
        )
        for batch in bar:
            enc = encode(tokenizer, batch, max_length, pairs=pairs).to(device)
            slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)
            acc.start_batch(SlotLayout(slots, max_length))
            model(**model_inputs(model, enc), output_attentions=family.model_type in _NEEDS_OUTPUT_ATTENTIONS)
        acc.reduce()
    finally:
        for h in handles:
            h.remove()
        model.set_attn_implementation(previous_impl)
    if acc.examples == 0:
        raise ValueError(f"the corpus {corpus.description} gave no examples to calibrate on")
    values, counts, variance = acc.result()
    source = source_name or getattr(model.config, "_name_or_path", None) or model.config.model_type
    metadata = {
        "source_model": source,
        "model_type": model.config.model_type,
        "corpus": corpus.description,
        "examples": acc.examples,
        "batch_size": batch_size,
        "processes": world,
        "model_dtype": str(next(model.parameters()).dtype).replace("torch.", ""),
        "papa_surgery_version": __version__,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    return Constants(values, "average", max_length, pairs, counts, variance, metadata)
