"""Fitting constants into the compact storage form (``hub_code/compact_constants.py``).

``compact_parts`` turns dense (Hc, L, L) matrices into the parts a compact checkpoint stores: the band and the
special slots' rows and columns exactly; every other cell as the head's relative-offset profile plus a rank-r
residual, fitted by alternating a truncated SVD with re-imposing the exactly stored cells (a few rounds of
low-rank matrix completion, so the rank is spent on the cells it has to represent). The converted model then
computes with ``rebuild(compact_parts(C))``: conversion, probes and the checkpoint all use those matrices.

``layout_for`` picks the layout ``convert`` uses when storage is ``auto``: dense up to L=128 (already smaller than
the source's query/key weights it replaces), compact above: band 16 and a rank-16 residual fitted here to dense
constants (constants calibrated into the structure, above L=512, have no residual by default: ``RESIDUAL_UP_TO``);
above L=2,048 the diagonal and no residual, so that the constants stay smaller than the query/key weights they
replace.
"""

from __future__ import annotations

import torch

from .. import registry
from ..hub_code.compact_constants import COMPACT_PARTS, CompactLayout, rebuild, special_slots
from .coverage import offset_means

STORAGES = ("auto", "dense", "compact")
DEFAULT_BAND = 16
DEFAULT_RANK = 16
# Above LONG_FROM the default layout shrinks to the diagonal, the special slots and the profile (about 1 + 2 + 2 or 3
# values per slot and head): band 16 and rank 16 would cost ~70 values per slot, which at L = 8,192 makes a
# fraction-1 ModernBERT-base checkpoint 1.9x its source instead of smaller, and even a rank-4 residual left it 1.04x
# (bench_long.py, size). The residual is worth little there: at L = 512 on all-MiniLM-L6-v2 rank 0 is 0.001 / 0.002
# below rank 16 in token / sentence cosine to the source (bench_structure_quality.py), and its calibration pass
# costs another forward over the corpus.
LONG_FROM = 2048
LONG_BAND = 0
LONG_RANK = 0
# Above RESIDUAL_UP_TO constants are calibrated into the structure (registry.DENSE_CALIBRATION_UP_TO), where a
# residual costs two more passes of the model over the corpus (its range, then the variance around it) on top of the
# one that gives everything else: a rank-16 residual made calibration ~3x slower at L = 2,048 for ~0.001 / 0.002
# token / sentence cosine to the source (all-MiniLM-L6-v2 at L = 512, bench_structure_quality.py). So none by
# default there; --compact-rank asks for one. Dense constants (``fitted``) get theirs fitted here at no pass, up to
# LONG_FROM as before.
RESIDUAL_UP_TO = registry.DENSE_CALIBRATION_UP_TO
DENSE_UP_TO = 128  # ``auto`` keeps dense matrices up to this L
COMPLETION_ROUNDS = 4
# A rebuilt row that keeps less than this share of its mass on some single input's slots drops its residual
# (``short_rows``): renormalising such a row multiplies it by more than 1 / MASS_KEPT, or divides by a sum <= 0.
MASS_KEPT = 0.5


def layout_for(storage: str, max_length: int, pairs: bool, band: int | None = None, rank: int | None = None,
               fitted: bool = False):  # fmt: skip
    """The ``CompactLayout`` for a ``--storage`` choice, or ``None`` for dense matrices. ``fitted``: the parts are
    fitted here to dense constants (the residual's default rank then reaches L = ``LONG_FROM``), not calibrated into
    the structure.

    Raises:
        ValueError: an unknown storage, or a band/rank that does not fit L.
    """
    if storage not in STORAGES:
        raise ValueError(f"unknown constants storage {storage!r}; choose one of {', '.join(STORAGES)}")
    if storage == "dense" or (storage == "auto" and max_length <= DENSE_UP_TO):
        return None
    long = max_length > LONG_FROM
    band = (LONG_BAND if long else DEFAULT_BAND) if band is None else int(band)
    with_residual = max_length <= (LONG_FROM if fitted else RESIDUAL_UP_TO)
    rank = (DEFAULT_RANK if with_residual else LONG_RANK) if rank is None else int(rank)
    if not (0 <= band < max_length and 0 <= rank <= max_length):
        raise ValueError(f"compact storage needs 0 <= band < L and 0 <= rank <= L (L={max_length}); got {band}, {rank}")
    return CompactLayout(max_length, band, rank, special_slots(max_length, pairs))


def compact_parts(values: torch.Tensor, layout: CompactLayout, dtype: torch.dtype = torch.float32) -> dict:
    """The compact parts (``COMPACT_PARTS``, in ``dtype``) that best represent ``values`` (Hc, L, L)."""
    c = values.detach().double().cpu()
    hc, length = c.shape[0], layout.max_length
    d = layout.offsets()  # (L, L)
    special = torch.zeros(length, dtype=torch.bool)
    special[list(layout.special)] = True
    far = (d.abs() > layout.band) & ~special[:, None] & ~special[None, :]  # (L, L) cells of profile + residual
    profile, _ = offset_means(c, far.double())  # (Hc, 2L-1); offsets with no far cell are never read
    toeplitz = profile[:, d + length - 1]  # (Hc, L, L)
    residual = c - toeplitz
    u = torch.zeros(hc, length, layout.rank, dtype=c.dtype)
    v = torch.zeros_like(u)
    if layout.rank:
        target = torch.where(far, residual, 0.0)
        for _ in range(COMPLETION_ROUNDS):  # cells stored exactly take the current fit's values: no rank spent there
            left, s, right = torch.linalg.svd(target, full_matrices=False)
            root = s[:, : layout.rank].sqrt()
            u, v = left[..., : layout.rank] * root[:, None], right[:, : layout.rank].transpose(-1, -2) * root[:, None]
            target = torch.where(far, residual, u @ v.transpose(-1, -2))
    k = torch.arange(-layout.band, layout.band + 1)
    cols = torch.arange(length)[:, None] + k[None, :]  # (L, 2w+1)
    inside = (cols >= 0) & (cols < length)
    band = torch.where(inside, c.gather(-1, cols.clamp(0, length - 1).expand(hc, -1, -1)), 0.0)
    index = torch.tensor(layout.special)
    parts = {
        "papa_constants_band": band,
        "papa_constants_rows": c[:, index, :],
        "papa_constants_cols": c[:, :, index],
        "papa_constants_profile": profile,
        "papa_constants_u": u,
        "papa_constants_v": v,
    }
    assert set(parts) == set(COMPACT_PARTS)
    if layout.rank and not layout.clamped:
        # those rows without their residual (row q of u @ v^T is u[q] @ v^T): profile, band and special slots, >= 0
        parts["papa_constants_u"][short_rows(c, rebuild(parts, layout))] = 0.0
    return {name: t.to(dtype).contiguous() for name, t in parts.items()}


def single_input_mass(c: torch.Tensor) -> torch.Tensor:
    """(Hc, L, L) float32: ``[h, n - 1, q]`` is row q of ``c`` summed over the slots an input of n tokens holds
    alone (``compute_slots``: slots 0 to n - 2 and the last slot), for n = 1 to L: what the row is divided by."""
    c = c.float()
    length = c.shape[-1]
    prefix = torch.nn.functional.pad(torch.cumsum(c[..., : length - 1], dim=-1), (1, 0))  # (Hc, L, L): slots < n-1
    return (prefix + c[..., length - 1 :]).transpose(-1, -2)


def short_rows(dense: torch.Tensor, rebuilt: torch.Tensor) -> torch.Tensor:
    """(Hc, L) bool: the rows of ``rebuilt`` (Hc, L, L) that keep less than ``MASS_KEPT`` of their mass in ``dense``
    on some single input that has their query. The residual is fitted to the cells, not to these sums: where a
    row's mass on an input's slots is small (slots few inputs reach), its errors can cancel the sum or turn it
    negative, and renormalising the row then blows it up (all-MiniLM-L6-v2, the average at L=256, one head: NaN
    for inputs of 215 tokens and more)."""
    length = dense.shape[-1]
    n, q = torch.arange(1, length + 1)[:, None], torch.arange(length)[None, :]
    real = (q < n - 1) | (q == length - 1)  # (n, q): the queries an input of n tokens has
    kept, given = single_input_mass(rebuilt), single_input_mass(dense.clamp_min(0))
    return (real & (given > 0) & (kept < MASS_KEPT * given)).any(1)  # (Hc, n, q) -> (Hc, q)


def drop_cancelling_residuals(parts: dict, layout: CompactLayout) -> int:
    """In place: the rows of constants calibrated into ``layout`` (parts ``(layers, heads, ...)``) whose residual
    cancels more than half of their own positive mass on some single input's slots lose their residual, as
    :func:`compact_parts` drops it for fitted ones (no dense matrices here: the row is judged against its own
    non-negative cells). Their sum there could reach 0 or below, and renormalising blew the row up (NaN for some
    input lengths). One head at a time, so a long L costs one head's (L, L). The number of rows it dropped."""
    u, dropped = parts["papa_constants_u"], 0
    for layer in range(u.shape[0]):
        for head in range(u.shape[1]):
            rebuilt = rebuild({name: t[layer, head : head + 1] for name, t in parts.items()}, layout)  # (1, L, L)
            short = short_rows(rebuilt, rebuilt)[0]  # (L,)
            u[layer, head, short] = 0.0
            dropped += int(short.sum())
    return dropped


def compacted(values: torch.Tensor, layout: CompactLayout, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(Hc, L, L) what a compact checkpoint computes with for ``values``: ``rebuild(compact_parts(values))``."""
    return rebuild(compact_parts(values, layout, dtype), layout)
