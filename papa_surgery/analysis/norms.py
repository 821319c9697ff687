"""Norm-based analysis (Kobayashi et al. 2020): how much each token j really contributes to token i.

For head h, f_h(x) = (x W_V^h + b_V^h) W_O^h (value bias in, output bias out); token j's contribution
to token i is ||alpha^h_ij f_h(x_j)|| = alpha^h_ij ||f_h(x_j)|| (alpha >= 0), and the layer-level
contribution is ||sum_h alpha^h_ij f_h(x_j)||. The head sum never materialises a (B, H, N, N, D)
tensor: with the per-token Gram matrix G_j[h, h'] = <f_h(x_j), f_h'(x_j)>,
||sum_h a_h f_h(x_j)||^2 = a^T G_j a.
"""

from __future__ import annotations

import torch

from .capture import needs_output_attentions, recording
from .projections import head_projections


def _mask(t: torch.Tensor, real: torch.Tensor | None) -> torch.Tensor:
    """Zero the rows and columns of padding tokens: t (B, [H,] N, N), real (B, N) bool."""
    if real is None:
        return t
    m = real[:, :, None] & real[:, None, :]  # (B, N, N)
    return t * (m[:, None] if t.dim() == 4 else m).to(t.dtype)


def value_norms(f: torch.Tensor) -> torch.Tensor:
    """(B, N, H, D) transformed vectors -> (B, H, N) norms ||f_h(x_j)||."""
    return torch.linalg.vector_norm(f, dim=-1).transpose(1, 2)  # (B, H, N)


def norm_weighted(probs: torch.Tensor, norms: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """(B, H, N, N) per-head contributions ||alpha_ij f_h(x_j)|| = alpha_ij ||f_h(x_j)||."""
    return _mask(probs * norms[:, :, None, :], real)  # (B, H, N, N)


def summed_norms(probs: torch.Tensor, gram: torch.Tensor, real: torch.Tensor | None = None) -> torch.Tensor:
    """(B, N, N) layer-level contributions ||sum_h alpha^h_ij f_h(x_j)||, via per-token Gram matrices.

    Args:
        probs: (B, H, N, N) attention probabilities.
        gram: (B, N, H, H) Gram matrices G_j[h, h'] = <f_h(x_j), f_h'(x_j)> (``f @ f.transpose(-1, -2)`` of the
            (B, N, H, D) vectors, or ``HeadProjections.gram``).
        real: (B, N) real-token mask, or ``None``.
    """
    b, n, h, _ = gram.shape
    a = probs.to(gram.dtype).permute(0, 3, 1, 2).reshape(b * n, h, -1)  # (B*N_j, H, N_i): column j of every head
    sq = (torch.bmm(gram.reshape(b * n, h, h), a) * a).sum(1).view(b, n, -1)  # (B, N_j, N_i): a^T G_j a
    return _mask(sq.clamp_min(0).sqrt().transpose(1, 2), real)  # (B, N_i, N_j)


@torch.no_grad()
def attention_norms(model, inputs: dict, dtype: torch.dtype = torch.float64) -> list[dict[str, torch.Tensor]]:
    """Per layer: ``probs`` (B, H, N, N), ``weighted`` (B, H, N, N) ||alpha f||, ``summed`` (B, N, N).

    ``inputs`` are keyword arguments of ``model`` (an encoded batch). Padding rows/columns are zero.
    """
    projections = head_projections(model)
    real = inputs["attention_mask"].bool() if "attention_mask" in inputs else None
    out: list[dict[str, torch.Tensor]] = []

    def collect(layer, x, probs):
        proj = projections[layer].to(dtype, x.device)
        f = proj.transformed(x.to(dtype))  # (B, N, H, D)
        p = probs.to(dtype)
        out.append(
            {
                "probs": _mask(p, real),
                "weighted": norm_weighted(p, value_norms(f), real),
                "summed": summed_norms(p, f @ f.transpose(-1, -2), real),
            }
        )

    with recording(model, collect):
        model(**inputs, output_attentions=needs_output_attentions(model))
    return out
