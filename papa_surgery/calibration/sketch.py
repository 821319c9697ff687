"""The residual's rank-r factors from a two-pass randomized range finder (Halko, Martinsson, Tropp 2011, Alg. 4.1
and 5.1).

The first calibration pass streams the range sketch Y = M Omega (L, k) of the far-masked residual M; its
orthonormal basis Q = orth(Y) (L, k) is fixed between the passes; the second pass streams B = Q^T M (k, L) exactly.
Then M ~ Q B, and the SVD of the small B gives the rank-r factors ``u = Q U_r S_r^1/2`` and ``v = V_r S_r^1/2``, as
:func:`papa_surgery.calibration.compaction.compact_parts` splits its SVD. The error is the part of M outside Q's
span, which for k >= r + 2 is close to the best rank-r tail; with k >= L it is exact (the tests check this against
``compact_parts``). A single-pass sketch (Tropp et al. 2017), tried first, reconstructs B from a second random sketch
by least squares instead: on real attention its error gave some heads rows summing below zero, so NaN outputs.

``compact_parts`` does not fit the far-masked residual alone: it runs a few rounds of low-rank matrix completion,
refitting ``where(far, M, u v^T)``. The same rounds run here inside Q's span: ``Q^T where(far, M, N) = B +
Q^T ((1 - far) * N)``, and the non-far cells of ``u v^T`` (band and special rows/columns: O(L (2w+1+S)) values) are
known, so their projection costs O(L (2w+1+S) k) per head.
"""

from __future__ import annotations

import torch

from ..hub_code.compact_constants import CompactLayout


def _nonfar_projection(u, v, layout: CompactLayout, q) -> torch.Tensor:
    """(H, k, L) ``Q^T N`` for N = (1 - far) * (u v^T) (u, v (H, L, r); q (H, L, k)), without forming N."""
    length, w = layout.max_length, layout.band
    special = torch.zeros(length, dtype=torch.bool)
    special[list(layout.special)] = True
    index = torch.tensor(layout.special)
    body = ~special
    out = torch.zeros(q.shape[0], q.shape[-1], length, dtype=q.dtype)  # (H, k, L)
    j = torch.arange(length)
    # The band's body cells, one diagonal at a time: column j gets N[j - t, j] Q[j - t] for both ends body slots.
    for t in range(-w, w + 1):
        i = j - t
        keep = (i >= 0) & (i < length) & body & body[i.clamp(0, length - 1)]  # (L,)
        ic = i.clamp(0, length - 1)
        values = (u[:, ic] * v).sum(-1) * keep  # (H, L): N[j - t, j]
        out += q[:, ic].transpose(-1, -2) * values[:, None, :]  # (H, k, L)
    rows = u[:, index] @ v.transpose(-1, -2)  # (H, S, L) special rows, every column
    out += q[:, index].transpose(-1, -2) @ rows
    cols = u[:, body] @ v[:, index].transpose(-1, -2)  # (H, body, S) special columns, body rows
    out[:, :, index] += q[:, body].transpose(-1, -2) @ cols
    return out


def range_basis(y: torch.Tensor) -> torch.Tensor:
    """(H, L, k) an orthonormal basis of the range sketch ``y`` (H, L, k)."""
    return torch.linalg.qr(y).Q


def low_rank(q, b, layout: CompactLayout, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, v) (H, L, r) float64: the completion rounds of ``compact_parts`` on M ~ Q B (``q`` (H, L, k), ``b`` = Q^T M
    (H, k, L))."""
    hc, length, rank = q.shape[0], layout.max_length, layout.rank
    u = torch.zeros(hc, length, rank, dtype=torch.float64)
    v = torch.zeros_like(u)
    if rank == 0:
        return u, v
    target = b
    for _ in range(rounds):
        left, s, right = torch.linalg.svd(target, full_matrices=False)  # (H, k, k'), (H, k'), (H, k', L)
        root = s[:, :rank].sqrt()
        u = (q @ left[..., :rank]) * root[:, None]  # (H, L, r)
        v = right[:, :rank].transpose(-1, -2) * root[:, None]  # (H, L, r)
        target = b + _nonfar_projection(u, v, layout, q)
    return u, v
