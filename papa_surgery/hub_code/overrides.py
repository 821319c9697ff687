"""PAPA attention for the families without transformers' attention interface: MPNet, DeBERTa v1, v2/v3.

These families compute the softmax inside their self-attention module and their base models pass no
extra keyword down to it, so their self-attention ``forward`` is overridden (a subclass, never a copy of
the module) and the batch's slot plan (``slot_plan.SlotPlan``) reaches it through :func:`slot_scope`, a context
variable the PAPA model sets for the duration of its own ``forward``. A context variable is per thread and per call, so
concurrent and nested forwards each see their own slots.

Gradient checkpointing recomputes a layer during the backward pass, after the model's ``forward`` has
returned: the checkpointed layers (DeBERTa) therefore take the slots in force when they are called as an
explicit keyword (which the checkpoint stores with the layer's other arguments) and set the scope again
when they are recomputed.

Override classes are built for the checkpoint's own family only, on first use, and bound in this module
(so pickling finds them).

This file ships inside every PAPA checkpoint: it imports only torch, transformers and siblings.
"""

from __future__ import annotations

import contextlib
from contextvars import ContextVar

import torch
from torch import nn

from .compat import relative_position_bias
from .constant_heads import constant_attention
from .heads import PapaHeads, combine_heads, select_heads
from .papa_attention import add_constants
from .shrink import shrink_linear, shrink_projections
from .slot_plan import SlotPlan

_PLAN: ContextVar[SlotPlan | None] = ContextVar("papa_plan", default=None)


@contextlib.contextmanager
def slot_scope(plan: SlotPlan | None):
    """Make ``plan`` the current batch's slot plan for override-family attention."""
    token = _PLAN.set(plan)
    try:
        yield
    finally:
        _PLAN.reset(token)


def current_plan() -> SlotPlan:
    plan = _PLAN.get()
    if plan is None:
        raise ValueError(
            "PAPA constant heads need the batch's slots: call the PAPA model itself (model(...) or "
            "model.forward(...)), not one of its layers"
        )
    return plan


class _OverrideMixin:
    """Head bookkeeping shared by the override families' attention."""

    papa_heads: PapaHeads
    papa_rows: dict

    def _papa_context(self, kept_ctx, value, output_attentions, kept_w):
        """Combine kept (B, Hk, N, d) and constant contexts: (B, N, H*d) and the (B, H, N, N) weights if asked."""
        heads = self.papa_heads
        b, h, n, d = value.shape
        const_ctx = const_p = None
        if heads.const:
            drop = self.dropout.p if self.training else 0.0
            plan = current_plan()  # the constant heads' values are read from every head's, not copied out first
            const_ctx, const_p = constant_attention(self, plan, value, drop, None, output_attentions, heads.const)
        kept_ctx = None if kept_ctx is None else kept_ctx.transpose(1, 2)  # (B, N, Hk, d)
        logits = self.papa_lambda_logits if heads.mixed else None
        ctx = combine_heads(kept_ctx, const_ctx, heads, dim=2, lambda_logits=logits)  # (B, N, H, d)
        ctx = ctx.reshape(b, n, h * d)
        if not output_attentions:
            return ctx, None
        return ctx, combine_heads(kept_w, const_p, heads, dim=1, lambda_logits=logits)  # (B, H, N, N)


def _batch_heads(x: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, N, heads*d) -> (B*heads, N, d): DeBERTa v2's batched-heads layout for ``torch.bmm``."""
    b, n, _ = x.shape
    return x.view(b, n, heads, -1).permute(0, 2, 1, 3).contiguous().view(b * heads, n, -1)


def _score_scale(query: torch.Tensor, scale_factor: int) -> torch.Tensor:
    """sqrt(d * scale_factor) as a float32 scalar tensor, the divisor DeBERTa's scores use (one per position type
    the scores add: content, c2p, p2c)."""
    return torch.sqrt(torch.tensor(query.size(-1), dtype=torch.float) * scale_factor)


class MPNetAttentionMixin(_OverrideMixin):
    """MPNet: softmax in the module with a per-head relative position bias (kept heads' slice)."""

    def papa_setup(self, heads: PapaHeads, max_length: int, dtype: torch.dtype, trainable: bool, compact=None) -> None:
        self.papa_heads, self.papa_rows = heads, {}
        shrink_projections(self, ("q", "k"), heads)
        add_constants(self, heads, max_length, dtype, trainable, compact)

    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
        heads = self.papa_heads
        b, n, _ = hidden_states.shape
        d, h = heads.head_dim, heads.num_heads
        value = self.v(hidden_states).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)
        kept_ctx = kept_w = None
        if heads.kept:
            q = self.q(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            k = self.k(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            scores = torch.matmul(q, k.transpose(-1, -2)) / (d**0.5)  # (B, Hk, N, N)
            if position_bias is not None:
                scores = scores + select_heads(position_bias, heads.kept, h)
            if attention_mask is not None:
                scores = scores + attention_mask
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            v_kept = value if heads.mixed else select_heads(value, heads.kept, h)
            kept_ctx = torch.matmul(kept_w, v_kept)  # (B, Hk, N, d)
        ctx, weights = self._papa_context(kept_ctx, value, output_attentions, kept_w)  # (B, N, H*d)
        out = self.o(ctx)
        return (out, weights) if output_attentions else (out,)


class DebertaV2AttentionMixin(_OverrideMixin):
    """DeBERTa v2/v3: disentangled attention; the parent's bias code runs on the kept heads only."""

    def papa_setup(self, heads: PapaHeads, max_length: int, dtype: torch.dtype, trainable: bool, compact=None) -> None:
        self.papa_heads, self.papa_rows = heads, {}
        shrink_projections(self, ("query_proj", "key_proj", "pos_key_proj", "pos_query_proj"), heads)
        # The parent's methods size their per-head views with num_attention_heads: the kept heads.
        self.num_attention_heads = len(heads.kept)
        add_constants(self, heads, max_length, dtype, trainable, compact)

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        heads = self.papa_heads
        b, n, _ = hidden_states.shape
        d, h, hk = heads.head_dim, heads.num_heads, len(heads.kept)
        value = self.value_proj(hidden_states).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)
        kept_ctx = kept_w = None
        if hk:
            q_in = hidden_states if query_states is None else query_states
            q = _batch_heads(self.query_proj(q_in), hk)  # (B*Hk, N, d)
            k = _batch_heads(self.key_proj(hidden_states), hk)  # (B*Hk, N, d)
            scale_factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
            scale = _score_scale(q, scale_factor)
            scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))  # (B*Hk, N, N)
            if self.relative_attention:
                rel = self.pos_dropout(rel_embeddings)
                scores = scores + relative_position_bias(self, q, k, relative_pos, rel, scale_factor)
            scores = scores.view(-1, hk, n, n)  # (B, Hk, N, N)
            scores = scores.masked_fill(~attention_mask.bool(), torch.finfo(q.dtype).min)
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            v_k = value if heads.mixed else select_heads(value, heads.kept, h)
            kept_ctx = torch.bmm(kept_w.reshape(-1, n, n), v_k.reshape(-1, n, d)).view(b, hk, n, d)
        return self._papa_context(kept_ctx, value, output_attentions, kept_w)


class DebertaAttentionMixin(_OverrideMixin):
    """DeBERTa v1: a fused, per-head interleaved ``in_proj`` (q, k, v rows of head 0, then head 1...).

    Kept heads keep their q/k/v rows in ``in_proj``; constant heads keep only their value rows, in
    ``papa_value_proj``. ``v_bias`` stays for all heads; ``q_bias`` and the positional projections keep
    the kept heads' entries.
    """

    def papa_setup(self, heads: PapaHeads, max_length: int, dtype: torch.dtype, trainable: bool, compact=None) -> None:
        if getattr(self, "head_logits_proj", None) is not None:
            raise ValueError("DeBERTa talking-head attention mixes heads, so single heads cannot be made constant")
        self.papa_heads, self.papa_rows = heads, {}
        self.papa_value_proj = None
        if heads.const and not heads.mixed:
            d = heads.head_dim
            fused = [r for h in heads.kept for r in range(3 * h * d, 3 * (h + 1) * d)]  # q, k, v of kept heads
            values = [r for h in heads.const for r in range(3 * h * d + 2 * d, 3 * (h + 1) * d)]
            self.papa_value_proj = shrink_linear(self.in_proj, values)
            self.papa_rows["papa_value_proj.weight"] = ("in_proj.weight", values)
            self.in_proj = shrink_linear(self.in_proj, fused) if fused else None
            if fused:
                self.papa_rows["in_proj.weight"] = ("in_proj.weight", fused)
            rows = heads.rows(heads.kept)
            self.q_bias = nn.Parameter(self.q_bias.detach()[rows].clone())
            self.papa_rows["q_bias"] = ("q_bias", rows)
            shrink_projections(self, ("pos_proj", "pos_q_proj"), heads)
        self.num_attention_heads = len(heads.kept)
        add_constants(self, heads, max_length, dtype, trainable, compact)

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        if query_states is not None:
            raise NotImplementedError("PAPA DeBERTa attention does not support query_states (z_steps > 1)")
        heads = self.papa_heads
        b, n, _ = hidden_states.shape
        d, h, hk = heads.head_dim, heads.num_heads, len(heads.kept)
        q = k = v_kept = None
        if hk:
            qkv = self.in_proj(hidden_states).view(b, n, hk, 3 * d).permute(0, 2, 1, 3)  # (B, Hk, N, 3d)
            q, k, v_kept = qkv.chunk(3, dim=-1)  # each (B, Hk, N, d)
        if self.papa_value_proj is not None:
            v_const = self.papa_value_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hc, N, d)
            value = combine_heads(v_kept, v_const, heads, dim=1)
        else:
            value = v_kept  # every head has its q/k/v in in_proj (no constants, or lambda mixing)
        value = value + self.v_bias.view(1, h, 1, d)  # (B, H, N, d)

        kept_ctx = kept_w = None
        if hk:
            q = q + self.q_bias.view(1, 1, hk, d).permute(0, 2, 1, 3)  # (1, Hk, 1, d) bias of the kept heads
            scale_factor = 1 + len(self.pos_att_type)
            q = q / _score_scale(q, scale_factor).to(dtype=q.dtype)
            scores = torch.matmul(q, k.transpose(-1, -2))  # (B, Hk, N, N)
            if self.relative_attention and rel_embeddings is not None and relative_pos is not None:
                rel = self.pos_dropout(rel_embeddings)
                scores = scores + relative_position_bias(self, q, k, relative_pos, rel, scale_factor)
            scores = scores.masked_fill(~attention_mask.bool(), torch.finfo(q.dtype).min)
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            v_k = value if heads.mixed else select_heads(value, heads.kept, h)
            kept_ctx = torch.matmul(kept_w, v_k)  # (B, Hk, N, d)
        return self._papa_context(kept_ctx, value, output_attentions, kept_w)


class SlotScopedLayerMixin:
    """A checkpointed layer that carries the slots in force at call time into its (re)computation."""

    def __call__(self, *args, **kwargs):
        kwargs.setdefault("papa_plan", _PLAN.get())
        return super().__call__(*args, **kwargs)

    def forward(self, *args, papa_plan=None, **kwargs):
        with slot_scope(papa_plan):
            return super().forward(*args, **kwargs)


_MIXINS = {"mpnet": MPNetAttentionMixin, "deberta": DebertaAttentionMixin, "deberta-v2": DebertaV2AttentionMixin}


def _build(name: str, mixin: type, family, parent_name: str) -> type:
    if name not in globals():
        parent = getattr(family.transformers_module(), parent_name)
        globals()[name] = type(name, (mixin, parent), {"__module__": __name__})
    return globals()[name]


def attention_class(family) -> type:
    """``Papa<Family>SelfAttention(<Style>Mixin, <Family's self-attention>)``, built on first use."""
    return _build(f"Papa{family.prefix}SelfAttention", _MIXINS[family.style], family, family.attention_class)


def layer_class(family) -> type | None:
    """``Papa<Family>Layer``: the family's checkpointed layer carrying the slots, or ``None`` if it has none."""
    if family.layer_class is None:
        return None
    return _build(f"Papa{family.prefix}Layer", SlotScopedLayerMixin, family, family.layer_class)


def __getattr__(name: str):
    # Unpickling a model looks its classes up by name: build them on demand.
    from .families import FAMILIES

    for family in FAMILIES.values():
        if family.style in _MIXINS:
            if name == f"Papa{family.prefix}SelfAttention":
                return attention_class(family)
            if family.layer_class is not None and name == f"Papa{family.prefix}Layer":
                return layer_class(family)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
