"""Compact constants applied as the structure they are, without materialising a matrix per head.

A batch's constant heads compute ``C_S X``: C's rows and columns of the S slots the batch uses (the compressed
slot space of ``slot_plan.py``) times the (S, B (d+1)) block of values and mask. For dense constants ``C_S`` is
sliced from the stored matrices and applied in one GEMM, S^2 per column. Compact constants
(``compact_constants.py``) say what every cell is, so the product splits into parts that never form ``C_S``:

- every body cell as the head's offset profile (Toeplitz in the slots) plus the rank-r residual ``u_i . v_j``:
  the profile part is a convolution, applied by FFT in O(S log S) per column; the residual in O(S r);
- the band (cells within w of the diagonal, stored exactly): the difference to that formula, a banded matrix
  applied block by block in O(S w) per column;
- the special slots' columns (O(S) each, every row) and rows (O(S) each, which replace those rows' results).

The special slots' values enter only through their own rows and columns, so the body product runs on the values
with the special rows zeroed. Where the compressed rows jump (a pair's first segment ends before L/2) the
profile is applied per pair of segments, each a convolution with its own stretch of the profile.

A local (sliding-window) layer needs only ``C_S``'s band of its window, plus a few single rows, columns and
corner blocks (``constant_heads._windowed``): :meth:`StructuredSlots.band_product` builds that band block by
block from the parts in O(S W) and applies it with one batched GEMM; :meth:`StructuredSlots.cells` gives any
other cells. :class:`DenseSlots` is the same interface over a materialised ``C_S``, for small S, where one GEMM
is faster (``STRUCTURED_FROM``, ``LOCAL_STRUCTURED_FROM``, measured by ``benchmarks/bench_long.py``): built from
the parts by whole Toeplitz blocks (:meth:`StructuredSlots.dense`), or cell by cell in traced graphs (whose
exporters lack FFTs and strided views), never the (L, L) matrices.

Both compute the same matrix: compact constants are used as stored, negative cells (the low-rank residual can
make a few) included; only checkpoints of format 1 clamp a dense rebuild at 0 (``CompactLayout.clamped``).

This file ships inside every PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

import copy

import torch

from .compact_constants import CompactLayout
from .dense_slots import DenseSlots
from .slots import is_tracing

# From which S the structured product beats a dense C_S built from the parts (``_built``: Toeplitz blocks copied from
# strided views of the profile, at memory speed) and one GEMM, for the global layers of a model with L > 512, and
# from which S a local (sliding-window) layer's band product (the band's cells gathered from the parts, ``band_blocks``)
# beats building the dense C_S and masking it to the window (about S = 450 at a 64-token half window; 2x faster at
# S = 513): measured by benchmarks/bench_long.py (crossover) on 2 CPU cores. Models up to L = 512 keep a dense rebuild
# and slice it, which is faster there.
STRUCTURED_FROM = 1000
LOCAL_STRUCTURED_FROM = 448
BLOCK = 64  # rows per block of a banded product
WORKSPACE = 2**24  # bytes of temporaries a structured product may hold at once (heads are taken in groups)
BUILT_WORKSPACE = 2**22  # bytes of built C_S blocks held at once, whatever the input's size (a few heads at S = 512)


class StructuredSlots:
    """``C_S`` of compact constants, applied from its parts (see the module docstring).

    Args:
        parts: the module's compact parts (``COMPACT_PARTS``), (Hc, ...) each.
        layout: their :class:`~compact_constants.CompactLayout`.
        order: (S,) the slot of every compressed row (``SlotPlan.slot_order``).
        segments: ``(first row, first slot, rows)`` of each run of consecutive slots in rows 1..S-1.
        dtype: the dtype of the products (float32 at least: FFTs need it on CPU).
        derived: where indices that depend only on the plan are kept for its every layer (``SlotPlan.derived``).
    """

    def __init__(
        self, parts: dict, layout: CompactLayout, order: torch.Tensor, segments, dtype: torch.dtype, derived=None
    ):
        self.layout, self.order, self.segments, self.dtype = layout, order, segments, dtype
        self.derived = {} if derived is None else derived  # the plan's kept indices (``SlotPlan.derived``)
        self.profile = parts["papa_constants_profile"].to(dtype)  # (Hc, 2L-1)
        self.band = parts["papa_constants_band"].to(dtype)  # (Hc, L, 2w+1)
        self.u = parts["papa_constants_u"].to(dtype).index_select(1, order)  # (Hc, S, r)
        self.v = parts["papa_constants_v"].to(dtype).index_select(1, order)  # (Hc, S, r)
        self.special_rows = parts["papa_constants_rows"].to(dtype)  # (Hc, P, L)
        self.special_cols = parts["papa_constants_cols"].to(dtype)  # (Hc, L, P)
        length = layout.max_length
        index = torch.full((length,), -1, dtype=torch.long, device=order.device)
        index[list(layout.special)] = torch.arange(len(layout.special), device=order.device)
        self.special_index = index.index_select(0, order)  # (S,) which special slot a row is, -1 for a body row

    @property
    def size(self) -> int:
        return self.order.shape[0]

    @classmethod
    def of_plan(cls, parts: dict, layout: CompactLayout, plan, dtype: torch.dtype) -> StructuredSlots:
        """The compressed constants of a :class:`~slot_plan.SlotPlan`. While tracing, its extents are symbolic and
        no segments are made: only :meth:`dense` and :meth:`cells` serve a traced graph."""
        if is_tracing():
            return cls(parts, layout, plan.slot_order, None, dtype)
        half = plan.max_length // 2
        first, second = int(plan.first), int(plan.second)
        if second == 0 or first == half:  # rows 1..S-1 hold slots 0..S-2
            segments = [(1, 0, first + second)] if first + second else []
        else:
            segments = [(1, 0, first), (1 + first, half, second)]
        return cls(parts, layout, plan.slot_order, segments, dtype, plan.derived)

    # -- cells ---------------------------------------------------------------------------------------------------

    def _body(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(Hc, ..., R, C') profile + residual at compressed rows (..., R) x columns (..., C')."""
        length = self.layout.max_length
        offset = self.order[cols][..., None, :] - self.order[rows][..., :, None]  # (..., R, C')
        value = self.profile[:, offset + length - 1]  # (Hc, ..., R, C')
        if self.layout.rank:
            value = value.add_(self.u[:, rows] @ self.v[:, cols].transpose(-1, -2))
        return value

    def _in_band(self, rows: torch.Tensor, cols: torch.Tensor, body_only: bool = False):
        """The cells of rows x columns within the stored band: their positions and stored values (Hc, K)."""
        w = self.layout.band
        slot_r, slot_c = self.order[rows][..., :, None], self.order[cols][..., None, :]
        inside = (slot_c - slot_r).abs() <= w  # (..., R, C')
        if body_only:
            inside &= (self.special_index[rows] < 0)[..., :, None] & (self.special_index[cols] < 0)[..., None, :]
        where = inside.nonzero(as_tuple=True)  # positions in (..., R, C')
        slot_r, slot_c = slot_r.expand_as(inside)[where], slot_c.expand_as(inside)[where]
        return where, self.band[:, slot_r, slot_c - slot_r + w]  # (Hc, K)

    def cells(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(Hc, ..., R, C') ``C_S`` at compressed rows (..., R) x columns (..., C'), by the storage's definition:
        a special column's stored value, else a special row's, else the band's, else profile + residual."""
        value = self._body(rows, cols)
        where, band = self._in_band(rows, cols)
        value[(slice(None), *where)] = band
        slot_r, slot_c = self.order[rows], self.order[cols]  # (..., R), (..., C')
        special_r = (self.special_index[rows] >= 0).nonzero(as_tuple=True)  # rows of special slots
        if special_r[0].numel():
            p, lead = self.special_index[rows][special_r], special_r[:-1]
            value[(slice(None), *special_r)] = self.special_rows[:, p[:, None], slot_c[lead]]  # (Hc, K, C')
        special_c = (self.special_index[cols] >= 0).nonzero(as_tuple=True)
        if special_c[0].numel():
            p, lead = self.special_index[cols][special_c], special_c[:-1]
            by_column = value.transpose(-1, -2)  # a view: columns first
            by_column[(slice(None), *special_c)] = self.special_cols[:, slot_r[lead], p[:, None]]  # (Hc, K, R)
        return value

    def traceable_cells(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """:meth:`cells` without data-dependent shapes (every branch at every cell, then ``where``): for exports."""
        w = self.layout.band
        slot_r, slot_c = self.order[rows][..., :, None], self.order[cols][..., None, :]  # (..., R, 1), (..., 1, C')
        offset = slot_c - slot_r
        value = torch.where(
            offset.abs() <= w, self.band[:, slot_r, (offset + w).clamp(0, 2 * w)], self._body(rows, cols)
        )
        pr, pc = self.special_index[rows][..., :, None], self.special_index[cols][..., None, :]
        value = torch.where(pr >= 0, self.special_rows[:, pr.clamp_min(0), slot_c], value)
        return torch.where(pc >= 0, self.special_cols[:, slot_r, pc.clamp_min(0)], value)

    def dense(self) -> DenseSlots:
        """``C_S`` materialised (S^2 per head): for small S and traced graphs."""
        if is_tracing() or self.segments is None:
            idx = torch.arange(self.size, device=self.order.device)
            return DenseSlots(self.traceable_cells(idx, idx))
        return DenseSlots(self._built())

    def built(self) -> BuiltSlots:
        """``C_S`` built from the parts a group of heads at a time, each group applied with one GEMM."""
        return BuiltSlots(self)

    def _built(self) -> torch.Tensor:
        """(Hc, S, S) ``C_S`` at memory speed: the profile part of each pair of segments is a Toeplitz block, copied
        from a strided (Hankel) view of the profile, not gathered cell by cell; the residual is one product; then the
        band's diagonals and the special rows and columns are written over it (``cells``' order of precedence)."""
        hc, size, length, w = self.profile.shape[0], self.size, self.layout.max_length, self.layout.band
        out = self.profile.new_zeros(hc, size, size)
        for row_p, slot_p, n_p in self.segments:
            for row_q, slot_q, n_q in self.segments:
                # block[a, b] = profile[slot_q + b - slot_p - a + L - 1]: rows flipped, profile[first + a' + b]
                first = slot_q - slot_p + length - 1 - (n_p - 1)
                run = self.profile[:, first : first + n_p + n_q - 1]  # (Hc, n_p + n_q - 1), unit stride
                hankel = run.as_strided((hc, n_p, n_q), (run.stride(0), 1, 1))
                out[:, row_p : row_p + n_p, row_q : row_q + n_q] = hankel.flip(1)
        if self.layout.rank:
            out[:, 1:, 1:] += self.u[:, 1:] @ self.v[:, 1:].transpose(-1, -2)
        rows = torch.arange(1, size, device=out.device)
        for k in range(-w, w + 1):  # slots of rows 1.. increase: a band cell is at most w rows from the diagonal
            i = rows[(rows + k >= 1) & (rows + k < size)]
            d = self.order[i + k] - self.order[i]  # the cell's offset in slots (more than k across a pair's middle)
            i, d = i[d.abs() <= w], d[d.abs() <= w]
            out[:, i, i + k] = self.band[:, self.order[i], d + w]
        special = (self.special_index >= 0).nonzero().squeeze(-1)  # compressed rows of special slots
        out[:, special, :] = self.special_rows[:, self.special_index[special]][:, :, self.order]  # (Hc, P', S)
        out[:, :, special] = self.special_cols[:, self.order][:, :, self.special_index[special]]  # (Hc, S, P')
        return out

    # -- products ------------------------------------------------------------------------------------------------

    def _by_heads(self, method, x: torch.Tensor, *args, per_head: int | None = None) -> torch.Tensor:
        """``method(x, *args)`` on groups of heads whose temporaries (``per_head`` bytes a head; by default about a
        dozen copies of a head's (S, C) values: FFT spectra, blocks, windows) fit twice the input's size (at least
        ``BUILT_WORKSPACE``) and ``WORKSPACE`` bytes, so memory stays near the input's size. (At S = 512 a fixed
        16 MiB workspace held more than the whole forward of the source: peak 20.1 MiB against 17.3; bench_long.py,
        memory.)"""
        x = x.to(self.dtype)
        floor = 0 if per_head is None else BUILT_WORKSPACE  # built blocks: a few heads at once, whatever x's size
        per_head = per_head or 12 * x.shape[1] * x.shape[2] * x.element_size()
        budget = min(WORKSPACE, max(2 * x.numel() * x.element_size(), floor))
        group = max(1, budget // per_head)
        if group >= x.shape[0]:
            return method(self, x, *args)
        out = torch.empty_like(x)
        for h in range(0, x.shape[0], group):
            heads = copy.copy(self)
            for name in ("profile", "band", "u", "v", "special_rows", "special_cols"):
                setattr(heads, name, getattr(self, name)[h : h + group])
            out[h : h + group] = method(heads, x[h : h + group], *args)
        return out

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """(Hc, S, C) ``C_S x`` for x (Hc, S, C), without forming ``C_S``."""
        return self._by_heads(StructuredSlots._product, x)

    def band_product(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """(Hc, S, C) the product with ``C_S`` kept only where 1 <= i, j and |i - j| <= ``width``."""
        block = max(BLOCK, width)
        cells = -(-self.size // block) * block * (block + 2 * width)  # a head's band blocks
        # the blocks and x's windows (a residual's u v^T is one more block: the group is then about 2x the budget)
        per_head = cells * (1 + x.shape[2] // block) * x.element_size()
        return self._by_heads(StructuredSlots._band_product, x, width, per_head=per_head)

    def _product(self, x: torch.Tensor) -> torch.Tensor:
        special = (self.special_index >= 0).nonzero().squeeze(-1)  # (P',) compressed rows of special slots
        body_x = x.index_fill(1, special, 0.0)  # (Hc, S, C) values of body tokens only
        out = self._toeplitz(body_x)
        if self.layout.rank:
            out = out.baddbmm_(self.u, self.v.transpose(-1, -2) @ body_x)  # (Hc, S, r) (Hc, r, C)
        out = out.add_(self._blocked(body_x, self.layout.band, self._band_difference))
        # Special columns reach every row; special rows replace the body formula with their stored row.
        all_rows = torch.arange(self.size, device=x.device)
        out = out.baddbmm_(self.cells(all_rows, special), x.index_select(1, special))  # (Hc, S, P') (Hc, P', C)
        return out.index_copy_(1, special, self.cells(special, all_rows) @ x)  # (Hc, P', S) their own rows

    def _band_product(self, x: torch.Tensor, width: int) -> torch.Tensor:
        return _banded(self.band_blocks(width), x, width)

    def band_blocks(self, width: int) -> torch.Tensor:
        """(Hc, nb, R, R + 2 width) ``C_S``'s band in blocks of R = max(``BLOCK``, width) rows (block b: rows bR ..
        bR + R - 1 by columns bR - width .. bR + R + width - 1), 0 outside the band and outside rows and columns
        1 .. S - 1.

        Gathered from the parts over the band's cells alone (O(S W) a head, never the (S, S) matrix), by ``cells``'
        order of precedence; the indices depend on the plan alone and are kept for its every layer."""
        index = self._band_index(width)
        hc, (nb, r, c) = self.profile.shape[0], index["valid"].shape
        value = self.profile.index_select(1, index["profile"]).view(hc, nb, r, c)  # (Hc, nb, R, C) body formula
        if self.layout.rank:
            u = self.u.index_select(1, index["rows"]).view(hc, nb, r, -1)  # (Hc, nb, R, r)
            v = self.v.index_select(1, index["cols"]).view(hc, nb, c, -1)  # (Hc, nb, C, r)
            value = value.add_(u @ v.transpose(-1, -2))
        cells, at = index["band"]  # (K,) the cells within the stored band, and where the band stores them
        value.view(hc, -1).index_copy_(1, cells, self.band.reshape(hc, -1).index_select(1, at))
        blocks, at, p = index["special_rows"]  # (K,) a special slot's row: its stored row, over the block's columns
        if blocks.numel():
            value[:, blocks, at] = self.special_rows[:, p[:, None], self.order[index["cols"].view(nb, c)[blocks]]]
        blocks, at, p = index["special_cols"]  # (K,) a special slot's column: its stored column, over the rows
        if blocks.numel():
            by_column = value.transpose(-1, -2)  # (Hc, nb, C, R) view
            by_column[:, blocks, at] = self.special_cols[:, self.order[index["rows"].view(nb, r)[blocks]], p[:, None]]
        return value.mul_(index["valid"].to(value.dtype))

    def _band_index(self, width: int) -> dict:
        """The cells of :meth:`band_blocks` as indices into the parts (kept in ``derived`` for the forward: about 20
        bytes a cell, some 20 MB at S = 8,192 and a 64-token half window)."""
        key = ("band_blocks", width, self.layout)
        if key in self.derived:
            return self.derived[key]
        size, length, w, device = self.size, self.layout.max_length, self.layout.band, self.order.device
        block = max(BLOCK, width)
        start = torch.arange(-(-size // block), device=device)[:, None] * block
        rows = start + torch.arange(block, device=device)  # (nb, R)
        cols = start - width + torch.arange(block + 2 * width, device=device)  # (nb, C)
        row_in, col_in = (rows >= 1) & (rows < size), (cols >= 1) & (cols < size)  # row and column 0 apart
        valid = row_in[:, :, None] & col_in[:, None, :] & ((rows[:, :, None] - cols[:, None, :]).abs() <= width)
        rows, cols = rows.clamp(max=size - 1), cols.clamp(0, size - 1)
        slot_r, slot_c = self.order[rows], self.order[cols]  # (nb, R), (nb, C)
        offset = slot_c[:, None, :] - slot_r[:, :, None]  # (nb, R, C) in slots
        special_r, special_c = self.special_index[rows], self.special_index[cols]  # (nb, R), (nb, C)
        in_band = (offset.abs() <= w) & valid
        band_at = slot_r[:, :, None] * (2 * w + 1) + (offset + w).clamp(0, 2 * w)  # (nb, R, C)
        blocks_r, at_r = ((special_r >= 0) & valid.any(2)).nonzero(as_tuple=True)
        blocks_c, at_c = ((special_c >= 0) & valid.any(1)).nonzero(as_tuple=True)
        index = {
            "valid": valid,
            "rows": rows.reshape(-1),
            "cols": cols.reshape(-1),
            "profile": (offset + length - 1).reshape(-1),
            "band": (in_band.view(-1).nonzero().squeeze(-1), band_at.view(-1)[in_band.view(-1)]),
            "special_rows": (blocks_r, at_r, special_r[blocks_r, at_r]),
            "special_cols": (blocks_c, at_c, special_c[blocks_c, at_c]),
        }
        self.derived[key] = index
        return index

    def _band_difference(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """What the band changes in the body formula: stored band minus profile + residual, on body cells."""
        where, band = self._in_band(rows, cols, body_only=True)
        body = self._body(rows, cols)
        difference = torch.zeros_like(body)
        difference[(slice(None), *where)] = band - body[(slice(None), *where)]
        return difference

    def _blocked(self, x: torch.Tensor, width: int, values) -> torch.Tensor:
        """(Hc, S, C) a banded product: rows in blocks, each block times its (block + 2 width) columns.

        ``values(rows (nb, R), cols (nb, R + 2 width))`` gives the blocks' cells (Hc, nb, R, R + 2 width); cells
        farther than ``width`` from the diagonal, or outside [0, S), are dropped here.
        """
        size = x.shape[1]
        block = max(BLOCK, width)
        start = torch.arange(-(-size // block), device=x.device)[:, None] * block
        rows = start + torch.arange(block, device=x.device)  # (nb, R)
        cols = start - width + torch.arange(block + 2 * width, device=x.device)  # (nb, R + 2w)
        valid = (rows[:, :, None] < size) & (cols[:, None, :] >= 0) & (cols[:, None, :] < size)
        valid &= (rows[:, :, None] - cols[:, None, :]).abs() <= width  # (nb, R, R + 2w)
        matrices = values(rows.clamp(max=size - 1), cols.clamp(0, size - 1))
        return _banded(matrices.mul_(valid.to(matrices.dtype)), x, width)  # (a product: a bool fill is 30x slower)

    def _toeplitz(self, x: torch.Tensor) -> torch.Tensor:
        """(Hc, S, C) the profile part ``sum_j profile[slot_j - slot_i] x_j`` over rows 1..S-1, by FFT."""
        out = torch.zeros_like(x)
        if not self.segments:
            return out
        length = self.layout.max_length
        n_fft = _fft_size(2 * max(n for _, _, n in self.segments))
        spectra = [torch.fft.rfft(x[:, r : r + n], n=n_fft, dim=1) for r, _, n in self.segments]  # (Hc, F, C)
        for row_p, slot_p, n_p in self.segments:
            total = 0
            for (_, slot_q, n_q), spectrum in zip(self.segments, spectra, strict=True):
                # out[a] = sum_b profile[slot_q + b - slot_p - a] x[b]: a convolution, kernel[m] = profile[delta - m]
                m = torch.arange(-(n_q - 1), n_p, device=x.device)
                kernel = x.new_zeros(x.shape[0], n_fft)
                kernel[:, m % n_fft] = self.profile[:, slot_q - slot_p - m + length - 1]
                total = total + torch.fft.rfft(kernel, dim=1)[:, :, None] * spectrum
            out[:, row_p : row_p + n_p] = torch.fft.irfft(total, n=n_fft, dim=1)[:, :n_p]
        return out


def _banded(matrices: torch.Tensor, x: torch.Tensor, width: int) -> torch.Tensor:
    """(Hc, S, C) the product of banded row blocks (Hc, nb, R, R + 2 width) (``band_blocks``' layout) with x (Hc, S,
    C): each block times its window of x's rows, one batched GEMM."""
    hc, nb, block, _ = matrices.shape
    size, c = x.shape[1], x.shape[2]
    padded = torch.nn.functional.pad(x.to(matrices.dtype), (0, 0, width, nb * block - size + width))  # (Hc, nbR+2w, C)
    windows = padded.unfold(1, block + 2 * width, block).transpose(-1, -2)  # (Hc, nb, R + 2w, C)
    return (matrices @ windows).reshape(hc, nb * block, c)[:, :size]


def _fft_size(n: int) -> int:
    """The smallest 2^a 3^b 5^c >= n (fast FFT lengths)."""
    best = 1 << max(n - 1, 0).bit_length()
    p5 = 1
    while p5 < best:
        p35 = p5
        while p35 < best:
            p = p35
            while p < n:
                p *= 2
            best = min(best, p)
            p35 *= 3
        p5 *= 5
    return best


class BuiltSlots:
    """``C_S`` of compact constants built from the parts (``StructuredSlots._built``) a group of heads at a time,
    each group applied with one GEMM: the speed of a dense ``C_S`` below the crossovers, with its (S, S) blocks held
    only for a few heads at once (the whole (Hc, S, S) at S = 512 doubled a batch-1 forward's peak memory)."""

    def __init__(self, structured: StructuredSlots):
        self.structured = structured

    def _per_head(self) -> int:
        size = self.structured.size
        return size * size * torch.finfo(self.structured.dtype).bits // 8

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """(Hc, S, C) ``C_S x`` for x (Hc, S, C)."""
        return self.structured._by_heads(_built_product, x, per_head=self._per_head())

    def band_product(self, x: torch.Tensor, width: int) -> torch.Tensor:
        """(Hc, S, C) the product with ``C_S`` kept only where 1 <= i, j and |i - j| <= ``width``."""
        return self.structured._by_heads(_built_band_product, x, width, per_head=2 * self._per_head())

    def cells(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(Hc, ..., R, C') cells at compressed rows (..., R) x columns (..., C')."""
        return self.structured.cells(rows, cols)


def _built_product(slots: StructuredSlots, x: torch.Tensor) -> torch.Tensor:
    return torch.bmm(slots._built(), x)  # (h, S, S) (h, S, C)


def _built_band_product(slots: StructuredSlots, x: torch.Tensor, width: int) -> torch.Tensor:
    return DenseSlots(slots._built()).band_product(x, width, owned=True)
