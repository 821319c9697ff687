"""Slot coverage: filling the cells no calibration example reached, and warning when a corpus is short.

A corpus of short lines reaches only the first slots: a longer input would meet constant rows with no
mass, and a constant head would silently output zero for those tokens. ``fill_uncovered`` fills every
cell no example reached (``counts == 0``) from what was measured for the same head:

- a body cell (neither slot special) gets the head's relative-offset (Toeplitz) profile: the
  count-weighted mean of its covered body cells at the same offset ``j - i`` (an offset no example reached
  takes the nearest measured offset's value);
- a body query attending to a special slot ([CLS] at 0, the final separator at L-1, a pair's middle
  separator at L/2) gets the head's mean attention from covered body rows to that slot;
- a special query attending to a body slot gets that special row's mean over its covered body cells.

The counts stay with the constants, so which cells were filled remains known (``Constants.filled_cells``).
Filling is idempotent: filled cells are recomputed from covered ones only.
"""

from __future__ import annotations

import contextlib
import contextvars
import warnings

import torch

from ..hub_code.compact_constants import special_slots

FILL_METHOD = "toeplitz-profile+special-slots"


class CoverageWarning(UserWarning):
    """The calibration corpus reaches fewer slots than ``max_length``: longer inputs use filled constants."""


def coverage_summary(coverage: torch.Tensor, max_length: int, filled_cells: int) -> dict:
    """JSON-ready coverage facts of a constants object (``summary()``): ``coverage`` (L,) examples per slot."""
    seen = int((coverage > 0).sum())
    return {
        "slots_seen": seen,
        "slots_total": max_length,
        "min_examples_per_seen_slot": int(coverage[coverage > 0].min()) if seen else 0,
        "examples_at_slot_0": int(coverage[0]),
        "slots_with_10_examples": int((coverage >= 10).sum()),  # averages of fewer examples are noisy
        "filled_cells": int(filled_cells),  # no example reached them; they are filled (fill_uncovered)
    }


def covered_length(counts: torch.Tensor) -> int:
    """How many slots at least one calibration example reached (for single sentences: the longest example).

    ``counts``: the (L, L) per-cell counts, or the (L,) per-slot coverage (structured constants keep only that).
    """
    coverage = counts.diagonal() if counts.dim() == 2 else counts
    return int((coverage > 0).sum())


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Mean of ``values`` (..., L, L) weighted by ``weights`` (L, L) along ``dim``, and the weight totals."""
    total = weights.sum(dim)
    mean = (values * weights).sum(dim) / total.clamp_min(1e-30)
    return mean, total


def offset_means(values: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """A relative-offset (Toeplitz) profile: the ``weights``-weighted mean of ``values`` (..., L, L) per offset.

    Returns:
        (..., 2L-1) the mean at offset j - i (index j - i + L - 1; 0 where no cell has weight), and (2L-1,)
        the weight total per offset.
    """
    length = values.shape[-1]
    idx = torch.arange(length)
    offset = (idx[None, :] - idx[:, None] + length - 1).reshape(-1)  # (L*L,)
    flat = (values * weights).reshape(*values.shape[:-2], -1)  # (..., L*L)
    sums = torch.zeros(*values.shape[:-2], 2 * length - 1, dtype=values.dtype).index_add_(-1, offset, flat)
    totals = torch.zeros(2 * length - 1, dtype=values.dtype).index_add_(0, offset, weights.reshape(-1))
    return sums / totals.clamp_min(1e-30), totals


def _profile(values: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """(..., 2L-1) count-weighted mean of body cells per offset j - i + L - 1, gaps from the nearest offset."""
    return nearest_measured(*offset_means(values, weights))


def nearest_measured(profile: torch.Tensor, totals: torch.Tensor) -> torch.Tensor:
    """(..., 2L-1) ``profile`` where an offset has weight in ``totals`` (2L-1,), else the nearest weighted offset's."""
    measured = (totals > 0).nonzero().squeeze(-1)  # (M,) increasing
    if measured.numel() == 0:  # no body cell at all (examples of special tokens only): special slots only
        return profile
    offsets = torch.arange(totals.shape[0])
    after = torch.searchsorted(measured, offsets).clamp(max=len(measured) - 1)  # the first measured >= each offset
    before = (after - 1).clamp_min(0)
    # the nearer of the two neighbours, the lower one on a tie (argmin's choice, which this replaced: O(L) not O(L^2))
    closer = (offsets - measured[before]).abs() <= (measured[after] - offsets).abs()
    return profile[..., measured[torch.where(closer, before, after)]]


def fill_uncovered(values: torch.Tensor, counts: torch.Tensor, pairs: bool) -> torch.Tensor:
    """``values`` (layers, heads, L, L) with every cell where ``counts`` (L, L) is 0 filled (module docstring).

    Covered cells are returned unchanged; the result is float32 like ``values``.
    """
    length = values.shape[-1]
    covered = counts > 0  # (L, L)
    if bool(covered.all()):
        return values
    c = values.double()
    special = torch.zeros(length, dtype=torch.bool)
    special[list(special_slots(length, pairs))] = True
    body = ~special
    w = torch.where(covered, counts.double(), 0.0)  # (L, L)
    w_body = w * (body[:, None] & body[None, :])

    idx = torch.arange(length)
    profile = _profile(c, w_body)  # (layers, heads, 2L-1)
    estimate = profile[..., idx[None, :] - idx[:, None] + length - 1]  # (layers, heads, L, L) Toeplitz
    # Body queries attending to a special slot: the head's mean over covered body rows, per special column.
    to_special, seen = _weighted_mean(c, w * body[:, None], dim=-2)  # (layers, heads, L) per column
    columns = special & (seen > 0)
    estimate[..., body[:, None] & columns[None, :]] = to_special[..., None, :].expand_as(estimate)[
        ..., body[:, None] & columns[None, :]
    ]
    # Special queries attending to a body slot: that row's mean over its covered body cells.
    from_special, seen = _weighted_mean(c, w * body[None, :], dim=-1)  # (layers, heads, L) per row
    rows = special & (seen > 0)
    estimate[..., rows[:, None] & body[None, :]] = from_special[..., :, None].expand_as(estimate)[
        ..., rows[:, None] & body[None, :]
    ]
    return torch.where(covered, c, estimate.clamp_min(0)).to(values.dtype)


def coverage_message(counts: torch.Tensor, max_length: int, pairs: bool) -> str | None:
    """The warning text when the corpus reaches fewer than ``max_length`` slots, else ``None``."""
    seen = covered_length(counts)
    if seen >= max_length:
        return None
    from ..failures import spell

    what = "" if pairs else f" (its longest example has {seen} tokens)"
    smaller = "" if pairs else f" (e.g. {spell('max_length', max(seen, 2))})"
    return (
        f"the calibration corpus covers only {seen} of the {max_length} slots{what}: "
        f"longer inputs use constants filled from each head's relative-offset profile and special-slot attention, "
        f"not measured ones. For measured constants, calibrate on a corpus with longer examples or use a smaller "
        f"{spell('max_length').removesuffix('=...')}{smaller}."
    )


@contextlib.contextmanager
def coverage_unsaid():
    """Inside, :func:`warn_coverage` says nothing and leaves the constants unmarked: constants made for another use
    than a model's (a ranking's reading) warn once a model gets them, and constants a model never gets (a data-free
    kind's model has its own) never blame their corpus."""
    token = _UNSAID.set(True)
    try:
        yield
    finally:
        _UNSAID.reset(token)


_UNSAID = contextvars.ContextVar("papa_coverage_unsaid", default=False)


def warn_coverage(constants, stacklevel: int = 3) -> None:
    """Warn (``CoverageWarning``), once per ``Constants`` object, when its corpus covers fewer than L slots."""
    coverage = constants.coverage  # (L,) examples per slot; None for data-free kinds
    if coverage is None or getattr(constants, "_coverage_warned", False) or _UNSAID.get():
        return
    message = coverage_message(coverage, constants.max_length, constants.pairs)
    constants._coverage_warned = True
    if message:
        warnings.warn(message, CoverageWarning, stacklevel=stacklevel)
