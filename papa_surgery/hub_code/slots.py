"""Slot layout (docs/design.md section 2) and the materialised constant attention.

A constant matrix C is defined on ``max_length`` (L) slots laid out like the paper's App. A: the first
segment starts at slot 0, a pair's middle separator(s) sit at L/2 (RoBERTa's ``</s></s>`` at L/2 and
L/2+1) with the second segment right after, and the last real token (the final separator) sits at L-1.
Inputs are never padded to L: each real token gets a slot index and a constant head reads
``C[slot_i, slot_j]`` for the example's real tokens only.

Every input of at most L tokens has a place, pairs included, so whatever the checkpoint's own tokenizer
produces at its ``model_max_length`` (= L) is valid. A pair whose segments fit their halves gets exactly
the paper's layout above. When one segment is longer than its half, the middle separator moves just enough
for it: it sits at ``min(max(L/2, a), L - 1 - b)``, where ``a`` is the number of tokens before it (``[CLS]``
and the first segment) and ``b`` the number from it to the final separator (the middle separator(s) and the
second segment). Slots never collide, the final separator stays at L-1, and a segment that fits its half
keeps its paper slots whenever the other one does too.

A local (sliding-window) layer passes its half window w: slots are not distances (a pair's second segment
starts at L/2, the final token sits at L-1), so the window is applied on token positions when the constant
is used, never baked into C (``constant_heads.py``).

Everything here is pure tensor arithmetic with no data-dependent Python branch, so a model that uses it
traces (``torch.export``, ONNX dynamo export, ``torch.compile(fullgraph=True)``). The one check on the
data, "does the input fit in L slots", is a ``ValueError`` in eager mode and a runtime assertion in a
traced graph (``slot_plan.py`` also makes an over-long example's outputs NaN, for exporters such as ONNX
that drop assertions).

The runtime computes constant heads without per-example (B, H, N, N) matrices (``constant_heads.py``).
:func:`constant_probs` materialises those matrices, for what needs them: ``output_attentions=True``, attention
dropout in training, and :func:`reference_constant_attention`, the plain gather-and-normalise definition the
fast path is tested against.

This file ships inside every PAPA checkpoint: it imports only torch.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

PAD_SLOT = -1
_BIG = torch.iinfo(torch.long).max // 4  # "no middle separator" (any rank is smaller)


def is_tracing() -> bool:
    """Whether the model is being traced (dynamo, torch.export, jit), where tensor values are unknown."""
    compiler = getattr(torch, "compiler", None)
    for name in ("is_compiling", "is_exporting"):
        check = getattr(compiler, name, None)
        if check is not None and check():
            return True
    return torch.jit.is_tracing()


class Placement(NamedTuple):
    """Where every token of a batch sits (what :func:`place_tokens` computes on the way to the slots).

    Attributes:
        slots: (B, N) slot of every token, ``PAD_SLOT`` for padding.
        real: (B, N) bool, the real tokens.
        rank: (B, N) position of each real token among its example's real tokens.
        n_real: (B, 1) real tokens per example.
        first_mid: (B, 1) rank of a pair's first middle separator (a huge number for a single segment).
        middle: (B, 1) slot of that separator (meaningless for a single segment).
    """

    slots: torch.Tensor
    real: torch.Tensor
    rank: torch.Tensor
    n_real: torch.Tensor
    first_mid: torch.Tensor
    middle: torch.Tensor


def place_tokens(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    max_length: int,
    sep_token_id: int | None = None,
    shape: tuple[int, int] | None = None,
    device: torch.device | None = None,
    check: bool = True,
) -> Placement:
    """The slot of every token and what it was derived from; :func:`compute_slots` says what the arguments are.

    ``check=False`` leaves the "fits in L slots" check to the caller (``slot_plan.py`` folds it into its own
    single host sync).
    """
    if attention_mask is not None:
        real = attention_mask.bool()
    elif input_ids is not None:
        real = torch.ones_like(input_ids, dtype=torch.bool)
    else:
        real = torch.ones(shape, dtype=torch.bool, device=device)
    if real.dim() != 2:
        raise ValueError(f"expected a (batch, length) attention mask, got shape {tuple(real.shape)}")
    n_real = real.sum(-1, keepdim=True)  # (B, 1)
    rank = real.long().cumsum(-1) - 1  # (B, N) position among the example's real tokens
    is_last = real & (rank == n_real - 1)

    # First middle separator: a separator that is not the example's last real token.
    if input_ids is not None and sep_token_id is not None:
        middle_sep = real & (input_ids == sep_token_id) & ~is_last
        first_mid = torch.where(middle_sep, rank, torch.full_like(rank, _BIG)).amin(-1, keepdim=True)  # (B, 1)
    else:
        first_mid = torch.full_like(n_real, _BIG)
    # The middle separator's slot: L/2 when both segments fit their halves, else just where the longer fits.
    rest = n_real - 1 - first_mid  # (B, 1) middle separator(s) and second segment
    middle = torch.minimum(first_mid.clamp_min(max_length // 2), max_length - 1 - rest)

    slots = torch.where(rank < first_mid, rank, middle + rank - first_mid)
    slots = torch.where(is_last, torch.full_like(slots, max_length - 1), slots)
    slots = torch.where(real, slots, torch.full_like(slots, PAD_SLOT))
    if check:
        check_fits(n_real, max_length)
    return Placement(slots, real, rank, n_real, first_mid, middle)


def compute_slots(
    input_ids: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    max_length: int,
    sep_token_id: int | None = None,
    shape: tuple[int, int] | None = None,
    device: torch.device | None = None,
) -> torch.Tensor:
    """Slot index of every token, ``PAD_SLOT`` (-1) for padding.

    Args:
        input_ids: (B, N) token ids, used to find a pair's middle separator(s); ``None`` when the model
            is called with ``inputs_embeds`` (every input is then a single segment).
        attention_mask: (B, N) with 1 for real tokens; ``None`` means no padding. Left and right padding
            both work: slots follow the order of the real tokens.
        max_length: L, the number of slots.
        sep_token_id: the separator id; ``None`` disables pair detection.
        shape, device: needed only when both ``input_ids`` and ``attention_mask`` are ``None``.

    Returns:
        (B, N) long tensor of slots.

    Raises:
        ValueError: an input longer than L.
    """
    return place_tokens(input_ids, attention_mask, max_length, sep_token_id, shape, device).slots


def too_long_message(worst: int | None, max_length: int) -> str:
    """What an input longer than the slots gets told: the eager ``ValueError`` and, without the token count
    (unknown while tracing), the traced graph's assertion."""
    found = f"input has {worst} tokens" if worst is not None else "an input has more tokens than the slots"
    return (
        f"{found} but the constant attention covers only papa_max_length={max_length} slots; truncate inputs "
        f"(tokenizer(..., truncation=True, max_length={max_length})) or use constants calibrated with a larger "
        f"--max-length"
    )


def check_fits(n_real: torch.Tensor, max_length: int) -> None:
    """Raise a ValueError naming the limit when an input has more than L real tokens (one host sync).

    In a traced graph the values are unknown: the check becomes a runtime assertion instead.
    """
    too_long = n_real > max_length  # (B, 1)
    if is_tracing():
        torch._assert_async(~too_long.any(), too_long_message(None, max_length))
        return
    worst = int(n_real.max()) if n_real.numel() else 0
    if worst > max_length:
        raise ValueError(too_long_message(worst, max_length))


def window_mask(n: int, window: int, device=None) -> torch.Tensor:
    """(N, N) bool: token j lies within distance ``window`` of token i (a local layer's sliding window)."""
    i = torch.arange(n, device=device)
    return (i[:, None] - i[None, :]).abs() <= window


def _probs(constants: torch.Tensor, slots: torch.Tensor, window: int | None = None, clamp: bool = True) -> torch.Tensor:
    """(Hc, B, N, N) float32 masked, row-normalised constants (see :func:`constant_probs`)."""
    hc, length = constants.shape[0], constants.shape[-1]
    constants = constants.float().clamp_min(0) if clamp else constants.float()
    # A zero row and column at index L stand for padding, so one gather also applies the mask.
    padded = torch.nn.functional.pad(constants, (0, 1, 0, 1))  # (Hc, L+1, L+1)
    s = torch.where((slots >= 0) & (slots < length), slots, torch.full_like(slots, length))  # (B, N)
    cells = s[:, :, None] * (length + 1) + s[:, None, :]  # (B, N, N) into the flat (L+1)^2 grid
    p = padded.reshape(hc, -1)[:, cells]  # (Hc, B, N, N)
    if window is not None:
        # Local layer: token positions, not slots, decide the window (real tokens are contiguous on either
        # padding side, so padded-index distance is the real distance, as in the model's own mask).
        p = p * window_mask(p.shape[-1], window, p.device)
    # Division by a clamped denominator keeps empty rows at 0 without a data-dependent branch.
    return p / p.sum(-1, keepdim=True).clamp_min(torch.finfo(p.dtype).tiny)


def constant_probs(
    constants: torch.Tensor, slots: torch.Tensor, dtype: torch.dtype, window: int | None = None, clamp: bool = True
) -> torch.Tensor:
    """Masked, row-normalised constants of each example (the paper's footnote 8), materialised.

    Args:
        constants: (Hc, L, L) constant matrices of a layer's constant heads (any float dtype; negative
            entries count as 0).
        slots: (B, N) from :func:`compute_slots`.
        dtype: dtype of the result (the value vectors' dtype).
        window: a local layer's half window w: the mask also drops tokens farther than w apart.
        clamp: count negative entries as 0 (dense constants); compact constants of format 2 pass ``False``:
            they are used as stored (``structured_constants.py``).

    Returns:
        (B, Hc, N, N) attention probabilities. A row with no mass (a slot no calibration example reached,
        the ``zeros`` kind, a padding query) is all zeros, so its head output is zero.
    """
    return _probs(constants, slots, window, clamp).transpose(0, 1).to(dtype)


def reference_constant_attention(
    constants: torch.Tensor,
    slots: torch.Tensor,
    value: torch.Tensor,
    dropout: float = 0.0,
    window: int | None = None,
    clamp: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Context vectors of constant heads by definition: ``dropout(rownorm(C[slots] * mask)) @ V``.

    The materialised (B, Hc, N, N) path: the reference ``constant_heads.constant_attention`` is tested against,
    and what runs where per-example matrices are needed anyway (attention dropout in training).

    Args:
        constants: (Hc, L, L) constant matrices.
        slots: (B, N) slot of every token (``PAD_SLOT`` for padding).
        value: (B, Hc, N, d) value vectors of the constant heads.
        dropout: attention dropout probability (pass 0 in eval mode).
        window: a local layer's half window w.
        clamp: count negative entries as 0 (see :func:`constant_probs`).

    Returns:
        context (B, Hc, N, d) and the probabilities used (B, Hc, N, N), after dropout.
    """
    p = constant_probs(constants, slots, value.dtype, window, clamp)  # (B, Hc, N, N)
    if dropout > 0:
        p = torch.nn.functional.dropout(p, p=dropout, training=True)
    return torch.matmul(p, value), p
