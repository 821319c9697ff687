"""Where a batch's tokens sit in one shared, compressed slot space: computed once per forward, used by every layer.

A constant head gives token i ``sum_j C[s_i, s_j] m_j v_j / sum_j C[s_i, s_j] m_j`` (``rownorm(C * mask) V``). The
slots a batch uses are few and the same for every example up to a shift of its second segment, so the batch is
laid out once in a *compressed slot space* of S = 1 + K + M rows:

- row 0: the final separator (slot L-1);
- rows 1 .. K: slots 0 .. K-1 (the first segment, and any single sentence up to L/2 tokens);
- rows K+1 .. K+M: slots L/2 .. L/2+M-1 (a pair's middle separator and second segment, or the tail of a long
  single sentence);

where K and M are the largest extents any example of the batch reaches. Every example's tokens land on
distinct rows of it, so one matrix ``C_S`` (C's rows and columns of those slots) serves the whole batch: each
layer scatters ``[v | 1]`` of every token into an (S, B, d+1) block, multiplies it by ``C_S`` in one GEMM per
head with the batch folded into the wide dimension, and reads numerator and normaliser of every token back
(``constant_heads.py``). That costs S^2 (d+1) per head and example, about N^2 (d+1) for a batch of N tokens.

This plan (row of every token, the row/column masks, and for local layers each row's token rank) is
input-dependent but layer-independent: the PAPA model builds it once in its ``forward`` and passes it down.
In eager mode K and M are read from the batch with the single host sync that also checks the input fits;
while tracing they are bounds from the batch's length N (K <= min(N, L/2), M <= min(N, L-1-L/2)), so an
exported graph has no data-dependent shape.

This file ships inside every PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

import torch

from .slots import _BIG, PAD_SLOT, check_fits, is_tracing, place_tokens, too_long_message


class SlotPlan:
    """A batch's layout in the compressed slot space (see the module docstring); built once per forward.

    Attributes:
        slots: (B, N) slot of every token (``PAD_SLOT`` for padding).
        max_length: L.
        first, second: K and M, the extents of the two slot ranges in use (ints; bounds while tracing).
        size: S = 1 + K + M rows.
        rows: (B*N,) row of every token in the compressed space, S (a scratch row) for padding; ``cols`` (B*N,)
            is its example.
        gather: (B*N,) the row every token reads its result from (``rows`` with 0 for padding).
        token_scale: (B*N, 1) 1 for a real token, 0 for padding, NaN for every token of an example that does
            not fit the slots (traced graphs only, whose exporters may drop the assertion: a wrong input
            gives NaN rather than a plausible number).
        row_mask: (S, B) how many tokens of each example sit on each row (0 or 1), the normaliser's input.
        slot_order: (S,) the slot of every compressed row (which rows and columns of C form ``C_S``).
        structured: the slots come from the model's own layout (``place_tokens``), not from the caller; then
            every example's tokens are contiguous runs of rows with one jump at a pair's middle, which is what
            lets a local layer apply its window in this space (``window_rows``).
    """

    def __init__(self, slots: torch.Tensor, max_length: int, first, second, structured: bool, bad=None, places=None):
        self.slots, self.max_length, self.structured = slots, int(max_length), structured
        self.first, self.second = first, second
        self.size = 1 + first + second
        b, n = slots.shape
        half, device = self.max_length // 2, slots.device
        real = slots >= 0
        row = torch.where(slots < half, 1 + slots, 1 + first + slots - half)
        row = torch.where(slots == self.max_length - 1, torch.zeros_like(row), row).clamp(0, self.size - 1)
        row = torch.where(real, row, torch.full_like(row, self.size))  # (B, N), S for padding
        example = torch.arange(b, device=device)[:, None].expand(b, n)
        self.rows, self.cols = row.reshape(-1), example.reshape(-1)
        self.gather = torch.where(real, row, torch.zeros_like(row)).reshape(-1)
        scale = real.float()
        if bad is not None:  # (B, 1) examples that do not fit (traced only)
            scale = torch.where(bad & real, torch.full_like(scale, float("nan")), scale)
        self.token_scale = scale.reshape(-1, 1)
        counts = torch.zeros(self.size + 1, b, device=device)
        self.row_mask = counts.index_put_((self.rows, self.cols), torch.ones_like(scale).reshape(-1), accumulate=True)[
            : self.size
        ]  # (S, B)
        self.slot_order = torch.cat(
            [
                torch.full((1,), self.max_length - 1, device=device, dtype=torch.long),
                torch.arange(first, device=device),
                half + torch.arange(second, device=device),
            ]
        )
        self._places = places  # rank (B, N), n_real, first_mid, middle (B,): for window_rows
        # What layers derive from the plan alone (row_tokens, flat_rows, window_rows, jumps, the band's cell indices
        # of a local layer's window), made by the first layer that needs it and kept for the plan's every layer
        # (``kept``); never while tracing.
        self.derived: dict = {}

    @property
    def batch(self) -> int:
        return self.slots.shape[0]

    @property
    def row_tokens(self) -> torch.Tensor:
        """(S, B) the token on each row of each example, as an index into the (B N) flattened tokens (0 where the
        row is empty: ``row_mask`` says which). Structured plans only, whose rows hold one token of an example at
        most; built on first use and kept for the plan's every layer."""

        def make() -> torch.Tensor:
            b, n = self.slots.shape
            flat = torch.zeros((self.size + 1) * b, dtype=torch.long, device=self.slots.device)
            tokens = torch.arange(b * n, device=self.slots.device)
            return flat.index_put_((self.rows * b + self.cols,), tokens).view(self.size + 1, b)[: self.size]

        return self.kept("row_tokens", make)

    @property
    def flat_rows(self) -> torch.Tensor:
        """(B*N,) each token's (``gather`` row, example) in the (S B)-flattened rows; kept for the plan's every
        layer."""
        return self.kept("flat_rows", lambda: self.gather * self.batch + self.cols)

    def kept(self, key, make):
        """``make()``, made by the first layer that asks and kept in ``derived`` for the plan's others; made afresh
        while tracing (a graph computes it where it is used)."""
        if is_tracing():
            return make()
        if key not in self.derived:
            self.derived[key] = make()
        return self.derived[key]

    @classmethod
    def from_tokens(
        cls,
        input_ids: torch.Tensor | None,
        attention_mask: torch.Tensor | None,
        max_length: int,
        sep_token_id: int | None = None,
        shape: tuple[int, int] | None = None,
        device: torch.device | None = None,
    ) -> SlotPlan:
        """The plan of a batch laid out by the model itself (``slots.place_tokens``; same arguments).

        Raises:
            ValueError: an input longer than L (eager mode; a runtime assertion and NaN outputs while tracing).
        """
        places = place_tokens(input_ids, attention_mask, max_length, sep_token_id, shape, device, check=False)
        slots, half = places.slots, max_length // 2
        bad = None
        if is_tracing():
            check_fits(places.n_real, max_length)
            n = slots.shape[1]
            first = torch.sym_min(n, half)
            pairs = input_ids is not None and sep_token_id is not None
            second = torch.sym_min(n, max_length - 1 - half) if pairs else torch.sym_max(n - 1 - half, 0)
            bad = places.n_real > max_length
        else:
            first, second, worst = _extents(slots, max_length, places.n_real)
            if worst > max_length:
                raise ValueError(too_long_message(worst, max_length))
        kept = (places.rank, places.n_real[:, 0], places.first_mid[:, 0], places.middle[:, 0])
        return cls(slots, max_length, first, second, True, bad, kept)

    @classmethod
    def from_slots(cls, slots: torch.Tensor, max_length: int) -> SlotPlan:
        """The plan of slots given by the caller (``papa_slots=``): any slots in [0, L), -1 for padding.

        Raises:
            ValueError: a slot outside [-1, L) (eager mode).
        """
        if slots.dim() != 2:
            raise ValueError(f"papa_slots must be (batch, length), got shape {tuple(slots.shape)}")
        half = max_length // 2
        if is_tracing():  # nothing is known about explicit slots: the whole slot space
            bad = ((slots < PAD_SLOT) | (slots >= max_length)).any(-1, keepdim=True)
            return cls(slots, max_length, half, max_length - 1 - half, False, bad)
        first, second, _ = _extents(slots, max_length)
        if slots.numel() and bool(((slots < PAD_SLOT) | (slots >= max_length)).any()):
            raise ValueError(
                f"papa_slots must lie in [-1, {max_length}) (papa_max_length={max_length}); -1 marks padding"
            )
        return cls(slots, max_length, first, second, False)

    def window_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """What a local layer needs to apply its window in the compressed space (structured plans only); made by
        the first local layer and kept for the plan's others (``kept``).

        Within a segment, rows are as far apart as their tokens; across a pair's middle they are ``jump`` rows
        farther; the final separator (row 0) is apart from everything.

        Returns:
            rank (S, B) of the token on each row (-huge where none), n_real (B,), before (B,) the row of the
            last token before a pair's middle separator (-1 for a single segment), jump (B,) the extra rows
            between it and the middle separator's row (0 for a single segment).
        """
        return self.kept("window_rows", self._window_rows)

    def _window_rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        rank, n_real, first_mid, middle = self._places
        b = self.batch
        flat = torch.full(((self.size + 1) * b,), -_BIG, dtype=torch.long, device=self.slots.device)
        flat = flat.index_put_((self.rows * b + self.cols,), rank.reshape(-1))
        rank_rows = flat.view(self.size + 1, b)[: self.size]  # (S, B)
        half = self.max_length // 2
        pair = (first_mid < n_real - 1) & (first_mid > 0)  # a middle separator with a first segment before it

        def row_of(slot: torch.Tensor) -> torch.Tensor:
            return torch.where(slot < half, 1 + slot, 1 + self.first + slot - half)

        last_first = row_of(torch.where(pair, first_mid - 1, torch.zeros_like(first_mid)))  # slot = rank there
        before = torch.where(pair, last_first, torch.full_like(first_mid, -1))
        jump = torch.where(pair, row_of(torch.where(pair, middle, torch.zeros_like(middle))) - last_first - 1, 0)
        return rank_rows, n_real, before, jump

    def jumps(self) -> bool:
        """Whether a pair's rows jump at its middle in some example (``window_rows``' ``jump``): one host sync for
        the plan's every local layer; ``True`` while tracing (the graph keeps the general case)."""
        return is_tracing() or self.kept("jumps", lambda: bool(self.window_rows()[3].any()))


def _extents(slots: torch.Tensor, max_length: int, n_real: torch.Tensor | None = None) -> tuple[int, int, int]:
    """K, M and the longest example of an eager batch, read with one host sync."""
    if not slots.numel():
        return 0, 0, 0
    half = max_length // 2
    real_a = (slots >= 0) & (slots < half)
    real_b = (slots >= half) & (slots < max_length - 1)
    stats = [
        torch.where(real_a, slots + 1, torch.zeros_like(slots)).amax(),
        torch.where(real_b, slots - half + 1, torch.zeros_like(slots)).amax(),
        n_real.amax() if n_real is not None else slots.new_zeros(()),
    ]
    first, second, worst = torch.stack(stats).tolist()
    return int(first), int(second), int(worst)
