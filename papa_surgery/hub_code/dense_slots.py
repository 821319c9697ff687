"""``C_S`` as a dense (Hc, S, S) matrix, and the band masks a local layer's window uses on it.

The interface every form of a batch's compressed constants offers (``product``, ``band_product``, ``cells``;
``structured_constants.py`` has the structured forms), over a materialised matrix: dense constants sliced per batch,
compact constants up to L = 512 (a dense rebuild kept per module), a ``C_S`` built from compact parts below the
crossovers, and traced graphs.

This file ships inside every PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

import functools

import torch

from .slots import is_tracing


class DenseSlots:
    """``C_S`` as a dense (Hc, S, S) matrix."""

    def __init__(self, matrix: torch.Tensor):
        self.matrix = matrix  # (Hc, S, S)

    def product(self, x: torch.Tensor) -> torch.Tensor:
        """(Hc, S, C) ``C_S x`` for x (Hc, S, C)."""
        return torch.bmm(self.matrix, x.to(self.matrix.dtype))

    def band_product(self, x: torch.Tensor, width: int, owned: bool = False) -> torch.Tensor:
        """(Hc, S, C) the product with ``C_S`` kept only where 1 <= i, j and |i - j| <= ``width`` (``owned``: the
        matrix is a temporary of the caller's, masked in place)."""
        band = _band_mask(self.matrix.shape[-1], width, x.device)  # (S, S)
        masked = self.matrix.mul_(band) if owned else self.matrix * band
        return torch.bmm(masked, x.to(self.matrix.dtype))

    def cells(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(Hc, ..., R, C') cells at compressed rows (..., R) x columns (..., C')."""
        return self.matrix[:, rows[..., :, None], cols[..., None, :]]


def _band_mask(size: int, width: int, device) -> torch.Tensor:
    """(S, S) where 1 <= i, j and |i - j| <= ``width``; the last few kept (every local layer of a forward asks for the
    same one), except in a traced graph, which builds its own (its size may be symbolic)."""
    return _band(size, width, device) if is_tracing() else _kept_band(size, width, str(device))


@functools.lru_cache(maxsize=8)
def _kept_band(size: int, width: int, device: str) -> torch.Tensor:
    with torch.inference_mode(False):  # a kept mask must serve later forwards with autograd on too
        return _band(size, width, device)


def _band(size: int, width: int, device) -> torch.Tensor:
    idx = torch.arange(size, device=device)
    return ((idx[:, None] - idx[None, :]).abs() <= width) & (idx[:, None] > 0) & (idx[None, :] > 0)
