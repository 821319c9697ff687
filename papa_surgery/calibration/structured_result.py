"""From the structured sums to the compact parts: means, coverage fill, offset profile and residual factors.

The result equals ``compact_parts(fill_uncovered(dense means))`` of a dense calibration (``coverage.py``,
``compaction.py``), expressed on the structure; the residual up to the range finder's error (exact when its sketch
has L columns):

- band, special rows and columns: sum / count, and where no example reached a cell, the fill rules of
  ``fill_uncovered`` (a body query to a special slot: the head's mean from covered body rows to that slot; a special
  query to a body slot: that row's mean over its covered body cells; anything else: the body cells' count-weighted
  profile at the cell's offset, a measured offset's value borrowed by the nearest unmeasured one);
- the profile: the plain mean over all far cells of each offset, covered cells (streamed sums of A / counts) and
  filled ones (their fill value) alike;
- the residual far * (C - T), in two passes (``sketch.py``): the range sketch streamed in the first, corrected
  for the filled far cells minus the profile in row chunks of the known structure (O(L^2 k) work per head, O(chunk * L)
  memory), then its projection B = Q^T (far * (C - T)), streamed in the second pass and corrected the
  same way.
"""

from __future__ import annotations

import torch

from .compaction import COMPLETION_ROUNDS
from .coverage import nearest_measured
from .sketch import low_rank, range_basis
from .structured import StructuredAccumulator


def _mean(sums: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    return torch.where(counts > 0, sums / counts.clamp_min(1.0), torch.zeros_like(sums))


class _Fill:
    """The fill values of one layer's heads, cell by cell (``coverage.fill_uncovered``'s rules)."""

    def __init__(self, acc: StructuredAccumulator, layer: int):
        length = acc.max_length
        self.length, self.special, self.index = length, acc.special.cpu(), acc.special_index.cpu()
        body = ~self.special
        self.profile = nearest_measured(_mean(acc.body[layer], acc.body_counts), acc.body_counts).cpu()  # (H, 2L-1)
        to_sum, to_count = acc.cols[layer][:, body].sum(1), acc.cols_counts[body].sum(0)  # (H, S), (S,)
        from_sum, from_count = acc.rows[layer][:, :, body].sum(-1), acc.rows_counts[:, body].sum(-1)
        self.to_special, self.to_seen = _mean(to_sum, to_count).cpu(), (to_count > 0).cpu()
        self.from_special, self.from_seen = _mean(from_sum, from_count).cpu(), (from_count > 0).cpu()

    def at(self, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
        """(H, *shape) the fill value of cells (i, j) (broadcast long tensors of equal shape)."""
        value = self.profile[:, j - i + self.length - 1]
        si, sj = self.special[i], self.special[j]
        to = ~si & sj & self.to_seen[self.index[j].clamp_min(0)]
        value = torch.where(to, self.to_special[:, self.index[j].clamp_min(0)], value)
        frm = si & ~sj & self.from_seen[self.index[i].clamp_min(0)]
        value = torch.where(frm, self.from_special[:, self.index[i].clamp_min(0)], value)
        return value.clamp_min(0)


def _filled(sums, counts, cells_i, cells_j, fill: _Fill | None) -> torch.Tensor:
    mean = _mean(sums.cpu(), counts.cpu())
    if fill is None:
        return mean
    return torch.where(counts.cpu() > 0, mean, fill.at(cells_i, cells_j))


def structured_parts(acc: StructuredAccumulator, fill: bool = True) -> dict:
    """The compact parts ``{name: (layers, heads, ...) float64}`` of the accumulated corpus (module docstring); the
    residual factors ``u`` and ``v`` are zero here: :func:`residual_factors` finds them after the second pass."""
    layout, length, w = acc.layout, acc.max_length, acc.layout.band
    idx = torch.arange(length)
    special_slots = torch.tensor(layout.special)
    band_i = idx[:, None].expand(-1, 2 * w + 1)  # (L, 2w+1)
    band_j = idx[:, None] + torch.arange(-w, w + 1)[None, :]
    inside = (band_j >= 0) & (band_j < length)
    band_j = band_j.clamp(0, length - 1)
    far_total = _far_cells(acc)  # (2L-1,) far cells per offset
    unreached = (far_total - acc.far_cells.cpu().round()).clamp_min(0)  # far cells no example reached
    out: dict[str, list[torch.Tensor]] = {}
    for layer in range(acc.band.shape[0]):
        filler = _Fill(acc, layer) if fill else None
        band = _filled(acc.band[layer], acc.band_counts, band_i, band_j, filler)
        band = torch.where(inside, band, 0.0)
        rows = _filled(acc.rows[layer], acc.rows_counts, special_slots[:, None], idx[None, :], filler)
        cols = _filled(acc.cols[layer], acc.cols_counts, idx[:, None], special_slots[None, :], filler)
        profile = (acc.far[layer].cpu() + unreached * _far_fill(acc, filler)) / far_total.clamp_min(1.0)
        zero = torch.zeros(band.shape[0], length, layout.rank, dtype=torch.float64)
        found = {"band": band, "rows": rows, "cols": cols, "profile": profile, "u": zero, "v": zero.clone()}
        for name, t in found.items():
            out.setdefault(f"papa_constants_{name}", []).append(t)
    return {name: torch.stack(ts) for name, ts in out.items()}


def _far_fill(acc: StructuredAccumulator, filler: _Fill | None) -> torch.Tensor:
    """(H, 2L-1) the value a far cell no example reached takes, by offset (zero without the coverage fill)."""
    if filler is None:
        return torch.zeros(acc.band.shape[1], 2 * acc.max_length - 1, dtype=torch.float64)
    return filler.profile.clamp_min(0)


def residual_ranges(acc: StructuredAccumulator, parts: dict, fill: bool = True) -> torch.Tensor:
    """(layers, H, L, k) orthonormal bases of the residual's range sketches, the first pass's (module docstring)."""
    omega = acc.omega.cpu()
    out = []
    for layer in range(acc.band.shape[0]):
        y = acc.y[layer].cpu().clone()  # (H, L, k)
        for rows, g in _known_residual(acc, layer, parts, fill):
            y[:, rows] += g @ omega  # (H, c, k)
        out.append(range_basis(y))
    return torch.stack(out)


def residual_factors(acc: StructuredAccumulator, parts: dict, q: torch.Tensor, b: torch.Tensor, fill: bool = True,
                     rounds: int = COMPLETION_ROUNDS) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """(u, v) (layers, H, L, r) float64: the residual's factors from the bases ``q`` (layers, H, L, k) and the
    second pass's streamed projections ``b`` (layers, H, k, L) (module docstring)."""
    us, vs = [], []
    for layer in range(acc.band.shape[0]):
        bl = b[layer].cpu().clone()  # (H, k, L)
        ql = q[layer].cpu()
        for rows, g in _known_residual(acc, layer, parts, fill):
            bl += ql[:, rows].transpose(-1, -2) @ g  # (H, k, L)
        u, v = low_rank(ql, bl, acc.layout, rounds)
        us.append(u)
        vs.append(v)
    return torch.stack(us), torch.stack(vs)


def _row_chunks(acc: StructuredAccumulator):
    """(rows (c,), offset index (c, L), far mask (c, L)) for row chunks of the L x L grid."""
    length, idx = acc.max_length, torch.arange(acc.max_length)
    special = acc.special.cpu()
    for a0 in range(0, length, acc.chunk):
        rows = idx[a0 : a0 + acc.chunk]
        d = idx[None, :] - rows[:, None]
        far = (d.abs() > acc.layout.band) & ~special[rows][:, None] & ~special[None, :]
        yield rows, d + length - 1, far


def _far_cells(acc: StructuredAccumulator) -> torch.Tensor:
    total = torch.zeros(2 * acc.max_length - 1, dtype=torch.float64)
    for _, offset, far in _row_chunks(acc):
        total.index_add_(0, offset[far], torch.ones(int(far.sum()), dtype=torch.float64))
    return total


def _known_residual(acc: StructuredAccumulator, layer: int, parts: dict, fill: bool):
    """(rows (c,), g (H, c, L)) in row chunks: the part of far * (C - T) not streamed, the filled far cells minus the
    profile T on every far cell (the streamed sums carry the covered far cells' means)."""
    filler = _Fill(acc, layer) if fill else None
    far_fill, profile = _far_fill(acc, filler), parts["papa_constants_profile"][layer]  # (H, 2L-1) each
    everything = torch.arange(acc.max_length)
    for rows, offset, far in _row_chunks(acc):
        reached = acc.layouts.counts_at(rows, everything) > 0  # (c, L)
        yield rows, torch.where(far & ~reached, far_fill[:, offset], 0.0) - torch.where(far, profile[:, offset], 0.0)


def variance_from_sums(acc: StructuredAccumulator, parts: dict) -> torch.Tensor:
    """(layers, heads) the mean squared deviation of A from the stored constants C~ over every real entry, from the
    first pass's sums when the layout has no residual (``into_structure.py``).

    Every real entry lies in exactly one stored part: a special column's cell, else a special row's, else a band cell,
    else a far cell, whose constant is its offset's profile value. Over the entries of one cell (or one far offset),
    sum (A - C)^2 = S2 - 2 C S1 + n C^2 with S1, S2 the sums of A and A^2 and n the entries; the far cells' S2 is the
    body cells' minus the band's.
    """
    if acc.layout.rank:
        raise ValueError("with a residual the constants are not the means the sums hold: measure the variance pass")
    length, w = acc.max_length, acc.layout.band
    body = ~acc.special.cpu()
    idx = torch.arange(length)
    band_j = idx[:, None] + torch.arange(-w, w + 1)[None, :]  # (L, 2w+1)
    band_body = (band_j >= 0) & (band_j < length) & body[:, None] & body[band_j.clamp(0, length - 1)]
    far = (torch.arange(2 * length - 1) - (length - 1)).abs() > w  # (2L-1,) offsets of far cells

    def deviation(s1, s2, n, c):  # sum over the entries of each cell of (A - C)^2
        return s2 - 2 * c * s1 + n * c * c

    out = []
    for layer in range(acc.band.shape[0]):
        c = {name: t[layer].double() for name, t in parts.items()}
        band_sq = acc.band_sq[layer].cpu()  # (H, L, 2w+1)
        band = deviation(acc.band[layer].cpu(), band_sq, acc.band_counts.cpu(), c["papa_constants_band"])
        cols = deviation(
            acc.cols[layer].cpu(), acc.cols_sq[layer].cpu(), acc.cols_counts.cpu(), c["papa_constants_cols"]
        )
        rows = deviation(
            acc.rows[layer].cpu(), acc.rows_sq[layer].cpu(), acc.rows_counts.cpu(), c["papa_constants_rows"]
        )
        profile = c["papa_constants_profile"]  # (H, 2L-1)
        far_sq = acc.body_sq[layer].cpu() - (band_sq * band_body).sum((1, 2))  # (H,)
        s1, n = acc.body[layer].cpu() * far, acc.body_counts.cpu() * far  # raw sums and entries of far cells
        total = (
            (band * band_body).sum((1, 2))
            + cols.sum((1, 2))
            + rows[:, :, body].sum((1, 2))
            + far_sq
            - 2 * (profile * s1).sum(-1)
            + (n * profile * profile).sum(-1)
        )
        out.append(total / acc.entries.cpu().clamp_min(1.0))
    return torch.stack(out).clamp_min(0)
