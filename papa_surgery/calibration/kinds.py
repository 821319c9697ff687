"""Data-free kinds (paper 5.2) as what they are: a function of the offset j - i alone (a Toeplitz matrix).

``identity`` is 1 on the diagonal, ``toeplitz`` 1 / (1 + |i - j|) (harmonic), ``uniform`` 1 everywhere, ``zeros`` 0.
So a kind's compact parts (``hub_code/compact_constants.py``) are exact with no residual: the profile is the kind's
function of the offset, and the band and the special slots' rows and columns are that function read at their cells.
Both storages build their data-free constants from here (``Constants.from_kind``, ``StructuredConstants.from_kind``).
"""

from __future__ import annotations

import torch

from .. import registry


def offset_profile(kind: str, max_length: int) -> torch.Tensor:
    """(2L-1,) float32 the kind's weight at every offset d = j - i, from -(L-1) (index 0) to L-1."""
    d = torch.arange(-(max_length - 1), max_length)
    if kind == "identity":
        return (d == 0).float()
    if kind == "toeplitz":
        return 1.0 / (1.0 + d.abs().float())
    if kind == "zeros":
        return torch.zeros(d.shape)
    if kind == "uniform":
        return torch.ones(d.shape)
    chosen = registry.kind(kind)  # an unknown name: the registry's error, with a suggestion
    raise ValueError(
        f"{kind!r} constants are not data-free ({chosen.summary}); data-free kinds: "
        f"{', '.join(registry.DATA_FREE_KINDS)}"
    )


def offset_parts(profile: torch.Tensor, layout) -> dict[str, torch.Tensor]:
    """The compact parts ``{name: (1, ...)}`` of the Toeplitz matrix C[i, j] = profile[j - i + L - 1], exactly."""
    length, w = layout.max_length, layout.band
    idx = torch.arange(length)
    special = torch.tensor(layout.special)
    cols = idx[:, None] + torch.arange(-w, w + 1)[None, :]  # (L, 2w+1) the band's columns
    inside = (cols >= 0) & (cols < length)
    at = lambda i, j: profile[j - i + length - 1]  # noqa: E731  the value of cells (i, j)
    parts = {
        "papa_constants_band": torch.where(inside, at(idx[:, None], cols.clamp(0, length - 1)), 0.0),
        "papa_constants_rows": at(special[:, None], idx[None, :]),  # (S, L)
        "papa_constants_cols": at(idx[:, None], special[None, :]),  # (L, S)
        "papa_constants_profile": profile,
        "papa_constants_u": torch.zeros(length, layout.rank),
        "papa_constants_v": torch.zeros(length, layout.rank),
    }
    return {name: t[None].float() for name, t in parts.items()}
