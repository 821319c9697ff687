"""PAPA self-attention: constant heads beside the model's own attention.

Each supported self-attention class is subclassed (never copied): :func:`papa_attention_class` makes
``Papa<Family>SelfAttention(<Style>Mixin, <Family>SelfAttention)`` and :func:`convert_module` switches
an existing module to it in place, keeping every attribute the parent set up.

Per layer, heads fall in two sets:

- kept heads keep their query/key projections and run the family's own attention (the
  ``ALL_ATTENTION_FUNCTIONS`` interface for BERT-like families, the in-module softmax for DeBERTa and
  MPNet) on their slice of the heads;
- constant heads have no query/key weights; they output ``rownorm(C[slots] * mask) @ V``.

A head in both sets (only during lambda training, never in a checkpoint) mixes the two outputs:
``lambda * attn + (1 - lambda) * const`` with ``lambda = sigmoid(papa_lambda_logits)``, which equals
attending with ``B = lambda * A + (1 - lambda) * rownorm(C * mask)`` (paper section 3.2).

This file ships inside every PAPA checkpoint: it imports only torch, transformers and siblings.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from .slots import SlotLayout


def _uninitialised_linear(in_features: int, out_features: int, bias: bool, like: torch.Tensor) -> nn.Linear:
    """A Linear whose weights are about to be copied in: no init, so no draw from the global RNG."""
    return torch.nn.utils.skip_init(
        nn.Linear, in_features, out_features, bias=bias, device=like.device, dtype=like.dtype
    )


class PapaContext:
    """Per-forward state shared by every PAPA attention of one model (set by the model's pre-hook)."""

    def __init__(self):
        self.layout: SlotLayout | None = None
        self.output_attentions: bool = False


class PapaHeadsMixin:
    """Head bookkeeping, constants and the constant/mix path shared by every attention style."""

    papa_layer: int
    papa_num_heads: int
    papa_head_dim: int
    papa_kept: list[int]
    papa_const: list[int]

    def _papa_init(
        self,
        layer: int,
        num_heads: int,
        head_dim: int,
        constant_heads: Sequence[int],
        kept_heads: Sequence[int] | None,
        max_length: int,
        constants_dtype: torch.dtype,
        trainable: bool,
        context: PapaContext,
    ) -> None:
        self.papa_layer = layer
        self.papa_num_heads = num_heads
        self.papa_head_dim = head_dim
        self.papa_const = sorted(set(constant_heads))
        if kept_heads is None:
            kept_heads = [h for h in range(num_heads) if h not in self.papa_const]
        self.papa_kept = sorted(set(kept_heads))
        self.papa_max_length = max_length
        self._papa_index_cache: dict = {}
        # A plain attribute (not a submodule): every layer shares the model's one context.
        self.__dict__["papa_context"] = context
        if self.papa_const:
            weight = self._papa_reference_weight()
            data = torch.zeros(
                len(self.papa_const), max_length, max_length, dtype=constants_dtype, device=weight.device
            )
            # (Hc, L, L) constant attention of this layer's constant heads, in head order. Frozen constants
            # are a persistent buffer, so no optimizer or weight loading can ever make them trainable; the
            # paper's "labeled" matrices (papa_trainable_constants) are a parameter under the same name.
            if trainable:
                self.papa_constants = nn.Parameter(data)
            else:
                self.register_buffer("papa_constants", data, persistent=True)
        else:
            self.papa_constants = None
        self.papa_lambda_logits = None
        if self.papa_mixed:
            # Lambda training (paper section 3.2): every head attends and has a constant; its output mixes
            # the two with lambda = sigmoid(logit), 0.5 to start. Mixing only some heads is not defined.
            if not self.papa_kept == self.papa_const == list(range(num_heads)):
                raise ValueError(
                    f"layer {layer}: lambda mixing needs every head both kept and constant, got kept "
                    f"{self.papa_kept} and constant {self.papa_const}"
                )
            weight = self._papa_reference_weight()
            self.papa_lambda_logits = nn.Parameter(torch.zeros(num_heads, dtype=torch.float32, device=weight.device))

    @property
    def papa_mixed(self) -> list[int]:
        return sorted(set(self.papa_kept) & set(self.papa_const))

    def _papa_reference_weight(self) -> torch.Tensor:
        raise NotImplementedError

    def _papa_index(self, heads: list[int], device: torch.device) -> torch.Tensor:
        key = (tuple(heads), device)
        if key not in self._papa_index_cache:
            self._papa_index_cache[key] = torch.tensor(heads, dtype=torch.long, device=device)
        return self._papa_index_cache[key]

    def _papa_select(self, x: torch.Tensor, heads: list[int], dim: int = 1) -> torch.Tensor:
        """Slice heads out of a (B, H, ...) tensor; free when they are all heads."""
        if len(heads) == x.shape[dim]:
            return x
        return x.index_select(dim, self._papa_index(heads, x.device))

    def _papa_constant(self, value: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Constant heads' context and, when attentions are requested, the probabilities they used.

        Args:
            value: (B, Hc, N, d) value vectors of the constant heads.

        Returns:
            context (B, Hc, N, d) and probabilities (Hc, B, N, N) in batch order after dropout, or
            ``None`` for the probabilities when the model was not asked for attentions.
        """
        layout = self.papa_context.layout
        if layout is None:
            raise RuntimeError(
                "PAPA constant heads need the input's slot layout: call the model itself (or its base model), "
                "not one of its layers"
            )
        probs = layout.probs(self.papa_constants, value.dtype)  # (Hc, U, N, N)
        batch_order = False
        drop = self.dropout.p if self.training else 0.0
        if drop > 0:
            probs = nn.functional.dropout(probs[:, layout.inverse], p=drop, training=True)  # (Hc, B, N, N)
            batch_order = True
        context = layout.apply(probs, value, batch_order=batch_order)
        if not self.papa_context.output_attentions:
            return context, None
        return context, probs if batch_order else probs[:, layout.inverse]

    def _papa_merge(
        self,
        kept_ctx: torch.Tensor | None,
        const_ctx: torch.Tensor | None,
        shape: tuple[int, int, int, int],
    ) -> torch.Tensor:
        """Put kept (B, Hk, N, d) and constant (B, Hc, N, d) contexts back in head order: (B, H, N, d)."""
        if const_ctx is None:
            return kept_ctx
        if kept_ctx is None:
            return const_ctx
        if self.papa_mixed:  # lambda training: every head is in both sets
            lam = torch.sigmoid(self.papa_lambda_logits).to(kept_ctx.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
            return lam * kept_ctx + (1 - lam) * const_ctx
        out = kept_ctx.new_empty(shape)
        out.index_copy_(1, self._papa_index(self.papa_kept, out.device), kept_ctx)
        out.index_copy_(1, self._papa_index(self.papa_const, out.device), const_ctx)
        return out

    def _papa_context(
        self, kept_ctx: torch.Tensor | None, value: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Every head's context in the layout the output projection takes.

        Args:
            kept_ctx: (B, Hk, N, d) context of the kept heads (``None`` when none is kept).
            value: (B, H, N, d) value vectors of all heads.

        Returns:
            (B, N, H*d) context and the constant heads' probabilities (see :meth:`_papa_constant`).
        """
        b, h, n, d = value.shape
        const_ctx = const_probs = None
        if self.papa_const:
            const_ctx, const_probs = self._papa_constant(self._papa_select(value, self.papa_const))
        ctx = self._papa_merge(kept_ctx, const_ctx, (b, h, n, d))  # (B, H, N, d)
        return ctx.transpose(1, 2).reshape(b, n, h * d), const_probs

    def _papa_weights(
        self, kept_w: torch.Tensor | None, const_probs: torch.Tensor | None, shape: tuple[int, int, int, int]
    ) -> torch.Tensor | None:
        """(B, H, N, N) attention weights when asked for: constants actually used for constant heads."""
        if not self.papa_context.output_attentions or const_probs is None:
            return kept_w
        const_w = const_probs.transpose(0, 1)  # (B, Hc, N, N)
        if not self.papa_kept:
            return const_w
        if kept_w is None:  # sdpa/flash give no weights for kept heads
            kept_w = torch.full(
                (shape[0], len(self.papa_kept), shape[2], shape[2]), float("nan"), device=const_w.device
            )
        return self._papa_merge(kept_w.to(const_w.dtype), const_w, (shape[0], shape[1], shape[2], shape[2]))

    def _papa_shrink_linear(self, name: str) -> None:
        """Keep only the kept heads' rows of a per-head projection (``None`` when no head is kept)."""
        linear = getattr(self, name)
        if linear is None:
            return
        if not self.papa_kept:
            setattr(self, name, None)
            return
        d = self.papa_head_dim
        rows = [r for h in self.papa_kept for r in range(h * d, (h + 1) * d)]
        new = _uninitialised_linear(linear.in_features, len(rows), linear.bias is not None, linear.weight)
        with torch.no_grad():
            new.weight.copy_(linear.weight[rows])
            if linear.bias is not None:
                new.bias.copy_(linear.bias[rows])
        setattr(self, name, new)


class InterfaceAttentionMixin(PapaHeadsMixin):
    """BERT-like families: kept heads dispatch through ``ALL_ATTENTION_FUNCTIONS`` (eager, sdpa, ...)."""

    papa_names: tuple[str, str, str, str | None]  # q, k, v, out projection attribute names
    papa_eager: object

    def _papa_reference_weight(self):
        return getattr(self, self.papa_names[2]).weight

    def _papa_shrink(self) -> None:
        q, k, _, _ = self.papa_names
        self._papa_shrink_linear(q)
        self._papa_shrink_linear(k)

    def forward(self, hidden_states: torch.Tensor, attention_mask: torch.Tensor | None = None, **kwargs):
        from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

        q_name, k_name, v_name, out_name = self.papa_names
        kwargs.pop("past_key_values", None)  # encoders only: no cache
        kwargs.pop("output_attentions", None)
        b, n, _ = hidden_states.shape
        d, h = self.papa_head_dim, self.papa_num_heads
        value = getattr(self, v_name)(hidden_states).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)

        kept_ctx = kept_w = None
        if self.papa_kept:
            query = getattr(self, q_name)(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            key = getattr(self, k_name)(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            interface = ALL_ATTENTION_FUNCTIONS.get_interface(self.config._attn_implementation, self.papa_eager)
            kept_ctx, kept_w = interface(
                self,
                query,
                key,
                self._papa_select(value, self.papa_kept),
                attention_mask,
                dropout=0.0 if not self.training else self.dropout.p,
                scaling=self.scaling,
                **kwargs,
            )  # (B, N, Hk, d)
            kept_ctx = kept_ctx.transpose(1, 2)  # (B, Hk, N, d)

        ctx, const_probs = self._papa_context(kept_ctx, value)  # (B, N, H*d)
        if out_name is not None:
            ctx = getattr(self, out_name)(ctx)
        return ctx, self._papa_weights(kept_w, const_probs, (b, h, n, d))


class MPNetAttentionMixin(PapaHeadsMixin):
    """MPNet: softmax in the module with a per-head relative position bias."""

    def _papa_reference_weight(self):
        return self.v.weight

    def _papa_shrink(self) -> None:
        self._papa_shrink_linear("q")
        self._papa_shrink_linear("k")

    def forward(self, hidden_states, attention_mask=None, position_bias=None, output_attentions=False, **kwargs):
        b, n, _ = hidden_states.shape
        d, h = self.papa_head_dim, self.papa_num_heads
        value = self.v(hidden_states).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)
        kept_ctx = kept_w = None
        if self.papa_kept:
            q = self.q(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            k = self.k(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hk, N, d)
            scores = torch.matmul(q, k.transpose(-1, -2)) / (d**0.5)  # (B, Hk, N, N)
            if position_bias is not None:
                scores = scores + self._papa_select(position_bias, self.papa_kept)
            if attention_mask is not None:
                scores = scores + attention_mask
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            kept_ctx = torch.matmul(kept_w, self._papa_select(value, self.papa_kept))  # (B, Hk, N, d)
        ctx, const_probs = self._papa_context(kept_ctx, value)  # (B, N, H*d)
        out = self.o(ctx)
        if output_attentions or self.papa_context.output_attentions:
            return out, self._papa_weights(kept_w, const_probs, (b, h, n, d))
        return (out,)


class DebertaV2AttentionMixin(PapaHeadsMixin):
    """DeBERTa-v2/v3: disentangled attention; the parent's bias code runs on the kept heads only."""

    def _papa_reference_weight(self):
        return self.value_proj.weight

    def _papa_shrink(self) -> None:
        for name in ("query_proj", "key_proj", "pos_key_proj", "pos_query_proj"):
            if hasattr(self, name):
                self._papa_shrink_linear(name)
        # The parent's methods size their per-head views with num_attention_heads: the kept heads.
        self.num_attention_heads = len(self.papa_kept)

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        from transformers.models.deberta_v2.modeling_deberta_v2 import scaled_size_sqrt

        b, n, _ = hidden_states.shape
        d, h, hk = self.papa_head_dim, self.papa_num_heads, len(self.papa_kept)
        value = self.value_proj(hidden_states).view(b, n, h, d).transpose(1, 2)  # (B, H, N, d)
        kept_ctx = kept_w = None
        if hk:
            q_in = hidden_states if query_states is None else query_states
            q = self.transpose_for_scores(self.query_proj(q_in), hk)  # (B*Hk, N, d)
            k = self.transpose_for_scores(self.key_proj(hidden_states), hk)  # (B*Hk, N, d)
            scale_factor = 1 + ("c2p" in self.pos_att_type) + ("p2c" in self.pos_att_type)
            scale = scaled_size_sqrt(q, scale_factor)
            scores = torch.bmm(q, k.transpose(-1, -2) / scale.to(dtype=q.dtype))  # (B*Hk, N, N)
            if self.relative_attention:
                rel = self.pos_dropout(rel_embeddings)
                scores = scores + self.disentangled_attention_bias(q, k, relative_pos, rel, scale_factor)
            scores = scores.view(-1, hk, n, n)  # (B, Hk, N, N)
            scores = scores.masked_fill(~attention_mask.bool(), torch.finfo(q.dtype).min)
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            v_k = self._papa_select(value, self.papa_kept)
            kept_ctx = torch.bmm(kept_w.reshape(-1, n, n), v_k.reshape(-1, n, d)).view(b, hk, n, d)
        ctx, const_probs = self._papa_context(kept_ctx, value)  # (B, N, H*d)
        if output_attentions or self.papa_context.output_attentions:
            return ctx, self._papa_weights(kept_w, const_probs, (b, h, n, d))
        return ctx, None


class DebertaAttentionMixin(PapaHeadsMixin):
    """DeBERTa v1: a fused, per-head interleaved ``in_proj`` (q, k, v rows of head 0, then head 1...).

    Kept heads keep their q/k/v rows in ``in_proj``; constant heads keep only their value rows, in
    ``papa_value_proj``. ``v_bias`` stays for all heads; ``q_bias`` and the positional projections keep
    the kept heads' entries.
    """

    def _papa_reference_weight(self):
        return self.in_proj.weight

    def _papa_shrink(self) -> None:
        if getattr(self, "head_logits_proj", None) is not None:
            raise ValueError("DeBERTa talking-head attention mixes heads, so single heads cannot be made constant")
        d, weight = self.papa_head_dim, self.in_proj.weight  # (H*3d, hidden)
        per_head = weight.view(self.papa_num_heads, 3, d, -1)  # (H, 3, d, hidden)
        self.papa_value_proj = None
        if self.papa_const and not self.papa_mixed:
            value_rows = per_head[self.papa_const, 2].reshape(-1, weight.shape[1])
            self.papa_value_proj = _uninitialised_linear(weight.shape[1], value_rows.shape[0], False, weight)
            with torch.no_grad():
                self.papa_value_proj.weight.copy_(value_rows)
        if set(self.papa_kept) != set(range(self.papa_num_heads)):
            if self.papa_kept:
                kept_rows = per_head[self.papa_kept].reshape(-1, weight.shape[1])
                self.in_proj = _uninitialised_linear(weight.shape[1], kept_rows.shape[0], False, weight)
                with torch.no_grad():
                    self.in_proj.weight.copy_(kept_rows)
            else:
                self.in_proj = None
            q_bias = self.q_bias.view(self.papa_num_heads, d)[self.papa_kept].reshape(-1)
            self.q_bias = nn.Parameter(q_bias.detach().clone())
            for name in ("pos_proj", "pos_q_proj"):
                if hasattr(self, name):
                    self._papa_shrink_linear(name)
        self.num_attention_heads = len(self.papa_kept)

    def forward(
        self,
        hidden_states,
        attention_mask,
        output_attentions=False,
        query_states=None,
        relative_pos=None,
        rel_embeddings=None,
    ):
        from transformers.models.deberta.modeling_deberta import scaled_size_sqrt

        if query_states is not None:
            raise NotImplementedError("PAPA DeBERTa attention does not support query_states (z_steps > 1)")
        b, n, _ = hidden_states.shape
        d, h, hk = self.papa_head_dim, self.papa_num_heads, len(self.papa_kept)
        v_bias = self.v_bias.view(1, h, 1, d)
        value = q = k = None
        if hk:
            qkv = self.in_proj(hidden_states).view(b, n, hk, 3 * d).permute(0, 2, 1, 3)  # (B, Hk, N, 3d)
            q, k, v_kept = qkv.chunk(3, dim=-1)  # each (B, Hk, N, d)
        if self.papa_value_proj is not None:
            v_const = self.papa_value_proj(hidden_states).view(b, n, -1, d).transpose(1, 2)  # (B, Hc, N, d)
            value = self._papa_merge(v_kept if hk else None, v_const, (b, h, n, d)) if hk else v_const
        else:
            value = v_kept  # every head has its q/k/v in in_proj (no constants, or lambda mixing)
        value = value + v_bias  # (B, H, N, d)

        kept_ctx = kept_w = None
        if hk:
            q = q + self.transpose_for_scores(self.q_bias[None, None, :])
            scale_factor = 1 + len(self.pos_att_type)
            q = q / scaled_size_sqrt(q, scale_factor).to(dtype=q.dtype)
            scores = torch.matmul(q, k.transpose(-1, -2))  # (B, Hk, N, N)
            if self.relative_attention and rel_embeddings is not None and relative_pos is not None:
                rel = self.pos_dropout(rel_embeddings)
                scores = scores + self.disentangled_att_bias(q, k, relative_pos, rel, scale_factor)
            scores = scores.masked_fill(~attention_mask.bool(), torch.finfo(q.dtype).min)
            kept_w = self.dropout(nn.functional.softmax(scores, dim=-1))
            kept_ctx = torch.matmul(kept_w, self._papa_select(value, self.papa_kept))  # (B, Hk, N, d)
        ctx, const_probs = self._papa_context(kept_ctx, value)  # (B, N, H*d)
        if output_attentions or self.papa_context.output_attentions:
            return ctx, self._papa_weights(kept_w, const_probs, (b, h, n, d))
        return ctx, None


_STYLE_MIXINS = {
    "interface": InterfaceAttentionMixin,
    "mpnet": MPNetAttentionMixin,
    "deberta": DebertaAttentionMixin,
    "deberta-v2": DebertaV2AttentionMixin,
}
_CLASS_CACHE: dict = {}


def papa_attention_class(family) -> type:
    """``Papa<Family>SelfAttention``: the family's self-attention class with the PAPA mixin in front."""
    if family.model_type not in _CLASS_CACHE:
        module = family.transformers_module()
        parent = getattr(module, family.attention_class)
        attrs = {"__module__": __name__}
        if family.style == "interface":
            attrs["papa_names"] = (family.q, family.k, family.v, family.out)
            attrs["papa_eager"] = staticmethod(module.eager_attention_forward)
        name = f"Papa{family.prefix}SelfAttention"
        _CLASS_CACHE[family.model_type] = type(name, (_STYLE_MIXINS[family.style], parent), attrs)
    return _CLASS_CACHE[family.model_type]


def convert_module(
    module: nn.Module,
    family,
    layer: int,
    num_heads: int,
    head_dim: int,
    constant_heads: Sequence[int],
    max_length: int,
    constants_dtype: torch.dtype,
    trainable: bool,
    context: PapaContext,
    kept_heads: Sequence[int] | None = None,
) -> nn.Module:
    """Switch one source self-attention module to its PAPA subclass, in place.

    The query/key rows of heads not in ``kept_heads`` are dropped (for a fresh model they are random
    and the checkpoint's weights fill the smaller projections). ``kept_heads=None`` means every head not
    in ``constant_heads``; lambda training passes all heads so every head is in both sets.
    """
    module.__class__ = papa_attention_class(family)
    module._papa_init(
        layer, num_heads, head_dim, constant_heads, kept_heads, max_length, constants_dtype, trainable, context
    )
    module._papa_shrink()
    return module
