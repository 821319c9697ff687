"""Which heads of a layer stay input-dependent and which are constant, and how their outputs recombine.

This file ships inside every PAPA checkpoint: it imports only torch and the standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class PapaHeads:
    """Which heads of one layer keep query/key attention and which use a constant matrix.

    Attributes:
        layer: the layer index.
        num_heads: heads of the layer (H).
        head_dim: d.
        kept: heads that keep their query/key (sorted).
        const: heads with a constant matrix (sorted). A head in both sets mixes them (lambda training).
    """

    layer: int
    num_heads: int
    head_dim: int
    kept: tuple[int, ...]
    const: tuple[int, ...]
    # Derived once here, read on every forward.
    mixed: bool = field(init=False)  # lambda training: every head is kept and constant
    order: tuple[int, ...] | None = field(init=False)  # puts cat([kept, const]) back in head order (None: in order)

    def __post_init__(self):
        object.__setattr__(self, "mixed", bool(set(self.kept) & set(self.const)))
        position = {h: i for i, h in enumerate((*self.kept, *self.const))}
        order = tuple(position[h] for h in range(self.num_heads))
        object.__setattr__(self, "order", None if order == tuple(range(self.num_heads)) else order)

    @classmethod
    def build(cls, layer, num_heads, head_dim, constant_heads, kept_heads=None) -> PapaHeads:
        const = tuple(sorted({int(h) for h in constant_heads}))
        if kept_heads is None:
            kept_heads = [h for h in range(num_heads) if h not in const]
        kept = tuple(sorted({int(h) for h in kept_heads}))
        bad = [h for h in (*const, *kept) if not 0 <= h < num_heads]
        if bad:
            raise ValueError(f"layer {layer} has {num_heads} heads; no head {bad[0]}")
        heads = cls(int(layer), int(num_heads), int(head_dim), kept, const)
        if heads.mixed and not kept == const == tuple(range(num_heads)):
            raise ValueError(
                f"layer {layer}: lambda mixing needs every head both kept and constant, got kept {list(kept)} "
                f"and constant {list(const)}"
            )
        return heads

    def rows(self, heads: Sequence[int]) -> list[int]:
        """Rows of a (H*d, ...) per-head projection that belong to ``heads``."""
        d = self.head_dim
        return [r for h in heads for r in range(h * d, (h + 1) * d)]


def select_heads(x: torch.Tensor, heads: Sequence[int], num_heads: int, dim: int = 1) -> torch.Tensor:
    """Heads ``heads`` of a tensor with ``num_heads`` heads along ``dim``; a slice when they are contiguous."""
    heads = list(heads)
    if heads == list(range(num_heads)):
        return x
    if heads == list(range(heads[0], heads[-1] + 1)):
        return x.narrow(dim, heads[0], len(heads))
    return x.index_select(dim, torch.tensor(heads, device=x.device))


def combine_heads(
    kept: torch.Tensor | None,
    const: torch.Tensor | None,
    heads: PapaHeads,
    dim: int,
    lambda_logits: torch.Tensor | None = None,
) -> torch.Tensor | None:
    """Kept and constant heads' tensors (heads along ``dim``) as one tensor of every head.

    Normally the two sets are disjoint and are put back in head order. In lambda training every head is in
    both and the result is ``lambda * kept + (1 - lambda) * const`` per head, ``lambda = sigmoid(logits)``.
    """
    if kept is None or const is None:
        return const if kept is None else kept
    const = const.to(kept.dtype)
    if heads.mixed:
        shape = [1] * kept.dim()
        shape[dim] = heads.num_heads
        lam = torch.sigmoid(lambda_logits).to(kept.dtype).view(shape)  # 1 everywhere but the head dim
        return lam * kept + (1 - lam) * const
    merged = torch.cat([kept, const], dim=dim)
    order = heads.order
    return merged if order is None else merged.index_select(dim, torch.tensor(order, device=merged.device))
