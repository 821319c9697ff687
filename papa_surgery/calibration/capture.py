"""Attention handed to a calibration sink in blocks, never as a (B, H, N, N) tensor: the ``papa_capture`` function.

Eager attention, which calibration used to read through forward hooks, materialises every layer's (B, H, N, N)
probabilities: at N = 8,192 that is 3.2 GB per layer in fp32, and a local (sliding-window) layer computes all N^2
scores only to mask most of them. Families that dispatch through transformers' attention interface instead run
``papa_capture`` (registered like ``papa_sdpa``): for each example it computes the softmax of a block of query rows
against that example's real keys (a local layer: only the keys its window reaches, the mask applied as given),
hands the probabilities to the sink (``sink.add_block(layer, example, a0, a1, b0, b1, P)``) and multiplies them with
the values, block after block. The output is the eager one (the same products, in blocks); memory is one block.

A sink says which example each batch row is (``sink.batch``: ``lo``, ``n`` of its real tokens) and how its rows are
cut (``sink.chunks(n)``); ``full_rows = True`` asks for every key of a row even in a local layer (a pass that reads
the cells outside the window, where attention is zero).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from ..hub_code.modeling_papa import attention_modules

NAME = "papa_capture"


def capture_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The ``papa_capture`` attention function (transformers' interface): ``(B, N, H, d)`` context and no weights.

    Args:
        module: the family's attention module, carrying ``_papa_capture = (sink, layer)`` during a pass.
        query: (B, H, N, d); key, value: (B, Hk, N, d) (grouped-query attention repeats them).
        attention_mask: the eager (B, 1, N, N) mask (additive or boolean), or ``None``.
        scaling: the family's score scale (default d^-1/2); ``sliding_window`` in ``kwargs``: a local layer's.
    """
    sink, layer = module.__dict__["_papa_capture"]
    b, h, n, d = query.shape
    if key.shape[1] != h:  # grouped-query attention: each query head reads its group's key and value
        key, value = (t.repeat_interleave(h // t.shape[1], dim=1) for t in (key, value))
    scale = d**-0.5 if scaling is None else scaling
    window = None if getattr(sink, "full_rows", False) else kwargs.get("sliding_window")
    out = query.new_zeros(b, n, h, d)  # (B, N, H, d): padding rows stay zero
    for e, ex in enumerate(sink.batch):
        lo = ex.lo
        for a0, a1 in sink.chunks(ex.n):
            b0, b1 = (0, ex.n) if not window else (max(0, a0 - window), min(ex.n, a1 + window))
            scores = (
                query[e, :, lo + a0 : lo + a1] @ key[e, :, lo + b0 : lo + b1].transpose(-1, -2) * scale
            )  # (H, c, m)
            if attention_mask is not None:
                mask = attention_mask[e, :, lo + a0 : lo + a1, lo + b0 : lo + b1]  # (1, c, m)
                scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
            p = torch.softmax(scores, dim=-1, dtype=torch.float32)  # (H, c, m)
            sink.add_block(layer, e, a0, a1, b0, b1, p)
            out[e, lo + a0 : lo + a1] = (p.to(value.dtype) @ value[e, :, lo + b0 : lo + b1]).transpose(0, 1)
    return out, None


def register() -> None:
    """Register ``papa_capture`` with transformers' attention and mask interfaces (it takes the eager mask)."""
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface
    from transformers.modeling_utils import AttentionInterface

    AttentionInterface.register(NAME, capture_attention)
    AttentionMaskInterface.register(NAME, ALL_MASK_ATTENTION_FUNCTIONS["eager"])


@contextlib.contextmanager
def capturing(model, sink) -> Iterator[None]:
    """Within the block, ``model``'s attention runs ``papa_capture`` into ``sink``; its implementation comes back."""
    register()
    modules = attention_modules(model)
    previous = model.config._attn_implementation
    for layer, module in enumerate(modules):
        module.__dict__["_papa_capture"] = (sink, layer)
    model.set_attn_implementation(NAME)
    try:
        yield
    finally:
        model.set_attn_implementation(previous)
        for module in modules:
            module.__dict__.pop("_papa_capture", None)
