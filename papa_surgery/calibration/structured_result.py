"""From the structured sums to the compact parts: means, coverage fill, offset profile and residual factors.

The result equals ``compact_parts(fill_uncovered(dense means))`` of a dense calibration (``coverage.py``,
``compaction.py``), expressed on the structure:

- band, special rows and columns: sum / count, and where no example reached a cell, the fill rules of
  ``fill_uncovered`` (a body query to a special slot: the head's mean from covered body rows to that slot; a special
  query to a body slot: that row's mean over its covered body cells; anything else: the body cells' count-weighted
  profile at the cell's offset, a measured offset's value borrowed by the nearest unmeasured one);
- the profile: the plain mean over all far cells of each offset, covered cells (streamed sums of A / counts) and
  filled ones (their fill value) alike;
- the residual far * (C - T): the streamed sketch of the covered far cells plus, in row chunks of the known
  structure (O(L^2 (k + l)) work per head, once, O(chunk * L) memory), the filled far cells minus the profile.
"""

from __future__ import annotations

import torch

from .compaction import COMPLETION_ROUNDS
from .coverage import nearest_measured
from .sketch import low_rank
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


def structured_parts(acc: StructuredAccumulator, fill: bool = True, rounds: int = COMPLETION_ROUNDS) -> dict:
    """The compact parts ``{name: (layers, heads, ...) float64}`` of the accumulated corpus (module docstring)."""
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
        far_fill = filler.profile.clamp_min(0) if fill else torch.zeros_like(acc.far[layer].cpu())  # (H, 2L-1)
        profile = (acc.far[layer].cpu() + unreached * far_fill) / far_total.clamp_min(1.0)
        y, x = _corrected_sketch(acc, layer, profile, far_fill)
        u, v = low_rank(y, x, acc.omega.cpu(), acc.psi.cpu(), layout, rounds)
        found = {"band": band, "rows": rows, "cols": cols, "profile": profile, "u": u, "v": v}
        for name, t in found.items():
            out.setdefault(f"papa_constants_{name}", []).append(t)
    return {name: torch.stack(ts) for name, ts in out.items()}


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


def _corrected_sketch(acc: StructuredAccumulator, layer: int, profile, far_fill):
    """The sketches of far * (C - T): the streamed covered far means, plus filled far cells, minus the profile."""
    y, x = acc.y[layer].cpu().clone(), acc.w[layer].cpu().clone()
    omega, psi = acc.omega.cpu(), acc.psi.cpu()
    everything = torch.arange(acc.max_length)
    for rows, offset, far in _row_chunks(acc):
        reached = acc.layouts.counts_at(rows, everything) > 0  # (c, L)
        g = torch.where(far & ~reached, far_fill[:, offset], 0.0) - torch.where(far, profile[:, offset], 0.0)
        y[:, rows] += g @ omega  # (H, c, k)
        x += psi[:, rows] @ g  # (H, l, L)
    return y, x
