"""Slot layout: where each real token of an input sits in a constant matrix (DESIGN.md section 3).

A constant matrix C is defined on ``max_length`` (L) slots laid out like the paper's App. A: the first
segment starts at slot 0, a pair's middle separator(s) sit at L/2 (RoBERTa's ``</s></s>`` at L/2 and
L/2+1) with the second segment right after, and the last real token (the final separator) sits at L-1.
Inputs are never padded to L: each real token gets a slot index and a constant head reads
``C[slot_i, slot_j]`` for the example's real tokens only.

This file ships inside every PAPA checkpoint: it imports only torch.
"""

from __future__ import annotations

import torch

PAD_SLOT = -1


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
        ValueError: an input longer than L, or a pair segment that does not fit its half of L.
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
    big = torch.iinfo(torch.long).max // 4
    if input_ids is not None and sep_token_id is not None:
        middle = real & (input_ids == sep_token_id) & ~is_last
        first_mid = torch.where(middle, rank, torch.full_like(rank, big)).amin(-1, keepdim=True)  # (B, 1)
    else:
        first_mid = torch.full_like(n_real, big)
    is_pair = first_mid < big
    half = max_length // 2

    slots = torch.where(rank < first_mid, rank, half + rank - first_mid)
    slots = torch.where(is_last, torch.full_like(slots, max_length - 1), slots)
    slots = torch.where(real, slots, torch.full_like(slots, PAD_SLOT))

    _check_fits(n_real, first_mid, is_pair, max_length)
    return slots


def _check_fits(n_real: torch.Tensor, first_mid: torch.Tensor, is_pair: torch.Tensor, max_length: int) -> None:
    """Raise a ValueError naming the limit when an input does not fit the slot layout (one host sync)."""
    half = max_length // 2
    too_long = n_real > max_length
    # Pair: first segment in slots [0, L/2); separators + second segment in [L/2, L-1); final token at L-1.
    first_too_long = is_pair & (first_mid > half)
    second_too_long = is_pair & (n_real - 1 - first_mid > max_length - 1 - half)
    bad = torch.cat([too_long, first_too_long, second_too_long], dim=-1)
    if not bool(bad.any()):
        return
    fix = (
        f"truncate inputs (tokenizer(..., truncation=True, max_length={max_length})) or use constants "
        f"calibrated with a larger --max-length"
    )
    if bool(too_long.any()):
        worst = int(n_real.max())
        raise ValueError(
            f"input has {worst} tokens but the constant attention covers only papa_max_length={max_length} slots; {fix}"
        )
    if bool(first_too_long.any()):
        worst = int(first_mid[first_too_long].max())
        raise ValueError(
            f"the first segment of a sentence pair has {worst} tokens but only {half} slots lie before the "
            f"middle separator (papa_max_length={max_length}); each segment of a pair must fit its half: "
            f"truncate the longer segment (tokenizer(a, b, truncation='longest_first', "
            f"max_length={half})) or use a larger --max-length"
        )
    worst = int((n_real - 1 - first_mid)[second_too_long].max())
    raise ValueError(
        f"the second segment of a sentence pair (with its separators) has {worst} tokens but only "
        f"{max_length - 1 - half} slots lie between the middle separator and the final one "
        f"(papa_max_length={max_length}); each segment of a pair must fit its half: truncate the longer "
        f"segment or use a larger --max-length"
    )


class SlotLayout:
    """The slots of one batch, with what every constant head of every layer can share.

    Built once per forward pass; each layer then only gathers its own constants. Examples with the same
    slots (same length and separators) share one normalised matrix, so a batch of equal-length inputs
    gathers and normalises a single (N, N) matrix per head.
    """

    def __init__(self, slots: torch.Tensor, max_length: int):
        self.slots = slots  # (B, N)
        self.max_length = max_length
        self.unique, self.inverse = torch.unique(slots, dim=0, return_inverse=True)  # (U, N), (B,)
        real = self.unique >= 0  # (U, N)
        s = self.unique.clamp_min(0)
        self.cell_index = s[:, :, None] * max_length + s[:, None, :]  # (U, N, N) into the flat L*L grid
        self.cell_mask = real[:, :, None] & real[:, None, :]  # (U, N, N)

    @property
    def shared(self) -> bool:
        """Whether every example of the batch has the same slots."""
        return self.unique.shape[0] == 1

    def probs(self, constants: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        """Masked, row-normalised constants per unique layout.

        Args:
            constants: (Hc, L, L) constant matrices of the constant heads.
            dtype: dtype of the result (the value vectors' dtype).

        Returns:
            (Hc, U, N, N) attention probabilities; a row with no mass (an unseen slot, the ``zeros``
            kind, a padding query) is all zeros, so its head output is zero.
        """
        hc = constants.shape[0]
        flat = constants.float().clamp_min(0).reshape(hc, -1)  # (Hc, L*L)
        p = flat[:, self.cell_index] * self.cell_mask  # (Hc, U, N, N)
        denom = p.sum(-1, keepdim=True)  # (Hc, U, N, 1)
        p = torch.where(denom > 0, p / denom.clamp_min(torch.finfo(p.dtype).tiny), torch.zeros_like(p))
        return p.to(dtype)

    def per_example(self, probs: torch.Tensor) -> torch.Tensor:
        """(Hc, U, N, N) -> (B, Hc, N, N)."""
        return probs[:, self.inverse].transpose(0, 1)

    def apply(self, probs: torch.Tensor, value: torch.Tensor, batch_order: bool = False) -> torch.Tensor:
        """Constant-head context vectors.

        Args:
            probs: (Hc, U, N, N) from :meth:`probs` (one matrix per unique layout), or, with
                ``batch_order=True``, (Hc, B, N, N) in batch order (e.g. after per-example dropout).
                The two cannot be told apart by shape (U may equal B with the layouts in another order),
                so the caller says which it passes.
            value: (B, Hc, N, d) value vectors of the constant heads.
            batch_order: whether ``probs`` is already in batch order.

        Returns:
            (B, Hc, N, d).
        """
        b, hc, n, d = value.shape
        if not batch_order:
            if probs.shape[1] != self.unique.shape[0]:
                raise ValueError(f"expected probabilities for {self.unique.shape[0]} layouts, got {probs.shape[1]}")
            if self.shared and b > 1:
                # One layout for the whole batch: a single (N, N) @ (N, B*d) product per head.
                v = value.permute(1, 2, 0, 3).reshape(hc, n, b * d)  # (Hc, N, B*d)
                out = torch.matmul(probs[:, 0], v)  # (Hc, N, B*d)
                return out.view(hc, n, b, d).permute(2, 0, 1, 3)  # (B, Hc, N, d)
            probs = probs[:, self.inverse]  # (Hc, B, N, N)
        elif probs.shape[1] != b:
            raise ValueError(f"expected per-example probabilities for {b} examples, got {probs.shape[1]}")
        return torch.matmul(probs.transpose(0, 1), value)  # (B, Hc, N, d)
