"""Compact storage of constant matrices: a structured form rebuilt into (Hc, L, L) on every forward.

A dense constant matrix costs L*L values per head: at L=512 a fraction-1 BERT-base checkpoint would be bigger
than its source. Averaged attention has structure: most of a row's mass lies near the diagonal and on the
special slots ([CLS], separators), and the rest varies smoothly with the offset j - i. The compact form keeps:

- ``papa_constants_band`` (Hc, L, 2w+1): the cells within ``w`` of the diagonal, exactly;
- ``papa_constants_rows`` (Hc, S, L) and ``papa_constants_cols`` (Hc, L, S): the special slots' rows and
  columns, exactly;
- ``papa_constants_profile`` (Hc, 2L-1) and ``papa_constants_u``/``papa_constants_v`` (Hc, L, r): every other
  cell as the head's relative-offset (Toeplitz) profile plus a rank-r residual.

The library fits this form once at conversion (``papa_surgery.calibration.compaction``), and the converted model
computes with the rebuilt matrices from then on, so what was evaluated is exactly what a checkpoint computes. The
rebuild is pure tensor arithmetic (traceable) and costs Hc * L * L * r multiply-adds per layer, independent of the
batch; eager forwards reuse the rebuilt matrices until a part changes.

This file ships inside every PAPA checkpoint: it imports only torch and siblings.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .checkpoint_format import format_of
from .slots import is_tracing

COMPACT_PARTS = (
    "papa_constants_band",
    "papa_constants_rows",
    "papa_constants_cols",
    "papa_constants_profile",
    "papa_constants_u",
    "papa_constants_v",
)


@dataclass(frozen=True)
class CompactLayout:
    """How one checkpoint stores its constants compactly.

    Attributes:
        max_length: L.
        band: w, the diagonals -w..w stored exactly.
        rank: r, the rank of the residual off the band.
        special: slots whose rows and columns are stored exactly ([CLS] at 0, the final separator at L-1, and a
            pair's middle separator at L/2 for constants calibrated on pairs).
        clamped: the matrices are their dense rebuild clamped at 0 (checkpoints of format 1). From format 2 the
            parts are used as stored, which is what lets a long input apply them without rebuilding them
            (``structured_constants.py``).
    """

    max_length: int
    band: int
    rank: int
    special: tuple[int, ...]
    clamped: bool = False

    @classmethod
    def from_config(cls, config) -> CompactLayout | None:
        """The layout a PAPA config asks for (``papa_compact_band``/``papa_compact_rank``), ``None`` for dense."""
        band, rank = getattr(config, "papa_compact_band", None), getattr(config, "papa_compact_rank", None)
        if band is None or rank is None:
            return None
        length = int(config.papa_max_length)
        pairs = getattr(config, "papa_calibrated_on", None) == "pairs"
        clamped = format_of(config) < 2  # a config without a format is format 1 (checkpoint_format.py)
        return cls(length, int(band), int(rank), special_slots(length, pairs), clamped)

    def shapes(self, heads: int) -> dict[str, tuple[int, ...]]:
        """Shape of every stored part for ``heads`` constant heads."""
        length, s = self.max_length, len(self.special)
        return {
            "papa_constants_band": (heads, length, 2 * self.band + 1),
            "papa_constants_rows": (heads, s, length),
            "papa_constants_cols": (heads, length, s),
            "papa_constants_profile": (heads, 2 * length - 1),
            "papa_constants_u": (heads, length, self.rank),
            "papa_constants_v": (heads, length, self.rank),
        }

    def offsets(self, device=None) -> torch.Tensor:
        """(L, L) the offset j - i of every cell."""
        idx = torch.arange(self.max_length, device=device)
        return idx[None, :] - idx[:, None]


def special_slots(max_length: int, pairs: bool) -> tuple[int, ...]:
    """Slots of special tokens in the layout: [CLS] at 0, the final separator at L-1, a pair's middle at L/2."""
    return tuple(sorted({0, max_length - 1, *([max_length // 2] if pairs else [])}))


def rebuild(parts: dict[str, torch.Tensor], layout: CompactLayout) -> torch.Tensor:
    """(Hc, L, L) float32 constant matrices from their compact parts (clamped at 0 for ``layout.clamped``)."""
    length, w = layout.max_length, layout.band
    profile = parts["papa_constants_profile"].float()  # (Hc, 2L-1)
    d = layout.offsets(profile.device)  # (L, L)
    dense = profile[:, d + length - 1]  # (Hc, L, L) Toeplitz
    if layout.rank:
        dense = dense + parts["papa_constants_u"].float() @ parts["papa_constants_v"].float().transpose(-1, -2)
    band = parts["papa_constants_band"].float()  # (Hc, L, 2w+1), band[i, k] = C[i, i + k - w]
    k = (d + w).clamp(0, 2 * w).expand(band.shape[0], -1, -1)  # (Hc, L, L)
    dense = torch.where(d.abs() <= w, band.gather(-1, k), dense)
    special = torch.tensor(layout.special, device=dense.device)
    dense = dense.index_copy(1, special, parts["papa_constants_rows"].float())  # (Hc, S, L) rows
    dense = dense.index_copy(2, special, parts["papa_constants_cols"].float())  # (Hc, L, S) columns
    return dense.clamp_min(0) if layout.clamped else dense


def add_compact_constants(module, heads: int, layout: CompactLayout, dtype: torch.dtype, device, trained=False) -> None:
    """Give ``module`` persistent zero buffers for the compact parts of ``heads`` constant heads.

    Raises:
        ValueError: ``trained`` (trainable constants or lambda mixing): compact constants are frozen.
    """
    if trained:
        raise ValueError("compact constants are frozen: train dense constants (papa_compact_band=None)")
    for name, shape in layout.shapes(heads).items():
        module.register_buffer(name, torch.zeros(shape, dtype=dtype, device=device), persistent=True)
    module.papa_compact_layout = layout


def version_of(tensor: torch.Tensor) -> int:
    """``tensor``'s in-place version, the key of the caches built from constants; -1 for an inference tensor (a
    model built under ``torch.inference_mode()``), which has no version counter and cannot change outside it."""
    return -1 if tensor.is_inference() else tensor._version


def constants_of(module) -> torch.Tensor:
    """(Hc, L, L) constant matrices of a PAPA attention module, dense or rebuilt from compact parts.

    Compact parts are frozen buffers, so in eager mode the rebuilt matrices are kept until a part changes
    (a weight load or ``.to()`` gives new tensors or versions): compaction saves disk, not time per forward.
    A traced graph rebuilds them (it cannot hold eager state).
    """
    layout = getattr(module, "papa_compact_layout", None)
    if layout is None:
        return module.papa_constants
    parts = {name: getattr(module, name) for name in COMPACT_PARTS}
    if is_tracing():
        return rebuild(parts, layout)
    key = tuple((t.data_ptr(), version_of(t), t.device, t.dtype) for t in parts.values())
    cached = module.__dict__.get("_papa_rebuilt")
    if cached is None or cached[0] != key:
        with torch.no_grad():
            cached = (key, rebuild(parts, layout))
        module.__dict__["_papa_rebuilt"] = cached  # a plain attribute: not in the state dict, not moved by .to()
    return cached[1]
