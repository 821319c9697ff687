"""Streaming attention straight into the compact structure: never an (L, L) accumulator per head.

For every (layer, head) the accumulator keeps fp64 sums in the compact layout (``hub_code/compact_constants.py``):

- ``band`` (L, 2w+1), ``rows`` (S, L), ``cols`` (L, S): raw sums of A over the cells stored exactly;
- ``body`` (2L-1): raw sums of A over body cells (no special slot) per offset j - i: the coverage fill's profile;
- ``far`` (2L-1): sums of A / counts over "far" cells (off the band, no special slot) per offset: the sum of the
  per-cell means, so the stored profile (the plain mean of far cells per offset) needs no per-cell state;
- ``y`` (L, k) = M Omega: the range sketch of the far-cell means M = far * (sum A / counts), the first of the
  residual's two passes (``sketch.py``); :class:`ResidualProjection` streams the second, B = Q^T M.

The per-cell counts come from the corpus's layouts before any forward (``layouts.py``), which is what lets an
example add ``A / counts`` directly. Counts shared by all heads (band, rows, columns, per-offset totals, coverage)
are accumulated once per example. Memory per head is O(L * (2w+1 + 2S + k)); work per example is O(n^2 k) per head,
in row chunks of ``chunk`` tokens so no (n, n) fp64 tensor exists either.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hub_code.compact_constants import CompactLayout
from .layouts import CorpusLayouts

PLAN_CELLS = 2**24  # a batch's chunk plans (about 30 bytes a cell) are kept for all layers up to this many cells


@dataclass(frozen=True)
class SketchSizes:
    """Columns k of the residual's range sketch Y = M Omega (Halko et al. 2011: k = r + p with a small
    oversampling p; 2r + 1 here, ample for attention's fast-decaying spectra)."""

    k: int

    @classmethod
    def for_rank(cls, rank: int, max_length: int) -> SketchSizes:
        return cls(min(2 * rank + 1, max_length))


def real_rows(matrices: torch.Tensor, idx: torch.Tensor, a0: int, a1: int) -> torch.Tensor:
    """(H, c, n) one example's attention (H, N, N) between its real tokens ``idx`` (n,), query rows a0..a1 of them.

    The real tokens of a padded example are one contiguous run (either padding side), so this is a view, not a copy.
    """
    lo, n = int(idx[0]), len(idx)
    return matrices.detach()[:, lo + a0 : lo + a1, lo : lo + n]


def batch_examples(slots: torch.Tensor, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(real token positions (n,), their slots (n,)) of each example of a batch's slots (B, N) (-1 for padding)."""
    out = []
    for row in slots.to(device):
        idx = (row >= 0).nonzero().squeeze(-1)
        out.append((idx, row[idx]))
    return out


def _ones(like: torch.Tensor) -> torch.Tensor:
    return torch.ones(like.shape, dtype=torch.float64, device=like.device)


class _Plan:
    """Where one row chunk of one example's (c, n) attention lands: shared by every layer and head."""

    def __init__(self, acc: StructuredAccumulator, slots: torch.Tensor, a0: int, a1: int):
        length, w = acc.max_length, acc.layout.band
        self.rows = slots[a0:a1]  # (c,) slots of the chunk's queries
        d = slots[None, :] - self.rows[:, None]  # (c, n) offset j - i
        special_i, special_j = acc.special[self.rows], acc.special[slots]  # (c,), (n,)
        body = ~special_i[:, None] & ~special_j[None, :]  # (c, n)
        band = d.abs() <= w
        self.band = band
        self.band_index = (self.rows[:, None] * (2 * w + 1) + d + w)[band]  # (cells,) into (L * (2w+1))
        self.offset = d + length - 1  # (c, n) index into (2L-1)
        self.body = body
        self.far = body & ~band
        counts = acc.layouts.counts_at(self.rows, slots).to(acc.device)  # (c, n): every cell is reached (> 0)
        self.inverse_far = torch.where(self.far, 1.0 / counts, 0.0)  # (c, n) float64
        self.inverse = 1.0 / counts


class BatchChunks:
    """A batch's examples and the plans of their row chunks. The plans serve every layer: kept once made while the
    batch's cells fit ``PLAN_CELLS``, else made again at each pass over the chunks."""

    def __init__(self, acc: StructuredAccumulator, slots: torch.Tensor):
        self.acc = acc
        self.examples = batch_examples(slots, acc.device)  # (real positions (n,), slots (n,)) per example
        self._keep = sum(len(s) ** 2 for _, s in self.examples) <= PLAN_CELLS
        self._plans: dict[tuple[int, int], _Plan] = {}

    def __iter__(self):
        """(example e, real positions (n,), slots (n,), first row a0, end row a1, plan) of every row chunk."""
        for e, (idx, s) in enumerate(self.examples):
            for a0, a1 in self.acc._chunks(len(s)):
                plan = self._plans.get((e, a0))
                if plan is None:
                    plan = _Plan(self.acc, s, a0, a1)
                    if self._keep:
                        self._plans[e, a0] = plan
                yield e, idx, s, a0, a1, plan


class StructuredAccumulator:
    """Running structured sums of (B, H, N, N) attention for every layer and head (module docstring).

    Args:
        num_layers, num_heads: the model's shape.
        layout: the compact layout (L, band w, rank r, special slots).
        layouts: the corpus's slot layouts (per-cell counts).
        sketch: sketch sizes (default: ``SketchSizes.for_rank``).
        device: where the sums live.
        seed: seeds the range sketch's Gaussian test matrix (shared by every head).
        chunk: query tokens per row chunk.
    """

    def __init__(self, num_layers, num_heads, layout: CompactLayout, layouts: CorpusLayouts, sketch=None,
                 device="cpu", seed: int = 0, chunk: int = 256):  # fmt: skip
        length, w, s = layout.max_length, layout.band, len(layout.special)
        self.layout, self.layouts, self.max_length, self.chunk = layout, layouts, length, chunk
        self.sizes = sketch or SketchSizes.for_rank(layout.rank, length)
        if self.sizes.k < layout.rank:
            raise ValueError(
                f"the residual's range sketch needs at least rank {layout.rank} columns; got {self.sizes.k}. Pass "
                f"SketchSizes(k) with k >= {layout.rank}, or sketch=None for the default (2 * rank + 1)"
            )
        self.device = torch.device(device)
        shape = (num_layers, num_heads)
        f64 = dict(dtype=torch.float64, device=self.device)
        self.band = torch.zeros(*shape, length, 2 * w + 1, **f64)  # raw sums
        self.rows = torch.zeros(*shape, s, length, **f64)
        self.cols = torch.zeros(*shape, length, s, **f64)
        self.body = torch.zeros(*shape, 2 * length - 1, **f64)
        self.far = torch.zeros(*shape, 2 * length - 1, **f64)  # sums of A / counts
        self.y = torch.zeros(*shape, length, self.sizes.k, **f64)  # M Omega
        # counts, shared by every head
        self.band_counts = torch.zeros(length, 2 * w + 1, **f64)
        self.rows_counts = torch.zeros(s, length, **f64)
        self.cols_counts = torch.zeros(length, s, **f64)
        self.body_counts = torch.zeros(2 * length - 1, **f64)
        self.far_cells = torch.zeros(2 * length - 1, **f64)  # sum of 1 / counts: covered far cells per offset
        self.cells = torch.zeros((), **f64)  # covered cells in all (sum of 1 / counts)
        self.coverage = torch.zeros(length, **f64)
        self.examples = 0
        g = torch.Generator().manual_seed(seed)
        self.omega = torch.randn(length, self.sizes.k, generator=g, dtype=torch.float64).to(self.device)  # (L, k)
        self.special = torch.zeros(length, dtype=torch.bool, device=self.device)
        self.special[list(layout.special)] = True
        self.special_index = torch.full((length,), -1, dtype=torch.long, device=self.device)
        self.special_index[list(layout.special)] = torch.arange(s, device=self.device)
        self._batch: BatchChunks | None = None

    def _chunks(self, n: int):
        return [(a, min(a + self.chunk, n)) for a in range(0, n, self.chunk)]

    def start_batch(self, slots: torch.Tensor) -> None:
        """Take the batch's slots (B, N) (-1 for padding) and count its cells."""
        self._batch = BatchChunks(self, slots)
        for _, s in self._batch.examples:
            self.examples += 1
            self.coverage.index_add_(0, s, torch.ones_like(s, dtype=torch.float64))
        for _, _, s, _, _, plan in self._batch:
            self.band_counts.view(-1).index_add_(0, plan.band_index, _ones(plan.band_index))
            self.body_counts.index_add_(0, plan.offset[plan.body], _ones(plan.offset[plan.body]))
            self.far_cells.index_add_(0, plan.offset[plan.far], plan.inverse_far[plan.far])
            self.cells += plan.inverse.sum()
            for _, slot in self._special_queries(plan.rows):
                self.rows_counts[self.special_index[slot]].index_add_(0, s, _ones(s))
            for _, slot in self._special_queries(s):
                self.cols_counts[:, self.special_index[slot]].index_add_(0, plan.rows, _ones(plan.rows))

    def _special_queries(self, slots: torch.Tensor) -> list[tuple[int, int]]:
        """(position in ``slots``, slot) of every special slot among ``slots``."""
        where = self.special[slots].nonzero().squeeze(-1).tolist()
        return [(p, int(slots[p])) for p in where]

    def add(self, layer: int, matrices: torch.Tensor) -> None:
        """Add one layer's (B, H, N, N) attention probabilities of the current batch."""
        for e, idx, s, a0, a1, plan in self._batch:
            a = real_rows(matrices[e], idx, a0, a1).to(self.device, torch.float64)  # (H, c, n)
            self._add_chunk(layer, a, s, plan)

    def _add_chunk(self, layer: int, a: torch.Tensor, s: torch.Tensor, plan: _Plan) -> None:
        h = a.shape[0]
        self.band[layer].view(h, -1).index_add_(1, plan.band_index, a[:, plan.band])
        self.body[layer].index_add_(1, plan.offset[plan.body], a[:, plan.body])
        for local, slot in self._special_queries(plan.rows):  # (H, n) the special query's row
            self.rows[layer][:, self.special_index[slot]].index_add_(1, s, a[:, local])
        for token, slot in self._special_queries(s):  # (H, c) the special key's column
            self.cols[layer][:, :, self.special_index[slot]].index_add_(1, plan.rows, a[:, :, token])
        m = a * plan.inverse_far  # (H, c, n) this example's share of the far cells' means
        self.far[layer].index_add_(1, plan.offset[plan.far], m[:, plan.far])
        if self.layout.rank:  # without a residual the range sketch is never read
            self.y[layer].index_add_(1, plan.rows, m @ self.omega[s])  # (H, c, k)

    def reduce(self) -> None:
        """Sum across processes under torch.distributed (every process saw its own examples)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        sums = (self.band, self.rows, self.cols, self.body, self.far, self.y)
        counts = (self.band_counts, self.rows_counts, self.cols_counts, self.body_counts, self.far_cells, self.cells)
        for t in (*sums, *counts, self.coverage):
            torch.distributed.all_reduce(t)
        n = torch.tensor([float(self.examples)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(n)
        self.examples = int(n.item())


class ResidualProjection:
    """The residual's second pass: B = Q^T M (H, k, L) per layer for fixed orthonormal bases Q (layers, H, L, k) of
    the first pass's range sketches (``sketch.py``), streamed like ``StructuredAccumulator.y``: O(n^2 k) per head and
    example, O(L k) memory per head."""

    def __init__(self, acc: StructuredAccumulator, q: torch.Tensor):
        self.acc, self.q = acc, q.to(acc.device, torch.float64)
        layers, heads, length, k = q.shape
        self.b = torch.zeros(layers, heads, k, length, dtype=torch.float64, device=acc.device)

    def start_batch(self, slots: torch.Tensor) -> None:
        """Take the batch's slots (B, N) (-1 for padding)."""
        self._batch = BatchChunks(self.acc, slots)

    def add(self, layer: int, matrices: torch.Tensor) -> None:
        """Add one layer's (B, H, N, N) attention probabilities of the current batch."""
        for e, idx, s, a0, a1, plan in self._batch:
            a = real_rows(matrices[e], idx, a0, a1).to(self.acc.device, torch.float64)  # (H, c, n)
            m = a * plan.inverse_far  # (H, c, n) this example's share of the far cells' means
            q = self.q[layer][:, plan.rows]  # (H, c, k)
            self.b[layer].index_add_(2, s, q.transpose(-1, -2) @ m)  # (H, k, n)

    def reduce(self) -> torch.Tensor:
        """(layers, H, k, L) B, summed across processes under torch.distributed."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self.b)
        return self.b
