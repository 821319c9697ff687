"""A faster drop-in for calibration's ``_Accumulator``: same slot layout, same deterministic fp64 sums.

Calibration's ``_Accumulator`` sums the examples that share a slot layout with a one-hot matrix product and
gathers each layout's real cells with one boolean mask per layout. Here the real cells of the whole batch
are gathered once (one ``index_select`` with indices precomputed per batch), which several accumulators
can share (plain A and the norm-weighted A of one pass), and the squared sums are optional.

Determinism: on CPU the gathered cells are added with one sequential ``index_add_`` (examples in batch
order); on CUDA, where ``index_add_`` with repeated indices races, the examples of each layout are first
summed with the one-hot product and each layout's (distinct) cells scattered separately, as calibration does.
"""

from __future__ import annotations

import torch

from ..calibrate import _Accumulator
from ..hub_code.slots import SlotLayout


class BatchCells:
    """Where the real (i, j) entries of one batch go in the flat L*L slot grid."""

    def __init__(self, layout: SlotLayout, num_tokens: int):
        slots = layout.slots  # (B, N)
        b, n = slots.shape
        self.batch, self.tokens = b, n
        real = slots >= 0
        mask = (real[:, :, None] & real[:, None, :]).reshape(-1)  # (B*N*N,)
        self.flat = mask.nonzero().squeeze(-1)  # (cells,) into (B*N*N), example after example
        s = slots.clamp_min(0)
        self.cells = (s[:, :, None] * layout.max_length + s[:, None, :]).reshape(-1)[self.flat]  # (cells,)
        self.columns = (self.flat // (n * n)) * n + self.flat % n  # (cells,) index of (b, j) into (B*N)
        self.layout = layout

    def gather(self, matrices: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
        """(B, H, N, N) -> (H, cells) real entries, in ``dtype``."""
        b, h = matrices.shape[:2]
        flat = matrices.detach().transpose(0, 1).reshape(h, -1)  # (H, B*N*N)
        return flat.index_select(1, self.flat).to(dtype)

    def gather_columns(self, per_token: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
        """(B, H, N) values of the attended token j -> (H, cells)."""
        h = per_token.shape[1]
        return per_token.detach().transpose(0, 1).reshape(h, -1).index_select(1, self.columns).to(dtype)


class LayoutAccumulator(_Accumulator):
    """Running fp64 sums per (layer, head, slot cell) and per-cell example counts.

    Args:
        squares: also sum squares for the per-head variance (``result()`` returns ``None`` as variance
            when off).
    """

    def __init__(self, num_layers: int, num_heads: int, max_length: int, device, squares: bool = True):
        super().__init__(num_layers, num_heads, max_length, device)
        if not squares:
            self.squares = None
        self.cells: BatchCells | None = None

    def start_batch(self, layout: SlotLayout, cells: BatchCells | None = None) -> BatchCells:
        super().start_batch(layout)
        self.cells = cells or BatchCells(layout, layout.slots.shape[1])
        return self.cells

    def add(self, layer: int, probs: torch.Tensor) -> None:
        """Add one layer's (B, H, N, N) matrices of the current batch (padding entries are ignored)."""
        if self.sums.device.type == "cpu":
            self.add_gathered(layer, self.cells.gather(probs))
        else:
            self._add_grouped(layer, probs)

    def add_gathered(self, layer: int, part: torch.Tensor) -> None:
        """Add (H, cells) float64 real entries from :meth:`BatchCells.gather`."""
        if self.sums.device.type != "cpu":
            h = part.shape[0]
            c = self.cells
            dense = torch.zeros(h, c.batch * c.tokens * c.tokens, dtype=part.dtype, device=part.device)
            dense[:, c.flat] = part
            return self._add_grouped(layer, dense.view(h, c.batch, c.tokens, c.tokens).transpose(0, 1))
        self.sums[layer].index_add_(1, self.cells.cells, part)
        if self.squares is not None:
            self.squares[layer].index_add_(1, self.cells.cells, part * part)

    def _add_grouped(self, layer: int, probs: torch.Tensor) -> None:
        """Calibration's race-free path: sum per layout (one-hot product), scatter each layout's cells."""
        onehot, masks, cells = self._batch
        b, h = probs.shape[:2]
        a = probs.detach().to(torch.float64).reshape(b, -1)  # (B, H*N*N)
        targets = [(self.sums[layer], a)]
        if self.squares is not None:
            targets.append((self.squares[layer], a * a))
        for target, values in targets:
            grouped = (onehot @ values).view(onehot.shape[0], h, -1)  # (U, H, N*N)
            for i, idx in enumerate(cells):
                target.index_add_(1, idx, grouped[i][:, masks[i]])

    def reduce(self) -> None:
        if self.squares is not None:
            return super().reduce()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            for t in (self.sums, self.counts):
                torch.distributed.all_reduce(t)
            n = torch.tensor([float(self.examples)], dtype=torch.float64, device=self.counts.device)
            torch.distributed.all_reduce(n)
            self.examples = int(n.item())

    def result(self):
        """(mean (layers, heads, L, L) float32, counts (L, L) float64, variance (layers, heads) or None)."""
        if self.squares is not None:
            return super().result()
        length = self.max_length
        mean = torch.where(self.counts > 0, self.sums / self.counts.clamp_min(1.0), torch.zeros_like(self.sums))
        layers, heads = mean.shape[:2]
        return mean.view(layers, heads, length, length).float().cpu(), self.counts.view(length, length).cpu(), None
