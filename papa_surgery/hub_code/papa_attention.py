"""PAPA attention for families that dispatch through transformers' attention interface.

The family's own self-attention module runs unchanged: its query/key projections are shrunk to the kept
heads, and ``config._attn_implementation`` names a registered PAPA attention function
(``papa_sdpa``, ``papa_eager``, ``papa_flash_attention_2``, ...). That function runs the kept heads
through the underlying implementation and the constant heads as ``rownorm(C[slots] * mask) @ V``
(``constant_heads.constant_attention``: one GEMM per head for the whole batch), and returns every head in its
original order. The batch's slot plan (``slot_plan.SlotPlan``) arrives as the ``papa_plan`` keyword, which the
PAPA model computes once in its own ``forward`` and which transformers' ``**kwargs`` path carries from the model
down to the attention function.

A head that is both kept and constant (lambda training only, never in a checkpoint) mixes the two
outputs: ``lambda * attn + (1 - lambda) * const`` with ``lambda = sigmoid(papa_lambda_logits)``, which
equals attending with ``B = lambda * A + (1 - lambda) * rownorm(C * mask)`` (paper section 3.2).

Modern encoders (rotary positions) apply rotary to whatever query/key heads the projections give, so
shrinking the projections is what keeps constant heads out of it. Three of them need more:

* Fused ``[Q; K; V]`` (ModernBERT's ``Wqkv``): the family's forward splits the fused output into three
  equal blocks of every head and rotates all of Q and K, so a layer with constant heads would carry zero Q/K
  blocks for them through the split and the rotary. Instead :class:`PapaFusedQKV` computes only the kept heads'
  Q/K rows and every V row, and the layer runs :class:`PapaFusedAttentionMixin`'s forward: the family's own
  steps (projection, the family's rotary function named in the family table, the attention interface, output
  projection and dropout) on the kept heads' Q/K only. A layer without constant heads keeps the family's class.
* Grouped-query attention (EuroBERT): query head h reads key/value head ``h // g``. A key head is removed
  only when every query head of its group is constant; value heads all stay, since the constant heads
  read them. The kept heads then run as plain multi-head attention over their groups' keys and values.
* Sliding-window layers (ModernBERT's local layers): a token attends to tokens at distance <= w. A
  constant is defined on slots, and slots are not token distances (a pair's second segment starts at
  L/2, the final separator sits at L-1), so a calibrated constant can hold mass between slots whose
  tokens are farther than w apart in some other input. The window is therefore applied at use, on the
  token positions of the batch, before the row normalisation (``constant_heads.py``): a local
  constant head never puts weight outside its layer's window, whatever L and the input length.

This file ships inside every PAPA checkpoint: it imports only torch, transformers and siblings.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import torch
from torch import nn

from .compact_constants import add_compact_constants
from .compat import eager_attention, family_function, fused_attention_forward
from .constant_heads import constant_attention
from .heads import PapaHeads, combine_heads, select_heads
from .shrink import no_heads, shrink_fused, shrink_grouped, shrink_projections
from .slot_plan import SlotPlan

PAPA_PREFIX = "papa_"
# Underlying implementations a PAPA attention function can wrap (those transformers knows of).
BASE_IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flash_attention_4",
    "flex_attention",
)


def add_constants(
    module: nn.Module, heads: PapaHeads, max_length: int, dtype: torch.dtype, trainable: bool, compact=None
) -> None:
    """Give ``module`` its constant matrices (and lambda logits when mixing), on its own device.

    Frozen constants are a persistent buffer, so no optimizer or weight loading can make them trainable;
    the paper's "labeled" matrices (``papa_trainable_constants``) are a parameter under the same name.
    With a ``compact`` layout the buffers are the compact parts (``compact_constants.py``) instead.
    """
    device = next(module.parameters()).device
    if heads.const and compact is not None:  # a CompactLayout: frozen parts (compact_constants.py)
        add_compact_constants(module, len(heads.const), compact, dtype, device, trainable or heads.mixed)
    elif heads.const:
        data = torch.zeros(len(heads.const), max_length, max_length, dtype=dtype, device=device)  # (Hc, L, L)
        if trainable:
            module.papa_constants = nn.Parameter(data)
        else:
            module.register_buffer("papa_constants", data, persistent=True)
    if heads.mixed:
        # Lambda training (paper section 3.2): lambda = sigmoid(0) = 0.5 to start.
        module.papa_lambda_logits = nn.Parameter(torch.zeros(heads.num_heads, dtype=torch.float32, device=device))


def setup_interface_attention(
    module: nn.Module, family, heads: PapaHeads, max_length: int, dtype: torch.dtype, trainable: bool, compact=None
) -> None:
    """Turn one interface-family self-attention module into PAPA attention, in place.

    Shrinks the query/key projections to the kept heads (a weightless :func:`no_heads` stand-in when none
    is kept, since the family's forward still calls them) and adds the constants.
    """
    module.papa_heads, module.papa_rows = heads, {}
    # transformers keeps one global table of attention functions, so the ``papa_*`` entry is whichever copy
    # of this file registered last (the library's, or another checkpoint's older code); each module keeps
    # its own copy's forward, and the registered entry calls that.
    module.papa_attention_impl = papa_attention_forward
    if family.window_attr and getattr(module, "sliding_window", None) is not None:
        module.papa_window = int(getattr(module.config, family.window_attr))
    if family.fused_qkv:
        if shrink_fused(module, family.q, heads):
            module.__class__ = fused_attention_class(family, type(module))
    elif family.kv_heads_attr:
        shrink_grouped(module, family, heads)
    else:
        stand_in = functools.partial(no_heads, head_dim=heads.head_dim)
        shrink_projections(module, (family.q, family.k), heads, stand_in)
    add_constants(module, heads, max_length, dtype, trainable, compact)


def _base_function(module: nn.Module, base: str):
    """The underlying attention function: the family's own eager function, or a registered one."""
    if base == "eager":
        return getattr(module, "papa_eager", None) or eager_attention(type(module))
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    return ALL_ATTENTION_FUNCTIONS[base]


def papa_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    dropout: float = 0.0,
    papa_plan: SlotPlan | None = None,
    papa_slots: torch.Tensor | None = None,
    papa_base: str = "sdpa",
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Attention with constant heads; the signature transformers' attention interface calls.

    Args:
        module: the family's self-attention module (with ``papa_heads`` and its constants).
        query, key: (B, Hk, N, d) of the kept heads (a placeholder when no head is kept).
        value: (B, H, N, d) of every head.
        attention_mask: the mask the underlying implementation expects (kept heads only).
        dropout: attention dropout probability (0 in eval mode).
        papa_plan: the batch's :class:`~slot_plan.SlotPlan`, from the PAPA model's forward.
        papa_slots: (B, N) slots instead of a plan (a direct call; costs a host sync to plan them).
        papa_base: the underlying implementation for the kept heads.

    Returns:
        (B, N, H, d) context of every head in head order, and (B, H, N, N) weights or ``None`` (the
        underlying implementation gives none, or attentions were not asked for).
    """
    base = _base_function(module, papa_base)
    heads: PapaHeads | None = getattr(module, "papa_heads", None)
    if heads is None or not heads.const:
        return base(module, query, key, value, attention_mask, dropout=dropout, **kwargs)
    if papa_plan is None and papa_slots is not None:
        papa_plan = SlotPlan.from_slots(papa_slots, int(module.config.papa_max_length))
    if papa_plan is None:
        raise ValueError(
            "PAPA constant heads need the batch's slots: call the PAPA model itself (model(...) or "
            "model.forward(...)), or pass papa_slots=model.papa_slots(input_ids, attention_mask)"
        )
    if kwargs.get("cu_seq_lens_q") is not None:
        raise ValueError(
            "PAPA constant heads need padded batches: packed sequences (cu_seq_lens) give no per-example slots; "
            "pass a padded batch with its attention_mask"
        )
    wants_weights = bool(kwargs.get("output_attentions", getattr(module.config, "output_attentions", False)))
    kept_out = kept_w = None
    if heads.kept:
        if hasattr(module, "papa_key"):  # grouped-query attention, run as multi-head over the kept heads
            key = key.index_select(1, torch.tensor(module.papa_key, device=key.device))  # (B, Hk, N, d)
        v_kept = value if heads.mixed else _value_heads(module, value, heads.kept)  # (B, Hk, N, d)
        kept_out, kept_w = base(module, query, key, v_kept, attention_mask, dropout=dropout, **kwargs)  # (B, N, Hk, d)
    window = getattr(module, "papa_window", None)
    const = _value_index(module, value, heads.const)  # the constant heads' values are read in place
    const_out, const_p = constant_attention(module, papa_plan, value, dropout, window, wants_weights, const)

    logits = module.papa_lambda_logits if heads.mixed else None
    out = combine_heads(kept_out, const_out, heads, dim=2, lambda_logits=logits)  # (B, N, H, d)
    if not wants_weights:
        return out, None
    if heads.kept and kept_w is None:  # sdpa/flash materialise no weights for the kept heads
        if heads.mixed:
            return out, None
        b, n = papa_plan.slots.shape
        kept_w = const_p.new_full((b, len(heads.kept), n, n), float("nan"))
    return out, combine_heads(kept_w, const_p, heads, dim=1, lambda_logits=logits)  # (B, H, N, N)


def _value_heads(module: nn.Module, value: torch.Tensor, heads: Sequence[int]) -> torch.Tensor:
    """(B, len(heads), N, d) value vectors of query heads ``heads`` (their groups' value heads under GQA)."""
    return select_heads(value, _value_index(module, value, heads), value.shape[1])


def _value_index(module: nn.Module, value: torch.Tensor, heads: Sequence[int]) -> list[int]:
    """Which of ``value``'s (B, Hv, N, d) heads each query head of ``heads`` reads (its group's under GQA), for a
    caller that picks them itself rather than from a copy."""
    kv = getattr(module, "papa_kv", None)
    if kv is not None:
        return [kv[h] for h in heads]
    group = module.papa_heads.num_heads // value.shape[1]  # GQA with nothing shrunk (lambda training): h // g
    return [h // group for h in heads]


class PapaFusedAttentionMixin:
    """Forward of a fused-``[Q; K; V]`` layer with constant heads (ModernBERT): Q/K of the kept heads only.

    The family's forward in the same steps (``Wqkv``, the family's rotary, the attention interface, ``Wo``,
    ``out_drop``), but ``Wqkv`` (:class:`~shrink.PapaFusedQKV`) gives the kept heads' Q/K and every head's V, so
    no zero blocks are split, rotated or handed down for the constant heads. Pinned to the family's own forward
    by tests (lambda mixing, which keeps the family's class, equals this at lambda = 1/0).
    """

    def forward(self, hidden_states, position_embeddings=None, attention_mask=None, **kwargs):
        # The family's steps read its module's internals: compat.py keeps them in one place.
        return fused_attention_forward(self, hidden_states, position_embeddings, attention_mask, **kwargs)


def fused_attention_class(family, base: type) -> type:
    """``Papa<Family>Attention(PapaFusedAttentionMixin, <the family's attention>)``, built on first use."""
    name = f"{family.papa_prefix}Attention"
    if name not in globals():
        attrs = {
            "__module__": __name__,
            "papa_rotary": staticmethod(family_function(base, family.rotary)),
            "papa_eager": staticmethod(eager_attention(base)),
        }
        globals()[name] = type(name, (PapaFusedAttentionMixin, base), attrs)
    return globals()[name]


def __getattr__(name: str):
    # Unpickling a model looks its classes up by name: build them on demand.
    from .families import FAMILIES

    for family in FAMILIES.values():
        if family.fused_qkv and name == f"{family.papa_prefix}Attention":
            return fused_attention_class(family, getattr(family.transformers_module(), family.attention_class))
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def papa_mask_function(base: str):
    """The mask function transformers uses for ``papa_<base>``: the underlying implementation's own, skipped for
    a model whose every head is constant (no kept head reads a mask; constant heads read the slot plan), which
    spares it the (B, 1, N, N) mask of a padded batch."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS

    underlying = ALL_MASK_ATTENTION_FUNCTIONS[base if base in ALL_MASK_ATTENTION_FUNCTIONS else "sdpa"]

    def mask(*args, config=None, **kwargs):
        if _attention_free(config):
            return None
        return underlying(*args, config=config, **kwargs)

    return mask


def _attention_free(config) -> bool:
    """Whether a (PAPA) config makes every head of every layer constant, without lambda mixing."""
    heads = getattr(config, "papa_constant_heads", None)
    if not heads or getattr(config, "papa_lambda_mixing", False):
        return False
    from .families import family_for

    family = family_for(config.model_type)
    return len(heads) >= int(getattr(config, family.heads_attr)) * int(getattr(config, family.layers_attr))


def _module_attention(module: nn.Module, *args, **kwargs):
    """The registered ``papa_*`` function: the module's own copy of :func:`papa_attention_forward`."""
    return getattr(module, "papa_attention_impl", papa_attention_forward)(module, *args, **kwargs)


def register_papa_attention() -> None:
    """Register ``papa_<base>`` attention and mask functions for every known underlying implementation."""
    from transformers.masking_utils import AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    for base in BASE_IMPLEMENTATIONS:
        AttentionInterface.register(PAPA_PREFIX + base, functools.partial(_module_attention, papa_base=base))
        AttentionMaskInterface.register(PAPA_PREFIX + base, papa_mask_function(base))
