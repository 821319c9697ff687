"""Streaming fp64 sums of (B, H, N, N) matrices into the L x L slot grid, shared by calibration and analyses.

Each real entry (i, j) of an example lands in cell (slot_i, slot_j) of its head's flat L*L grid. Memory is
O(layers * heads * L^2), whatever the corpus size.

Determinism: on CPU the real entries of a whole batch are gathered once and added with one sequential
``index_add_`` (examples in batch order). On CUDA, where ``index_add_`` with repeated indices races, the
examples that share a slot layout are first summed with a one-hot matrix product and each layout's cells
(distinct within a layout) are scattered separately.
"""

from __future__ import annotations

import torch


class SlotLayout:
    """The slots of one batch, grouped by distinct layout (examples with the same slots share one).

    Attributes:
        slots: (B, N) slot of every token, -1 for padding.
        max_length: L.
        unique, inverse: (U, N) distinct slot rows and (B,) the row of each example.
        cell_index: (U, N, N) flat index of each (i, j) into the L*L grid.
        cell_mask: (U, N, N) whether both i and j are real tokens.
    """

    def __init__(self, slots: torch.Tensor, max_length: int):
        self.slots = slots  # (B, N)
        self.max_length = max_length
        self.unique, self.inverse = torch.unique(slots, dim=0, return_inverse=True)  # (U, N), (B,)
        real = self.unique >= 0  # (U, N)
        s = self.unique.clamp_min(0)
        self.cell_index = s[:, :, None] * max_length + s[:, None, :]  # (U, N, N)
        self.cell_mask = real[:, :, None] & real[:, None, :]  # (U, N, N)


class BatchCells:
    """Where the real (i, j) entries of one batch go in the flat L*L slot grid."""

    def __init__(self, layout: SlotLayout):
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
        h = matrices.shape[1]
        flat = matrices.detach().transpose(0, 1).reshape(h, -1)  # (H, B*N*N)
        return flat.index_select(1, self.flat).to(dtype)

    def gather_columns(self, per_token: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
        """(B, H, N) values of the attended token j -> (H, cells)."""
        h = per_token.shape[1]
        return per_token.detach().transpose(0, 1).reshape(h, -1).index_select(1, self.columns).to(dtype)


class SlotAccumulator:
    """Running fp64 sums per (layer, head, slot cell), optional sums of squares, and per-cell counts.

    Args:
        num_layers, num_heads, max_length: the grid.
        device: where the sums live (the model's device).
        squares: also sum squares, for the per-head variance (``result()`` gives ``None`` without them).
    """

    def __init__(self, num_layers: int, num_heads: int, max_length: int, device, squares: bool = True):
        cells = max_length * max_length
        self.max_length = max_length
        self.sums = torch.zeros(num_layers, num_heads, cells, dtype=torch.float64, device=device)
        self.squares = torch.zeros_like(self.sums) if squares else None
        self.counts = torch.zeros(cells, dtype=torch.float64, device=device)
        self.examples = 0
        self.cells: BatchCells | None = None
        self._grouped = None

    @property
    def _cpu(self) -> bool:
        return self.sums.device.type == "cpu"

    def start_batch(self, layout: SlotLayout, cells: BatchCells | None = None) -> BatchCells:
        """Count the batch's cells; precompute where its entries go (shareable between accumulators)."""
        self.cells = cells or BatchCells(layout)
        self.counts.index_add_(0, self.cells.cells, torch.ones_like(self.cells.cells, dtype=torch.float64))
        self.examples += self.cells.batch
        if not self._cpu:
            u, b = layout.unique.shape[0], layout.inverse.shape[0]
            onehot = torch.zeros(u, b, dtype=torch.float64, device=layout.inverse.device)
            onehot[layout.inverse, torch.arange(b, device=onehot.device)] = 1.0  # (U, B)
            masks = layout.cell_mask.reshape(u, -1)  # (U, N*N)
            self._grouped = (onehot, masks, [layout.cell_index[i].reshape(-1)[masks[i]] for i in range(u)])
        return self.cells

    def add(self, layer: int, matrices: torch.Tensor) -> None:
        """Add one layer's (B, H, N, N) matrices of the current batch (padding entries are ignored)."""
        if self._cpu:
            self.add_gathered(layer, self.cells.gather(matrices))
        else:
            self._add_grouped(layer, matrices)

    def add_gathered(self, layer: int, part: torch.Tensor) -> None:
        """Add (H, cells) float64 real entries from :meth:`BatchCells.gather`."""
        if not self._cpu:
            h, c = part.shape[0], self.cells
            dense = torch.zeros(h, c.batch * c.tokens * c.tokens, dtype=part.dtype, device=part.device)
            dense[:, c.flat] = part
            return self._add_grouped(layer, dense.view(h, c.batch, c.tokens, c.tokens).transpose(0, 1))
        self.sums[layer].index_add_(1, self.cells.cells, part)
        if self.squares is not None:
            self.squares[layer].index_add_(1, self.cells.cells, part * part)

    def _add_grouped(self, layer: int, matrices: torch.Tensor) -> None:
        """Race-free path: sum per layout (one-hot product), then scatter each layout's distinct cells."""
        onehot, masks, cells = self._grouped
        b, h = matrices.shape[:2]
        a = matrices.detach().to(torch.float64).reshape(b, -1)  # (B, H*N*N)
        targets = [(self.sums[layer], a)]
        if self.squares is not None:
            targets.append((self.squares[layer], a * a))
        for target, values in targets:
            grouped = (onehot @ values).view(onehot.shape[0], h, -1)  # (U, H, N*N)
            for i, idx in enumerate(cells):
                target.index_add_(1, idx, grouped[i][:, masks[i]])

    def reduce(self) -> None:
        """Sum across processes under torch.distributed."""
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            for t in (self.sums, self.squares, self.counts):
                if t is not None:
                    torch.distributed.all_reduce(t)
            n = torch.tensor([float(self.examples)], dtype=torch.float64, device=self.counts.device)
            torch.distributed.all_reduce(n)
            self.examples = int(n.item())

    def result(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """(mean (layers, heads, L, L) float32, counts (L, L) float64, variance (layers, heads) or None)."""
        length = self.max_length
        mean = torch.where(self.counts > 0, self.sums / self.counts.clamp_min(1.0), torch.zeros_like(self.sums))
        variance = None
        if self.squares is not None:
            # Sum over real entries of (A - C)^2 = sum A^2 - (sum A)^2 / n, per head.
            sq_dev = (self.squares - self.sums * mean).sum(-1)
            variance = (sq_dev / self.counts.sum().clamp_min(1.0)).clamp_min(0.0).cpu()
        layers, heads = mean.shape[:2]
        return mean.view(layers, heads, length, length).float().cpu(), self.counts.view(length, length).cpu(), variance
