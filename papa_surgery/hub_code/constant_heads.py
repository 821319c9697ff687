"""Constant heads at the cost of one GEMM per head: ``rownorm(C * M) V = C (m * V) / (C m)``.

A constant head's output for token i is ``sum_j C[s_i, s_j] m_j v_j / sum_j C[s_i, s_j] m_j``. Numerator and
normaliser are products with the *same* matrix for every example once the batch is laid out in the compressed
slot space of ``slot_plan.py``: ``[m * V | m]`` of every token is scattered into an (S, B, d+1) block, multiplied
by ``C_S`` (S x S, C's rows and columns of the slots in use) in one batched GEMM over the constant heads, and
read back as ``numerator / normaliser``. No per-example (B, H, N, N) matrix is built; the only work besides the
GEMM is O(B N d) scatter/gather. Where the batch's slots are the model's own and ``C_S`` is dense (every short
batch), the block is gathered instead (each example's tokens sit on distinct rows) straight from every head's
values, and the normaliser is ``C_S`` times the row mask: fewer, smaller kernels, which is what a short batch's
time is made of (``_gathered``).

A local (sliding-window) layer keeps only pairs of tokens at most w apart. In the compressed space, tokens of
one segment are as far apart as their rows, so the window there is a fixed band of ``C_S``; what the band gets
wrong is corrected per example at O(B w^2 d) cost: the final separator (row 0, whose rank differs per example)
gets its own row and a rank-1 column term, and across a pair's middle, where an example's rows jump, the pairs
within the window that the band misses are added from (w x w) corner blocks.

Input-independent work is done once per set of constants: the clamped matrices in the compressed order (the
final separator first) are kept per module until the constants change (a weight load, ``.to()``, an in-place
update). Trainable constants that need a gradient, and traced graphs, take the matrix from the constants in
the graph instead. Per-example matrices are still built where they are the product itself: returned attention
weights (``output_attentions``) and attention dropout in training (``slots.reference_constant_attention``).

This file ships inside every PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence

import torch

from .compact_constants import COMPACT_PARTS, CompactLayout, constants_of, rebuild, version_of
from .dense_slots import DenseSlots
from .heads import select_heads
from .slot_plan import SlotPlan
from .slots import is_tracing, reference_constant_attention
from .structured_constants import LOCAL_STRUCTURED_FROM, STRUCTURED_FROM, StructuredSlots

PREPARED_UP_TO = 512  # compact constants up to this L keep their dense rebuild per module (Hc L^2 values)

# module -> (dtype, [(weakref to a source tensor, its version)], matrix): the prepared constants of each module.
# A weak table, not a module attribute: nothing to pickle or deep-copy, and gone with the module.
_PREPARED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _sources(module) -> list[torch.Tensor]:
    """The stored tensors a module's constants come from (the dense matrices, or the compact parts)."""
    if getattr(module, "papa_compact_layout", None) is not None:
        return [getattr(module, name) for name in COMPACT_PARTS]
    return [module.papa_constants]


def _structured(module) -> CompactLayout | None:
    """The compact layout of a module whose parts are used as stored (format 2), else ``None``."""
    layout = getattr(module, "papa_compact_layout", None)
    return None if layout is None or layout.clamped else layout


def _clamps(module) -> bool:
    """Whether negative cells count as 0: dense constants and format-1 compact ones (``CompactLayout.clamped``)."""
    return _structured(module) is None


def _dense(module) -> torch.Tensor:
    """(Hc, L, L) constants without the compact module cache (which would hold a second copy)."""
    layout = getattr(module, "papa_compact_layout", None)
    if layout is None:
        return module.papa_constants
    return rebuild({name: getattr(module, name) for name in COMPACT_PARTS}, layout)


def prepared_constants(module, dtype: torch.dtype) -> torch.Tensor:
    """(Hc, L, L) constants in ``dtype`` (clamped where :func:`_clamps`), rows and columns in compressed order
    (slot L-1 first). Kept until a source tensor changes; needs no host sync after the first call.
    """
    sources = _sources(module)
    entry = _PREPARED.get(module)
    if entry is not None and entry[0] == dtype and len(entry[1]) == len(sources):
        if all(ref() is t and version == version_of(t) for (ref, version), t in zip(entry[1], sources, strict=True)):
            return entry[2]
    # Built outside inference mode, so that a later forward with autograd on can still use it.
    with torch.inference_mode(False), torch.no_grad():
        matrix = _dense(module).to(dtype)
        matrix = torch.roll(matrix.clamp_min(0) if _clamps(module) else matrix, shifts=(1, 1), dims=(1, 2))
    _PREPARED[module] = (dtype, [(weakref.ref(t), version_of(t)) for t in sources], matrix)
    return matrix


def compressed_constants(module, plan: SlotPlan, dtype: torch.dtype, window: int | None = None):
    """``C_S``, the constants' rows and columns of the slots the batch uses, as the product should use them.

    Dense constants give a :class:`~dense_slots.DenseSlots` (clamped at 0), and so do compact constants up
    to L = ``PREPARED_UP_TO``: sliced from a dense rebuild kept per module. Above that, compact constants of format 2
    give a :class:`~structured_constants.StructuredSlots` from ``STRUCTURED_FROM`` rows on (a local layer's window:
    ``LOCAL_STRUCTURED_FROM``), else a dense ``C_S`` built from the parts; traced graphs build ``C_S`` from the parts.
    Never (L, L).
    """
    sources = _sources(module)
    layout = _structured(module)
    if layout is not None and (is_tracing() or layout.max_length > PREPARED_UP_TO):  # no dense rebuild kept
        parts = {name: getattr(module, name) for name in COMPACT_PARTS}
        structured = StructuredSlots.of_plan(parts, layout, plan, torch.promote_types(dtype, torch.float32))
        by_parts = plan.size >= (STRUCTURED_FROM if window is None else LOCAL_STRUCTURED_FROM)
        if is_tracing():
            return structured.dense()
        return structured if by_parts else structured.built()
    if layout is None and (is_tracing() or (torch.is_grad_enabled() and any(t.requires_grad for t in sources))):
        order = plan.slot_order  # in the graph: gradients reach trainable constants, exports need no state
        return DenseSlots(_dense(module).index_select(1, order).index_select(2, order).to(dtype).clamp_min(0))
    prepared = prepared_constants(module, dtype)
    half, size = plan.max_length // 2, plan.size
    if plan.second == 0 or plan.first == half:  # the rows in use are one prefix of the compressed order
        return DenseSlots(prepared[:, :size, :size])
    order = torch.cat([torch.arange(1 + plan.first), 1 + half + torch.arange(plan.second)]).to(prepared.device)
    top = prepared[:, : 1 + half + plan.second, : 1 + half + plan.second]
    return DenseSlots(top.index_select(1, order).index_select(2, order))


def constant_attention(
    module,
    plan: SlotPlan,
    value: torch.Tensor,
    dropout: float = 0.0,
    window: int | None = None,
    weights: bool = False,
    heads: Sequence[int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Context vectors of a module's constant heads: ``dropout(rownorm(C[slots] * mask)) @ V``.

    Args:
        module: the attention module holding the constants (``papa_constants`` or compact parts).
        plan: the batch's :class:`~slot_plan.SlotPlan`.
        value: (B, Hv, N, d) value vectors: of the constant heads (Hv = Hc), or of more heads with ``heads``.
        dropout: attention dropout probability (pass 0 in eval mode).
        window: a local layer's half window w (tokens farther apart get no weight).
        weights: also return the (B, Hc, N, N) probabilities used (materialised for the caller).
        heads: which of ``value``'s heads the constant heads read, in order (``None``: all of them).

    Returns:
        context (B, N, Hc, d) (possibly a strided view) and the probabilities (B, Hc, N, N), or ``None`` when not
        asked for.
    """
    clamp = _clamps(module)
    if dropout > 0 or (window is not None and not plan.structured):
        # Per-example matrices are needed anyway: dropout drops single cells of them; explicit slots say
        # nothing about where a window's tokens are in the compressed space.
        value = _picked(value, heads)  # (B, Hc, N, d)
        ctx, p = reference_constant_attention(constants_of(module), plan.slots, value, dropout, window, clamp=clamp)
        return ctx.transpose(1, 2), p if weights else None
    matrix = compressed_constants(module, plan, value.dtype, window)  # C_S (Hc, S, S), dense or structured
    if window is None and plan.structured and isinstance(matrix, DenseSlots) and not is_tracing():
        context = _gathered(matrix, plan, value, heads)  # (B, N, Hc, d)
        value = _picked(value, heads) if weights else value
    else:
        value = _picked(value, heads)  # (B, Hc, N, d)
        context = _scattered(matrix, plan, value, window)  # (B, N, Hc, d)
    if not weights:
        return context, None
    return context, reference_constant_attention(constants_of(module), plan.slots, value, 0.0, window, clamp)[1]


def _scattered(matrix, plan: SlotPlan, value: torch.Tensor, window: int | None) -> torch.Tensor:
    """(B, N, Hc, d) context by scattering ``[v | 1]`` into the compressed rows (any plan, window, storage)."""
    b, hc, n, d = value.shape
    size = plan.size
    block = _scatter(plan, value)  # (Hc, S+1, B, d+1)
    rows = block[:, :size].reshape(hc, size, b * (d + 1))
    if window is None:
        out = matrix.product(rows).to(value.dtype)  # (Hc, S, B (d+1))
    else:
        out = _windowed(matrix, block, plan, window)
    if is_tracing():  # indexing two dimensions: no (S B) flattening, whose symbolic size export cannot prove
        out = out.view(hc, size, b, d + 1).permute(1, 2, 0, 3)[plan.gather, plan.cols]  # (B N, Hc, d+1)
    else:  # the faster gather: one index into the (S B)-flattened rows
        out = out.view(hc, size * b, d + 1).transpose(0, 1).index_select(0, plan.flat_rows)
    scale = plan.token_scale.to(out.dtype)[:, :, None] / out[..., d:].clamp_min(torch.finfo(out.dtype).tiny)
    return (out[..., :d] * scale).view(b, n, hc, d)  # (B, N, Hc, d)


def _picked(value: torch.Tensor, heads: Sequence[int] | None, dim: int = 1) -> torch.Tensor:
    """The value vectors of ``heads`` along ``dim`` (``None``: all), a view where ``select_heads`` can give one."""
    return value if heads is None else select_heads(value, heads, value.shape[dim], dim)


def _gathered(matrix: DenseSlots, plan: SlotPlan, value: torch.Tensor, heads: Sequence[int] | None) -> torch.Tensor:
    """(B, N, Hc, d) context of a structured plan with a dense ``C_S``, in few kernels (short batches' path).

    Each example's tokens sit on distinct rows, so the (Hc, S, B, d) block of values is one gather from the
    tokens (the constant heads picked in the same index), the normalisers are ``C_S`` times the row mask, and the
    numerators one batched GEMM; no scatter into a zeroed block, no copy of the constant heads' values first.
    """
    b, hv, n, d = value.shape
    size, mask = plan.size, plan.row_mask.to(value.dtype)  # mask (S, B)
    by_head = value.transpose(1, 2).reshape(b * n, hv, d).transpose(0, 1)  # (Hv, B N, d), a view for most layouts
    by_head = _picked(by_head, heads, dim=0)  # (Hc, B N, d): picked here, where a copy is contiguous for the gather
    hc = by_head.shape[0]
    block = by_head.index_select(1, plan.row_tokens.view(-1)).view(hc, size, b, d)
    block.mul_(mask[None, :, :, None])  # (Hc, S, B, d): rows without a token of the example hold zeros
    numer = matrix.product(block.view(hc, size, b * d)).to(value.dtype).view(hc, size * b, d)  # (Hc, S B, d)
    norm = torch.matmul(matrix.matrix, mask).to(value.dtype).view(hc, size * b, 1)  # (Hc, S B, 1)
    at = plan.flat_rows  # (B N,)
    scale = plan.token_scale.to(value.dtype)[None] / norm.index_select(1, at).clamp_min(torch.finfo(value.dtype).tiny)
    context = numer.index_select(1, at) * scale  # (Hc, B N, d)
    return context.view(hc, b, n, d).permute(1, 2, 0, 3)  # (B, N, Hc, d) view


def _scatter(plan: SlotPlan, value: torch.Tensor) -> torch.Tensor:
    """(Hc, S+1, B, d+1): each token's ``[v | 1]`` on its compressed row (row S collects padding)."""
    b, hc, n, d = value.shape
    block = value.new_zeros(hc, plan.size + 1, b, d + 1)
    source = value.transpose(1, 2).reshape(b * n, hc, d)  # (B N, Hc, d), a view for transformers' layouts
    by_row = block[:, :, :, :d].permute(1, 2, 0, 3)  # (S+1, B, Hc, d) view: the indexed dimensions first
    by_row.index_put_((plan.rows, plan.cols), source, accumulate=not plan.structured)
    block[:, : plan.size, :, d] = plan.row_mask.to(value.dtype)
    return block


def _windowed(matrix, block: torch.Tensor, plan: SlotPlan, window: int) -> torch.Tensor:
    """(Hc, S, B (d+1)) numerators and normalisers of a local layer (see the module docstring).

    ``matrix`` is ``C_S`` (``DenseSlots`` or ``StructuredSlots``): its band of the window, and single cells.
    """
    hc, size = block.shape[0], plan.size
    b, width = block.shape[2], block.shape[3]
    device, dtype = block.device, block.dtype
    idx = torch.arange(size, device=device)
    zero = idx[:1]
    rows = block[:, :size]  # (Hc, S, B, d+1)
    out = matrix.band_product(rows.reshape(hc, size, b * width), window).to(dtype).view(hc, size, b, width)

    rank, n_real, before, jump = plan.window_rows()
    # The final separator (row 0, rank n-1): its column for every row within the window, and its own row.
    near_last = ((n_real - 1)[None, :] - rank <= window) & (plan.row_mask > 0)  # (S, B)
    near_last = near_last.to(dtype)
    column = matrix.cells(idx, zero).to(dtype) * near_last[None]  # (Hc, S, B): the final separator's column
    column[:, 0] = 0
    out = out + column[..., None] * rows[:, :1]  # rank-1 term of every example
    own = matrix.cells(zero, idx)[:, 0, :, None].to(dtype) * near_last[None]  # (Hc, S, B): its row
    out[:, 0] = torch.einsum("hsb,hsbe->hbe", own, rows)
    if not plan.jumps():  # no pair's middle in the batch: the band holds every other pair of tokens in the window
        return out.view(hc, size, b * width)

    # Across a pair's middle: tokens a and b' steps before / after it are a + b' + 1 apart, their rows a + b' + 1
    # + jump apart, so the band misses the pairs with a + b' + 1 <= w < a + b' + 1 + jump.
    steps = torch.arange(window, device=device)
    gap = steps[:, None] + steps[None, :] + 1  # (w, w)
    missing = (gap[None] <= window) & (gap[None] + jump[:, None, None] > window)  # (B, w, w)
    first_rows = before[:, None] - steps[None, :]  # (B, w) rows of the tokens before the middle (a = 0, 1, ...)
    second_rows = before[:, None] + 1 + jump[:, None] + steps[None, :]  # (B, w) from the middle separator on
    first_ok = (first_rows >= 1) & (before[:, None] >= 1)
    second_ok = second_rows < size
    missing = missing & first_ok[:, :, None] & second_ok[:, None, :]
    first_rows, second_rows = first_rows.clamp(0, size - 1), second_rows.clamp(0, size - 1)
    at = torch.arange(b, device=device)[:, None]
    first_vals = rows[:, first_rows, at]  # (Hc, B, w, d+1)
    second_vals = rows[:, second_rows, at]
    m = missing.to(dtype)
    forward = matrix.cells(first_rows, second_rows).to(dtype) * m  # (Hc, B, w, w) first -> second
    backward = matrix.cells(second_rows, first_rows).to(dtype) * m.transpose(1, 2)
    by_row = out.permute(1, 2, 0, 3)  # (S, B, Hc, d+1) view: the indexed dimensions first
    by_row.index_put_((first_rows, at), torch.matmul(forward, second_vals).permute(1, 2, 0, 3), accumulate=True)
    by_row.index_put_((second_rows, at), torch.matmul(backward, first_vals).permute(1, 2, 0, 3), accumulate=True)
    return out.view(hc, size, b * width)
