"""Effective attention (Brunner et al. 2020; Sun & Marasovic 2021): the part of A that reaches the output.

For head h, the output is A T with T = X W_V^h W_O^h (n, D), of rank <= head size d. Any component of
a row of A in the left null space of T is lost, so A = A U U^T + A (I - U U^T) with U an orthonormal
basis of T's column space, and only the effective attention A U U^T matters: (A U U^T) T = A T.

By default T includes the value bias, T = (X W_V^h + b_V^h) W_O^h: the exact vectors the head passes on
(the same f_h as the norm analysis), so the identity holds for the head's real output. ``value_bias=False``
gives the bias-free T of the papers. U comes from a thin SVD in float64 over the example's real tokens
only, with a rank tolerance relative to the largest singular value. The SVD runs on the (n, d) matrix
V_h R_h^T (W_O^h^T = Q_h R_h), which has the same left singular vectors and values as T.
"""

from __future__ import annotations

import torch

from .capture import needs_output_attentions, recording
from .linalg import lapack_threads
from .projections import head_projections

DEFAULT_RTOL = 1e-6


def column_basis(t: torch.Tensor, real: torch.Tensor | None = None, rtol: float = DEFAULT_RTOL):
    """Orthonormal basis of the column space of ``t`` over real rows.

    Args:
        t: (..., N, k) matrices (T itself, or any matrix with T's left singular vectors and values).
        real: (..., N) bool real-token mask broadcastable to t's rows, or ``None``.
        rtol: singular values at or below ``rtol`` times the largest count as zero.

    Returns:
        (U (..., N, min(N, k)) float64 with the dropped directions zeroed, rank (...,) long).
    """
    t = t.to(torch.float64)
    if real is not None:
        t = t * real[..., :, None].to(t.dtype)
    with lapack_threads(t.device):
        u, s, _ = torch.linalg.svd(t, full_matrices=False)  # (..., N, r), (..., r)
    keep = s > rtol * s[..., :1]  # (..., r)
    return u * keep[..., None, :].to(u.dtype), keep.sum(-1)


def effective_attention(
    probs: torch.Tensor, t: torch.Tensor, real: torch.Tensor | None = None, rtol: float = DEFAULT_RTOL
) -> tuple[torch.Tensor, torch.Tensor]:
    """Effective attention A U U^T, float64.

    Args:
        probs: (..., N, N) attention probabilities A.
        t: (..., N, k) the value transform T (or a matrix with the same column space and singular values).
        real: (..., N) real-token mask: padding is left out of T and its rows and columns are zero.
        rtol: relative rank tolerance.

    Returns:
        (effective (..., N, N) float64, rank (...,)).
    """
    u, rank = column_basis(t, real, rtol)  # (..., N, r)
    a = probs.to(torch.float64)
    eff = (a @ u) @ u.transpose(-1, -2)  # (..., N, N)
    if real is not None:
        eff = eff * real[..., :, None].to(eff.dtype)
    return eff, rank


def layer_effective(probs, x, proj, real=None, rtol: float = DEFAULT_RTOL, value_bias: bool = True, factor=None):
    """One layer's effective attention from its input x (B, N, D) and ``HeadProjections``.

    Returns (effective (B, H, N, N) float64, rank (B, H)).
    """
    proj = proj.to(torch.float64, x.device)
    v = proj.values(x.to(torch.float64))  # (B, N, H, d)
    if not value_bias:
        v = v - proj.b_v
    r = proj.output_factor() if factor is None else factor  # (H, d, d)
    z = v.transpose(1, 2) @ r.transpose(-1, -2)  # (B, H, N, d) = V_h R_h^T
    mask = None if real is None else real[:, None, :].expand(-1, z.shape[1], -1)  # (B, H, N)
    return effective_attention(probs, z, mask, rtol)


@torch.no_grad()
def effective_attentions(
    model, inputs: dict, rtol: float = DEFAULT_RTOL, value_bias: bool = True
) -> list[dict[str, torch.Tensor]]:
    """Per layer: ``probs`` (B, H, N, N), ``effective`` (B, H, N, N) float64, ``rank`` (B, H), ``x`` (B, N, D)."""
    projections = head_projections(model)
    real = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
    out: list[dict[str, torch.Tensor]] = []

    def collect(layer, x, probs):
        eff, rank = layer_effective(probs, x, projections[layer], real, rtol, value_bias)
        out.append({"probs": probs.detach(), "effective": eff, "rank": rank, "x": x.detach()})

    with recording(model, collect):
        model(**inputs, output_attentions=needs_output_attentions(model))
    return out
