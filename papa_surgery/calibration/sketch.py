"""The residual's rank-r factors from a single-pass sketch (Tropp, Yurtsever, Udell, Cevher 2017, Alg. 7).

Given Y = M Omega (L, k) and W = Psi M (l, L) of the far-masked residual M, ``Q = orth(Y)``,
``X = (Psi Q)^+ W`` and ``M ~ Q X``; the rank-r truncated SVD of ``Q X`` gives ``u = U_r S_r^1/2`` and
``v = V_r S_r^1/2``, as :func:`papa_surgery.calibration.compaction.compact_parts` splits its SVD. With k, l >= L
the reconstruction is exact (the tests check this against ``compact_parts``).

``compact_parts`` does not fit the far-masked residual alone: it runs a few rounds of low-rank matrix completion,
refitting ``where(far, M, u v^T)``. The sketches are linear, so the same rounds run here: the non-far cells of
``u v^T`` (band and special rows/columns: O(L (2w+1+S)) values) are sketched with the same Omega and Psi and added
to Y and W, ``sketch(where(far, M, N)) = sketch(M) + sketch((1 - far) * N)``.
"""

from __future__ import annotations

import torch

from ..hub_code.compact_constants import CompactLayout


def _nonfar_sketch(u, v, layout: CompactLayout, omega, psi):
    """(N Omega (H, L, k), Psi N (H, l, L)) for N = (1 - far) * (u v^T), without forming N."""
    length, w = layout.max_length, layout.band
    special = torch.zeros(length, dtype=torch.bool)
    special[list(layout.special)] = True
    index = torch.tensor(layout.special)
    i = torch.arange(length)
    # The band's body cells as diagonals: values[h, i, t] = (u v^T)[i, i + t - w] where both ends are body slots.
    t = torch.arange(-w, w + 1)
    j = i[:, None] + t[None, :]  # (L, 2w+1)
    keep = (j >= 0) & (j < length) & ~special[:, None] & ~special[j.clamp(0, length - 1)]
    jc = j.clamp(0, length - 1)
    values = torch.einsum("hir,hitr->hit", u, v[:, jc]) * keep  # (H, L, 2w+1)
    y = torch.einsum("hit,itc->hic", values, omega[jc])  # (H, L, k): sum_t N[i, i+t] Omega[i+t]
    # Psi N: column j gets N[j - t', j] Psi[:, j - t'], i.e. row i = j - t' of the diagonal t'.
    i_of = i[:, None] - t[None, :]  # (L, 2w+1): the row i of column j on diagonal t
    inside = (i_of >= 0) & (i_of < length)
    ic = i_of.clamp(0, length - 1)
    by_column = values[:, ic, torch.arange(2 * w + 1)[None, :]] * inside  # (H, L, 2w+1): N[j - t, j]
    x = torch.einsum("hjt,cjt->hcj", by_column, psi[:, ic])  # (H, l, L)
    rows = u[:, index] @ v.transpose(-1, -2)  # (H, S, L) special rows, every column
    y[:, index] += rows @ omega
    x += psi[:, index] @ rows
    body = ~special
    cols = u[:, body] @ v[:, index].transpose(-1, -2)  # (H, body, S) special columns, body rows
    y[:, body] += cols @ omega[index]
    x[:, :, index] += psi[:, body] @ cols
    return y, x


def _factors(y, w, psi, rank: int):
    q = torch.linalg.qr(y).Q  # (H, L, k')
    x = torch.linalg.lstsq(psi @ q, w).solution  # (H, k', L)
    left, s, right = torch.linalg.svd(x, full_matrices=False)
    root = s[:, :rank].sqrt()
    u = (q @ left[..., :rank]) * root[:, None]  # (H, L, r)
    v = right[:, :rank].transpose(-1, -2) * root[:, None]  # (H, L, r)
    return u, v


def low_rank(y, w, omega, psi, layout: CompactLayout, rounds: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(u, v) (H, L, r) float64: the completion rounds of ``compact_parts`` on the sketched residual."""
    hc, length, rank = y.shape[0], layout.max_length, layout.rank
    u = torch.zeros(hc, length, rank, dtype=torch.float64)
    v = torch.zeros_like(u)
    if rank == 0:
        return u, v
    y_t, w_t = y, w
    for _ in range(rounds):
        u, v = _factors(y_t, w_t, psi, rank)
        extra_y, extra_w = _nonfar_sketch(u, v, layout, omega, psi)
        y_t, w_t = y + extra_y, w + extra_w
    return u, v
