"""Streaming attention straight into the compact structure: never an (L, L) accumulator per head.

For every (layer, head) the accumulator keeps fp64 sums in the compact layout (``hub_code/compact_constants.py``):

- ``band`` (L, 2w+1), ``rows`` (S, L), ``cols`` (L, S): raw sums of A over the cells stored exactly, and of A^2
  (``*_sq``, for the variance);
- ``body`` (2L-1): raw sums of A over body cells (no special slot) per offset j - i: the coverage fill's profile, and
  on far offsets the sums the variance reads; ``body_sq``: the sum of A^2 over every body cell;
- ``far`` (2L-1): sums of A / counts over "far" cells (off the band, no special slot) per offset: the sum of the
  per-cell means, so the stored profile (the plain mean of far cells per offset) needs no per-cell state;
- ``y`` (L, k) = M Omega: with a residual (rank > 0) only, the range sketch of the far-cell means M = far * (sum A /
  counts), the first of the residual's two passes (``sketch.py``); :class:`ResidualProjection` streams the second.

The per-cell counts come from the corpus's layouts before any forward (``layouts.py``), which is what lets an
example add ``A / counts`` directly. Attention arrives in blocks: rows a0..a1 of one example's real tokens against
its columns b0..b1 (the whole row, or the window of a local layer; ``capture.py``). Within a block, the cells of two
runs of consecutive body slots lie on diagonals of constant offset, so every per-offset sum is a sum along diagonals:
the block is written sheared into a buffer (row i moved right by R - 1 - i) and summed over rows, a few passes over
the block with no index per cell (:func:`diagonal_sums`). Counts shared by all heads (band, rows, columns, per-offset
totals, coverage) are accumulated once per example. Memory per head is O(L * (2w+1 + 2S + k)).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hub_code.compact_constants import CompactLayout
from .layouts import CorpusLayouts

WEIGHT_CACHE = 2**26  # bytes of a batch's per-block inverse counts kept for every layer (else made again per layer)


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


def diagonal_sums(block: torch.Tensor, buffer: torch.Tensor | None = None, weights=None) -> torch.Tensor:
    """(H, R + C - 1) the sums of ``block`` (H, R, C) (times ``weights`` (R, C), if given) along its diagonals:
    entry t sums its cells at j - i = t - R + 1.

    Row i is written R - 1 - i places to the right in a zeroed (H, R, R + C - 1) ``buffer`` (kept by the caller for
    blocks of one shape: the cells never written stay zero), whose columns then hold one diagonal each.
    """
    h, r, c = block.shape
    width = r + c - 1
    if buffer is None:
        buffer = block.new_zeros(h, r, width)
    sheared = buffer.as_strided((h, r, c), (r * width, width - 1, 1), buffer.storage_offset() + r - 1)
    if weights is None:
        sheared.copy_(block)
    else:
        torch.mul(block, weights, out=sheared)  # written where it goes: no (H, R, C) product in between
    return buffer.sum(1)


class Example:
    """One example's real tokens as the accumulator reads them.

    Attributes:
        lo, n: its first position in the padded batch and its number of real tokens.
        slots: (n,) the slot of every real token.
        runs: ``(p0, p1)`` position ranges of consecutive body slots (no special slot), in order.
        special: ``(position, index into the layout's special slots)`` of its special tokens.
    """

    def __init__(self, idx: torch.Tensor, slots: torch.Tensor, special_index: torch.Tensor):
        self.lo, self.n, self.slots = int(idx[0]), len(idx), slots
        which = special_index[slots].tolist()  # (n,) -1 for a body token
        self.special = [(p, s) for p, s in enumerate(which) if s >= 0]
        values, self.runs, start = slots.tolist(), [], None
        for p in range(self.n + 1):
            body = p < self.n and which[p] < 0
            if start is not None and (not body or values[p] != values[p - 1] + 1):
                self.runs.append((start, p))
                start = None
            if body and start is None:
                start = p

    def blocks(self, a0: int, a1: int, b0: int, b1: int):
        """``(r0, r1, c0, c1, offset)``: the parts of rows a0..a1 x columns b0..b1 that pair two body runs, with the
        offset j - i of their first cell (every cell's offset is that plus its column minus its row)."""
        for p0, p1 in self.runs:
            r0, r1 = max(p0, a0), min(p1, a1)
            if r0 >= r1:
                continue
            for q0, q1 in self.runs:
                c0, c1 = max(q0, b0), min(q1, b1)
                if c0 < c1:
                    yield r0, r1, c0, c1, int(self.slots[c0] - self.slots[r0])


def batch_examples(slots: torch.Tensor, special_index: torch.Tensor) -> list[Example]:
    """The :class:`Example` of each row of a batch's slots (B, N) (-1 for padding)."""
    out = []
    for row in slots.to(special_index.device):
        idx = (row >= 0).nonzero().squeeze(-1)
        out.append(Example(idx, row[idx], special_index))
    return out


class BlockSink:
    """What a pass over the corpus hands each layer's attention to, by blocks of query rows (``capture.py``), or as
    whole (B, H, N, N) matrices (forward hooks on eager attention), which :meth:`add` cuts into the same blocks.

    Subclasses set ``batch`` (the current batch's :class:`Example` list) in ``start_batch`` and define ``add_block``;
    ``full_rows`` asks the capture for every key of a row, also outside a local layer's window.
    """

    full_rows = False
    chunk = 256  # query rows per block
    batch: list[Example] = []

    def chunks(self, n: int) -> list[tuple[int, int]]:
        """The query row ranges ``(a0, a1)`` of an example of ``n`` real tokens."""
        return [(a, min(a + self.chunk, n)) for a in range(0, n, self.chunk)]

    def add(self, layer: int, matrices: torch.Tensor) -> None:
        """Add one layer's (B, H, N, N) attention probabilities of the current batch (whole rows)."""
        for e, ex in enumerate(self.batch):
            whole = matrices.detach()[e, :, ex.lo : ex.lo + ex.n, ex.lo : ex.lo + ex.n]  # (H, n, n)
            for a0, a1 in self.chunks(ex.n):
                self.add_block(layer, e, a0, a1, 0, ex.n, whole[:, a0:a1])

    def add_block(self, layer: int, e: int, a0: int, a1: int, b0: int, b1: int, p: torch.Tensor) -> None:
        """Add ``p`` (H, a1 - a0, b1 - b0): example ``e``'s attention from its real tokens a0..a1 to b0..b1 (the
        cells outside the columns are zero: a local layer's window)."""
        raise NotImplementedError  # pragma: no cover


class StructuredAccumulator(BlockSink):
    """Running structured sums of attention for every layer and head (module docstring).

    Args:
        num_layers, num_heads: the model's shape.
        layout: the compact layout (L, band w, rank r, special slots).
        layouts: the corpus's slot layouts (per-cell counts).
        sketch: sketch sizes (default: ``SketchSizes.for_rank``).
        device: where the sums live.
        seed: seeds the range sketch's Gaussian test matrix (shared by every head).
        chunk: query tokens per block.
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
        self.band_sq, self.rows_sq, self.cols_sq = (torch.zeros_like(t) for t in (self.band, self.rows, self.cols))
        self.body = torch.zeros(*shape, 2 * length - 1, **f64)
        self.body_sq = torch.zeros(*shape, **f64)
        self.far = torch.zeros(*shape, 2 * length - 1, **f64)  # sums of A / counts
        self.y = torch.zeros(*shape, length, self.sizes.k if layout.rank else 0, **f64)  # M Omega
        # counts, shared by every head
        self.band_counts = torch.zeros(length, 2 * w + 1, **f64)
        self.rows_counts = torch.zeros(s, length, **f64)
        self.cols_counts = torch.zeros(length, s, **f64)
        self.body_counts = torch.zeros(2 * length - 1, **f64)
        self.far_cells = torch.zeros(2 * length - 1, **f64)  # sum of 1 / counts: covered far cells per offset
        self.cells = torch.zeros((), **f64)  # covered cells in all (sum of 1 / counts)
        self.entries = torch.zeros((), **f64)  # real (example, cell) entries in all
        self.coverage = torch.zeros(length, **f64)
        self.examples = 0
        g = torch.Generator().manual_seed(seed)
        self.omega = torch.randn(length, self.sizes.k, generator=g, dtype=torch.float64).to(self.device)  # (L, k)
        self.special = torch.zeros(length, dtype=torch.bool, device=self.device)
        self.special[list(layout.special)] = True
        self.special_index = torch.full((length,), -1, dtype=torch.long, device=self.device)
        self.special_index[list(layout.special)] = torch.arange(s, device=self.device)
        self.batch = []
        self._weights: dict[tuple, torch.Tensor] = {}
        self._buffers: dict[tuple, torch.Tensor] = {}

    # -- per batch: the examples and their counts --------------------------------------------------------------------
    def start_batch(self, slots: torch.Tensor) -> None:
        """Take the batch's slots (B, N) (-1 for padding) and count its cells."""
        self.batch, self._weights = batch_examples(slots, self.special_index), {}
        w = self.layout.band
        for ex in self.batch:
            s, ones = ex.slots, torch.ones(ex.n, dtype=torch.float64, device=self.device)
            self.examples += 1
            self.entries += ex.n**2
            self.coverage.index_add_(0, s, ones)
            hit, _, flat = self._band_cells(s, s)
            self.band_counts.view(-1).index_add_(0, flat.reshape(-1), hit.reshape(-1).double())
            for _, index in ex.special:
                self.rows_counts[index].index_add_(0, s, ones)
                self.cols_counts[:, index].index_add_(0, s, ones)
            for a0, a1 in self.chunks(ex.n):  # row blocks: no (n, n) tensor for a long example
                self.cells += (1.0 / self.layouts.counts_at(s[a0:a1], s).to(self.device)).sum()
                for r0, r1, c0, c1, offset in ex.blocks(a0, a1, 0, ex.n):
                    rows, cols = r1 - r0, c1 - c0
                    start = offset - (rows - 1) + self.max_length - 1
                    diagonal = torch.arange(rows + cols - 1, device=self.device)
                    # cells on each diagonal of a rows x cols block
                    lengths = (diagonal + 1).clamp(max=min(rows, cols)).minimum(rows + cols - 1 - diagonal)
                    self.body_counts[start : start + len(diagonal)] += lengths.double()
                    inverse = self._inverse_counts(ex, r0, r1, c0, c1)  # (R, C)
                    far = self._far(diagonal_sums(inverse[None].double())[0], offset, rows, w)
                    self.far_cells[start : start + len(diagonal)] += far

    def _band_cells(self, rows: torch.Tensor, cols: torch.Tensor):
        """For every row slot and band offset k: whether ``cols`` (increasing slots) has slot row + k, its position
        there and the cell's flat index into (L * (2w+1)); each (c, 2w+1)."""
        w = self.layout.band
        k = torch.arange(-w, w + 1, device=rows.device)
        target = rows[:, None] + k[None, :]  # (c, 2w+1) the slots of the band's cells
        at = torch.searchsorted(cols, target).clamp(max=len(cols) - 1)
        hit = cols[at] == target
        return hit, at, rows[:, None] * (2 * w + 1) + k[None, :] + w

    def _inverse_counts(self, ex: Example, r0: int, r1: int, c0: int, c1: int) -> torch.Tensor:
        """(R, C) float32 1 / counts of a body block's cells (kept for the batch's other layers while they fit)."""
        key = (id(ex), r0, r1, c0, c1)
        inverse = self._weights.get(key)
        if inverse is None:
            counts = self.layouts.counts_at(ex.slots[r0:r1], ex.slots[c0:c1]).to(self.device)
            inverse = (1.0 / counts).float()
            if sum(t.numel() for t in self._weights.values()) * 4 + inverse.numel() * 4 <= WEIGHT_CACHE:
                self._weights[key] = inverse
        return inverse

    @staticmethod
    def _far(sums: torch.Tensor, offset: int, rows: int, w: int) -> torch.Tensor:
        """``sums`` (..., R + C - 1) of a block's diagonals with those inside the band (|j - i| <= w) zeroed."""
        d = offset - (rows - 1) + torch.arange(sums.shape[-1], device=sums.device)
        return sums.masked_fill(d.abs() <= w, 0.0)

    # -- per layer: the attention ------------------------------------------------------------------------------------
    def add_block(self, layer: int, e: int, a0: int, a1: int, b0: int, b1: int, p: torch.Tensor) -> None:
        ex, p = self.batch[e], p.detach().float()  # fp16/bf16 attention (forward hooks) is summed in fp32 at least
        rows, cols = ex.slots[a0:a1], ex.slots[b0:b1]
        hit, at, flat = self._band_cells(rows, cols)
        band = p.gather(2, at.expand(p.shape[0], -1, -1)).double() * hit  # (H, c, 2w+1)
        self.band[layer].view(p.shape[0], -1).index_add_(1, flat.reshape(-1), band.flatten(1))
        self.band_sq[layer].view(p.shape[0], -1).index_add_(1, flat.reshape(-1), band.square().flatten(1))
        for pos, index in ex.special:
            if a0 <= pos < a1:  # a special query's row
                row = p[:, pos - a0].double()  # (H, m)
                self.rows[layer][:, index].index_add_(1, cols, row)
                self.rows_sq[layer][:, index].index_add_(1, cols, row.square())
            if b0 <= pos < b1:  # a special key's column
                col = p[:, :, pos - b0].double()  # (H, c)
                self.cols[layer][:, :, index].index_add_(1, rows, col)
                self.cols_sq[layer][:, :, index].index_add_(1, rows, col.square())
        w, length = self.layout.band, self.max_length
        for r0, r1, c0, c1, offset in ex.blocks(a0, a1, b0, b1):
            sub = p[:, r0 - a0 : r1 - a0, c0 - b0 : c1 - b0]  # (H, R, C) body cells
            start = offset - (r1 - r0 - 1) + length - 1
            buffer = self._buffer(sub)
            sums = diagonal_sums(sub, buffer).double()  # (H, R + C - 1)
            self.body[layer][:, start : start + sums.shape[-1]] += sums
            rows_sq = torch.linalg.vector_norm(sub, dim=-1).square()  # (H, R) in fp32, without an (H, R, C) square
            self.body_sq[layer] += rows_sq.double().sum(-1)
            inverse = self._inverse_counts(ex, r0, r1, c0, c1)  # (R, C): this example's share of each cell's mean
            if self.layout.rank:  # only the residual reads the range sketch: far cells only
                means = sub * (inverse * far_cells(offset, r1 - r0, c1 - c0, w, p.device))  # (H, R, C)
                self.y[layer].index_add_(1, ex.slots[r0:r1], (means.double() @ self.omega[ex.slots[c0:c1]]))
            far = self._far(diagonal_sums(sub, buffer, inverse).double(), offset, r1 - r0, w)
            self.far[layer][:, start : start + far.shape[-1]] += far

    def _buffer(self, block: torch.Tensor) -> torch.Tensor:
        """A zeroed shear buffer for blocks of this shape (kept: its unwritten cells stay zero)."""
        h, r, c = block.shape
        key = (h, r, c, block.dtype, block.device)
        if key not in self._buffers:
            if len(self._buffers) > 8:  # blocks of many shapes (short examples): keep a few
                self._buffers.clear()
            self._buffers[key] = block.new_zeros(h, r, r + c - 1)
        return self._buffers[key]

    def reduce(self) -> None:
        """Sum across processes under torch.distributed (every process saw its own examples)."""
        if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
            return
        sums = (self.band, self.rows, self.cols, self.band_sq, self.rows_sq, self.cols_sq, self.body, self.body_sq)
        counts = (self.band_counts, self.rows_counts, self.cols_counts, self.body_counts, self.far_cells, self.cells)
        for t in (*sums, self.far, self.y, *counts, self.entries, self.coverage):
            torch.distributed.all_reduce(t)
        n = torch.tensor([float(self.examples)], dtype=torch.float64, device=self.device)
        torch.distributed.all_reduce(n)
        self.examples = int(n.item())


def far_cells(offset: int, rows: int, cols: int, w: int, device) -> torch.Tensor:
    """(R, C) whether each cell of a body block whose first cell has offset ``offset`` lies off the band."""
    return (offset + torch.arange(cols, device=device)[None, :] - torch.arange(rows, device=device)[:, None]).abs() > w


class ResidualProjection(BlockSink):
    """The residual's second pass: B = Q^T M (H, k, L) per layer for fixed orthonormal bases Q (layers, H, L, k) of
    the first pass's range sketches (``sketch.py``), streamed like ``StructuredAccumulator.y``: O(n^2 k) per head and
    example, O(L k) memory per head."""

    def __init__(self, acc: StructuredAccumulator, q: torch.Tensor):
        self.acc, self.q, self.chunk = acc, q.to(acc.device, torch.float64), acc.chunk
        layers, heads, length, k = q.shape
        self.b = torch.zeros(layers, heads, k, length, dtype=torch.float64, device=acc.device)

    def start_batch(self, slots: torch.Tensor) -> None:
        """Take the batch's slots (B, N) (-1 for padding)."""
        self.batch = self.acc.batch = batch_examples(slots, self.acc.special_index)
        self.acc._weights = {}

    def add_block(self, layer: int, e: int, a0: int, a1: int, b0: int, b1: int, p: torch.Tensor) -> None:
        acc, ex = self.acc, self.batch[e]
        for r0, r1, c0, c1, offset in ex.blocks(a0, a1, b0, b1):
            sub = p.detach()[:, r0 - a0 : r1 - a0, c0 - b0 : c1 - b0]
            far = far_cells(offset, r1 - r0, c1 - c0, acc.layout.band, p.device)
            m = (sub * acc._inverse_counts(ex, r0, r1, c0, c1) * far).double()  # (H, R, C)
            q = self.q[layer][:, ex.slots[r0:r1]]  # (H, R, k)
            self.b[layer].index_add_(2, ex.slots[c0:c1], q.transpose(-1, -2) @ m)  # (H, k, C)

    def reduce(self) -> torch.Tensor:
        """(layers, H, k, L) B, summed across processes under torch.distributed."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            torch.distributed.all_reduce(self.b)
        return self.b
