"""``StructuredConstants``: calibrated constants held in the compact structure, never as (L, L) matrices.

What structured calibration (``into_structure.py``) returns when the layout is compact: for every layer and head the
compact parts of ``hub_code/compact_constants.py`` (band, special rows and columns, offset profile, rank-r
residual), with the layout, the per-slot coverage, the per-head variance and the provenance. ``convert`` stores the
parts as they are (no dense rebuild), so a long-L conversion allocates no (L, L) matrix per head. Saved as
safetensors like :class:`~papa_surgery.calibration.constants.Constants` (``Constants.load`` reads both).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..hub_code.compact_constants import COMPACT_PARTS, CompactLayout, rebuild, special_slots
from .coverage import coverage_summary
from .files import write_constants_file
from .fingerprint import Compatibility

DENSE_VIEW_UP_TO = 1024  # ``values`` rebuilds dense matrices for methods that need them up to this L


@dataclass
class StructuredConstants(Compatibility):
    """Constants of every layer and head as compact parts.

    Attributes:
        parts: ``{name: (layers, heads, ...)}`` float32 for each name of ``COMPACT_PARTS``.
        layout: the compact layout (L, band w, rank r, special slots).
        kind: how they were made (``average``).
        pairs: calibrated on sentence pairs.
        coverage: (L,) float64, how many examples had a real token in each slot.
        filled_cells: how many of the L*L cells no example reached (filled from the measured head).
        variance: (layers, heads) mean squared deviation of A from these constants over real entries.
        metadata: provenance, JSON-serialisable.
    """

    parts: dict
    layout: CompactLayout
    kind: str
    pairs: bool = False
    coverage: torch.Tensor | None = None
    filled_cells: int = 0
    variance: torch.Tensor | None = None
    metadata: dict = field(default_factory=dict)

    def __post_init__(self):
        if set(self.parts) != set(COMPACT_PARTS):
            raise ValueError(f"structured constants need {', '.join(COMPACT_PARTS)}, got {sorted(self.parts)}")
        lead = tuple(self.parts["papa_constants_profile"].shape[:2])
        for name, shape in self.layout.shapes(lead[1]).items():
            if tuple(self.parts[name].shape) != (lead[0], *shape):
                raise ValueError(f"{name} must have shape {(lead[0], *shape)}, got {tuple(self.parts[name].shape)}")
            if not torch.isfinite(self.parts[name]).all():
                raise ValueError(f"{name} contains NaN or inf values; recalibrate")
        if self.variance is not None and tuple(self.variance.shape) != lead:
            raise ValueError(f"variance must have shape {lead}, got {tuple(self.variance.shape)}")

    @property
    def max_length(self) -> int:
        return self.layout.max_length

    @property
    def num_layers(self) -> int:
        return self.parts["papa_constants_profile"].shape[0]

    @property
    def num_heads(self) -> int:
        return self.parts["papa_constants_profile"].shape[1]

    @property
    def counts(self):
        """Structured constants keep no (L, L) counts (see ``coverage`` and ``filled_cells``)."""
        return None

    def fill(self) -> StructuredConstants:
        """Already filled at calibration (``structured_result.py``): returned as is."""
        return self

    def layer_parts(self, layer: int, heads) -> dict[str, torch.Tensor]:
        """``{name: (Hc, ...)}`` the compact parts of ``heads`` (head order) of ``layer``."""
        index = torch.tensor(sorted(heads), dtype=torch.long)
        return {name: t[layer].index_select(0, index).contiguous() for name, t in self.parts.items()}

    @property
    def values(self) -> torch.Tensor:
        """(layers, heads, L, L) the dense matrices these parts stand for, for methods that need them (lambda
        ranking, distillation, figures), rebuilt up to L = ``DENSE_VIEW_UP_TO``.

        Raises:
            ValueError: L is larger (the matrices would take layers * heads * L^2 floats), naming the fix.
        """
        if self.max_length > DENSE_VIEW_UP_TO:
            raise ValueError(
                f"these constants are stored compact at L={self.max_length}: what needs dense (L, L) matrices per "
                f"head (lambda ranking, distilled constants, attention figures) cannot use them; calibrate with "
                f"storage='dense' (--storage dense) at a smaller max_length, or use a label-free ranking "
                f"(variance, first-to-last, ...)"
            )
        heads = range(self.num_heads)
        return torch.stack([rebuild(self.layer_parts(layer, heads), self.layout) for layer in range(self.num_layers)])

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write a safetensors file (atomically), as :meth:`Constants.save` does; ``Constants.load`` reads it."""
        tensors = {f"structure.{name}": t.float().contiguous() for name, t in self.parts.items()}
        if self.coverage is not None:
            tensors["coverage"] = self.coverage.double().contiguous()
        if self.variance is not None:
            tensors["variance"] = self.variance.double().contiguous()
        meta = {
            "format": "papa-constants",
            "storage": "compact",
            "kind": self.kind,
            "max_length": str(self.max_length),
            "compact_band": str(self.layout.band),
            "compact_rank": str(self.layout.rank),
            "filled_cells": str(self.filled_cells),
            "pairs": json.dumps(self.pairs),
            "provenance": json.dumps(self.metadata, sort_keys=True, default=str),
        }

        return write_constants_file(path, overwrite, tensors, meta)

    @classmethod
    def from_file(cls, tensors: dict, meta: dict) -> StructuredConstants:
        """The constants of a file :meth:`save` wrote (its tensors and metadata; ``Constants.load`` opens it)."""
        length, pairs = int(meta["max_length"]), json.loads(meta.get("pairs", "false"))
        band, rank = int(meta["compact_band"]), int(meta["compact_rank"])
        layout = CompactLayout(length, band, rank, special_slots(length, pairs))
        parts = {name: tensors[f"structure.{name}"].float() for name in COMPACT_PARTS}
        return cls(
            parts,
            layout,
            meta["kind"],
            pairs,
            tensors.get("coverage"),
            int(meta.get("filled_cells", "0")),
            tensors.get("variance"),
            json.loads(meta.get("provenance", "{}")),
        )

    def summary(self) -> dict:
        """JSON-ready facts for recipes and cards (as :meth:`Constants.summary`, plus the storage)."""
        out = {"kind": self.kind, "max_length": self.max_length, "pairs": self.pairs, **self.metadata}
        out["storage"] = {"form": "compact", "band": self.layout.band, "rank": self.layout.rank}
        if self.coverage is not None:
            out["coverage"] = coverage_summary(self.coverage, self.max_length, self.filled_cells)
        return out
