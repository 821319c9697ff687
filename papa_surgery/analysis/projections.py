"""Per-head value and output projections: f_h(x) = (x W_V^h + b_V^h) W_O^h, family by family.

The family table (``hub_code/families.py``) names each family's value projection and the output
projection that mixes the heads back into the residual stream, which for BERT-like families lives outside
the self-attention module (``BertSelfOutput.dense``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..hub_code.modeling_papa import attention_modules
from ..models.families import get_family, num_heads_layers
from .linalg import lapack_threads


@dataclass
class HeadProjections:
    """The value/output maps of one layer, split by head (H heads of size d, model width D).

    Attributes:
        w_v: (H, D, d) so that the head's value vector is ``x @ w_v[h] + b_v[h]``.
        b_v: (H, d) value bias.
        w_o: (H, d, D) the head's slice of the output projection (its bias is left out).
        b_o: (D,) the output projection's bias (only used to check reconstructions).
    """

    w_v: torch.Tensor
    b_v: torch.Tensor
    w_o: torch.Tensor
    b_o: torch.Tensor | None

    @property
    def num_heads(self) -> int:
        return self.w_v.shape[0]

    def to(self, dtype: torch.dtype, device=None) -> HeadProjections:
        conv = lambda t: None if t is None else t.to(device=device, dtype=dtype)
        return HeadProjections(conv(self.w_v), conv(self.b_v), conv(self.w_o), conv(self.b_o))

    def values(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) layer input -> (B, N, H, d) per-head value vectors (bias included)."""
        h, d_model, d = self.w_v.shape
        w = self.w_v.transpose(0, 1).reshape(d_model, h * d)  # (D, H*d)
        return (x @ w).view(*x.shape[:-1], h, d) + self.b_v  # (B, N, H, d)

    def transformed(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) layer input -> (B, N, H, D) the vectors f_h(x_j) each head passes on (a permuted view)."""
        v = self.values(x)  # (B, N, H, d)
        b, n, h, d = v.shape
        f = torch.matmul(v.permute(2, 0, 1, 3).reshape(h, b * n, d), self.w_o)  # (H, B*N, D)
        return f.view(h, b, n, -1).permute(1, 2, 0, 3)  # (B, N, H, D)

    def gram(self, x: torch.Tensor, chunk: int = 512) -> torch.Tensor:
        """(B, N, D) -> (B, N, H, H) per-token Gram matrices G_j[h, h'] = <f_h(x_j), f_h'(x_j)>.

        Built ``chunk`` tokens at a time, so the (tokens, H, D) vectors f stay in cache instead of making a
        round trip through memory as one (B, N, H, D) tensor.
        """
        b, n, _ = x.shape
        flat = x.reshape(b * n, -1)
        out = torch.empty(b * n, self.w_v.shape[0], self.w_v.shape[0], dtype=x.dtype, device=x.device)
        for start in range(0, b * n, chunk):
            f = self.transformed(flat[start : start + chunk].unsqueeze(0))[0]  # (chunk, H, D)
            out[start : start + chunk] = f @ f.transpose(-1, -2)
        return out.view(b, n, *out.shape[1:])

    def value_norms(self, x: torch.Tensor) -> torch.Tensor:
        """(B, N, D) -> (B, H, N) ||f_h(x_j)||, without forming f: ||v W_O^h||^2 = v^T (W_O^h W_O^h^T) v."""
        v = self.values(x).transpose(1, 2)  # (B, H, N, d)
        gram = self.w_o @ self.w_o.transpose(1, 2)  # (H, d, d)
        return ((v @ gram) * v).sum(-1).clamp_min(0).sqrt()  # (B, H, N)

    def output_factor(self) -> torch.Tensor:
        """(H, d, d) upper-triangular R_h from the thin QR ``W_O^h^T = Q_h R_h`` (Q_h: (D, d), orthonormal columns).

        ``T = V_h W_O^h = (V_h R_h^T) Q_h^T``, so T's left singular vectors and singular values are those of
        the small (n, d) matrix ``V_h R_h^T``: the SVD never touches the model width D.
        """
        with lapack_threads(self.w_o.device):
            return torch.linalg.qr(self.w_o.transpose(1, 2), mode="reduced").R  # (H, d, d)


def _resolve(root: torch.nn.Module, modules: dict, name: str, path: str) -> torch.nn.Module:
    while path.startswith("../"):
        name = name.rsplit(".", 1)[0] if "." in name else ""
        path = path[3:]
    target = modules[name] if name else root
    for part in path.split("."):
        target = getattr(target, part)
    return target


def output_projection_modules(model) -> list[torch.nn.Module]:
    """The output projection (an ``nn.Linear`` over the concatenated heads) of every layer, in layer order."""
    family = get_family(model)
    path = family.output_projection
    names = {id(m): n for n, m in model.named_modules()}
    modules = dict(model.named_modules())
    return [_resolve(model, modules, names[id(m)], path) for m in attention_modules(model)]


def head_projections(model) -> list[HeadProjections]:
    """Per-layer ``HeadProjections`` of a supported source model (float32 copies of the weights)."""
    family = get_family(model)
    heads, _ = num_heads_layers(model.config)
    out = []
    for attn, proj in zip(attention_modules(model), output_projection_modules(model), strict=True):
        w_o_full = proj.weight.detach().float()  # (D, H*d)
        d_model, width = w_o_full.shape
        d = width // heads
        if family.fused_value_bias is not None:
            w = getattr(attn, family.v).weight.detach().float()  # (3*H*d, D)
            w_rows = w.view(heads, 3, d, -1)[:, 2]  # (H, d, D): each head's value rows
            b_v = getattr(attn, family.fused_value_bias).detach().float().view(heads, d)
        else:
            lin = getattr(attn, family.v)
            w, bias = lin.weight.detach().float(), lin.bias
            bias = bias.detach().float() if bias is not None else torch.zeros(w.shape[0], device=w.device)
            if family.fused_qkv:  # ModernBERT's Wqkv: [Q; K; V] rows, V last
                w, bias = w[2 * heads * d :], bias[2 * heads * d :]
            w_rows, b_v = w.view(-1, d, w.shape[-1]), bias.view(-1, d)  # (H or K, d, D), (H or K, d)
            if w_rows.shape[0] != heads:  # grouped-query attention: each query head reads its group's value head
                w_rows = w_rows.repeat_interleave(heads // w_rows.shape[0], dim=0)  # (H, d, D)
                b_v = b_v.repeat_interleave(heads // b_v.shape[0], dim=0)
        w_v = w_rows.transpose(1, 2).contiguous()  # (H, D, d)
        w_o = w_o_full.T.reshape(heads, d, d_model).contiguous()  # (H, d, D)
        b_o = proj.bias.detach().float() if proj.bias is not None else None
        out.append(HeadProjections(w_v, b_v, w_o, b_o))
    return out
