"""Shrinking a layer's query/key projections to its kept heads (plain, fused ``[Q; K; V]`` and grouped-query).

The module docstring of ``papa_attention.py`` says what each shape needs and why. This file ships inside every
PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn

from .heads import PapaHeads


def no_heads(hidden_states: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Stand-in query/key projection of a layer with no kept head: one zero head, no weights, no compute.

    The family's forward still reshapes ``self.query(x)`` into heads; the PAPA attention function never
    reads the result. The zeros are a stride-0 view of a scalar, so nothing is allocated.
    """
    return hidden_states.new_zeros(()).expand(*hidden_states.shape[:-1], head_dim)


class PapaFusedQKV(nn.Module):
    """A fused ``[Q; K; V]`` projection that computes only the kept heads' Q/K rows (and every V row).

    Its output is the three blocks ``(q, k, v)``, (..., Hk d), (..., Hk d) and (..., H d): the layer's PAPA forward
    (``papa_attention.PapaFusedAttentionMixin``) rotates and attends with the kept heads' Q/K only.
    """

    def __init__(self, linear: nn.Linear, heads: PapaHeads):
        super().__init__()
        h, d = heads.num_heads, heads.head_dim
        kept = heads.rows(heads.kept)
        rows = [*kept, *(h * d + r for r in kept), *range(2 * h * d, 3 * h * d)]
        self.rows = rows
        self.kept_width = len(kept)  # Hk * d
        self.proj = shrink_linear(linear, rows)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y = self.proj(hidden_states)  # (..., (2 Hk + H) d)
        return y.split([self.kept_width, self.kept_width, y.shape[-1] - 2 * self.kept_width], dim=-1)


def shrink_linear(linear: nn.Linear, rows: list[int]) -> nn.Linear:
    """A Linear with only ``rows`` of ``linear``'s outputs (weights copied; none drawn from the RNG)."""
    new = torch.nn.utils.skip_init(
        nn.Linear,
        linear.in_features,
        len(rows),
        bias=linear.bias is not None,
        device=linear.weight.device,
        dtype=linear.weight.dtype,
    )
    if linear.weight.device.type != "meta":
        with torch.no_grad():
            new.weight.copy_(linear.weight[rows])
            if linear.bias is not None:
                new.bias.copy_(linear.bias[rows])
    return new


def shrink_projections(module: nn.Module, names: Sequence[str], heads: PapaHeads, stand_in=None) -> None:
    """Keep only the kept heads' rows of each per-head projection in ``names``, in place.

    Absent projections (``None``) are skipped; with no kept head a projection becomes ``stand_in``. Which
    source rows each shrunk weight keeps is recorded in ``module.papa_rows`` (``convert`` builds the
    checkpoint's state dict from it). Nothing changes without constant heads, or in lambda training.
    """
    if not heads.const or heads.mixed:
        return
    for name in names:
        shrink_rows(module, name, heads.rows(heads.kept), stand_in)


def shrink_rows(module: nn.Module, name: str, rows: list[int], stand_in=None) -> None:
    """Keep only ``rows`` of the projection ``module.<name>`` (``stand_in`` when none), recorded in ``papa_rows``."""
    linear = getattr(module, name, None)
    if linear is None:
        return
    delattr(module, name)
    setattr(module, name, shrink_linear(linear, rows) if rows else stand_in)
    if rows:
        _record_rows(module, name, name, rows, linear.bias is not None)


def _record_rows(module: nn.Module, local: str, source: str, rows: list[int], bias: bool) -> None:
    """Record in ``papa_rows`` that Linear ``local``'s weight (and bias) keep ``rows`` of the source's ``source``
    (``convert`` builds the checkpoint's state dict from it)."""
    for part in ("weight", "bias") if bias else ("weight",):
        module.papa_rows[f"{local}.{part}"] = (f"{source}.{part}", rows)


def shrink_fused(module: nn.Module, name: str, heads: PapaHeads) -> bool:
    """Replace a fused ``[Q; K; V]`` projection by :class:`PapaFusedQKV` when the layer has constant heads.

    Returns whether it did (the layer then needs the PAPA forward that reads the three blocks).
    """
    if not heads.const or heads.mixed:
        return False
    fused = PapaFusedQKV(getattr(module, name), heads)
    setattr(module, name, fused)
    _record_rows(module, f"{name}.proj", name, fused.rows, fused.proj.bias is not None)
    return True


def shrink_grouped(module: nn.Module, family, heads: PapaHeads) -> None:
    """Grouped-query attention: shrink Q to the kept heads and K to the key heads a kept head reads.

    ``papa_kv`` maps every query head to its value head, ``papa_key`` every kept head to its row in the
    shrunk keys; with them the attention function runs the kept heads as multi-head attention
    (``num_key_value_groups`` 1), since the kept heads of a group need not be a whole group.
    """
    if not heads.const or heads.mixed:
        return
    groups = heads.num_heads // int(getattr(module.config, family.kv_heads_attr))
    kept_kv = sorted({h // groups for h in heads.kept})
    module.papa_kv = tuple(h // groups for h in range(heads.num_heads))
    module.papa_key = tuple(kept_kv.index(h // groups) for h in heads.kept)
    module.num_key_value_groups = 1
    stand_in = functools.partial(no_heads, head_dim=heads.head_dim)
    shrink_projections(module, (family.q,), heads, stand_in)
    if len(kept_kv) < heads.num_heads // groups:
        shrink_rows(module, family.k, heads.rows(kept_kv), stand_in)
