"""``StructuredConstants``: calibrated constants held in the compact structure, never as (L, L) matrices.

What structured calibration (``into_structure.py``) returns when the layout is compact: for every layer and head the
compact parts of ``hub_code/compact_constants.py`` (band, special rows and columns, offset profile, rank-r
residual), with the layout, the per-slot coverage, the per-head variance and the provenance. ``convert`` stores the
parts as they are (no dense rebuild), so a long-L conversion allocates no (L, L) matrix per head. Saved as
safetensors like :class:`~papa_surgery.calibration.constants.Constants` (``Constants.load`` reads both).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import __version__
from ..failures import spell
from ..hub_code.compact_constants import COMPACT_PARTS, CompactLayout, rebuild, special_slots
from ..hub_code.structured_constants import StructuredSlots
from .coverage import coverage_summary
from .files import write_constants_file
from .kinds import offset_parts, offset_profile
from .protocol import ConstantsBase, file_fields

DENSE_VIEW_UP_TO = 1024  # ``to_dense`` rebuilds dense matrices for methods that need them up to this L


@dataclass
class StructuredConstants(ConstantsBase):
    """Constants of every layer and head as compact parts (the
    :class:`~papa_surgery.calibration.protocol.ConstantsBase` interface; ``Constants`` is the dense storage).

    Attributes:
        parts: ``{name: (layers, heads, ...)}`` float32 for each name of ``COMPACT_PARTS``.
        layout: the compact layout (L, band w, rank r, special slots).
        kind: how they were made (``average``, or a data-free kind: ``data_free.py``).
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

    storage = "compact"

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

    @classmethod
    def from_kind(cls, kind: str, num_layers: int, num_heads: int, layout: CompactLayout, **metadata):
        """Data-free constants of one kind for every layer and head, in ``layout``: O(L) values per head, exact
        (``kinds.py``)."""
        parts = offset_parts(offset_profile(kind, layout.max_length), layout)  # {name: (1, ...)}
        parts = {name: t.expand(num_layers, num_heads, *t.shape[1:]).clone() for name, t in parts.items()}
        return cls(parts, layout, kind, metadata={"papa_surgery_version": __version__, **metadata})

    def fill(self) -> StructuredConstants:
        """Already filled at calibration (``structured_result.py``): returned as is."""
        return self

    def layer_parts(self, layer: int, heads) -> dict[str, torch.Tensor]:
        """``{name: (Hc, ...)}`` the compact parts of ``heads`` (head order) of ``layer``."""
        index = torch.tensor(sorted(heads), dtype=torch.long)
        return {name: t[layer].index_select(0, index).contiguous() for name, t in self.parts.items()}

    # -- the ConstantsBase interface ----------------------------------------------------------------------------
    def conversion_layout(self, storage: str, trainable: bool, band=None, rank=None) -> CompactLayout:
        """This layout: the parts are stored as they are (ValueError when the conversion asks for another)."""
        layout = self.layout
        fix = "calibrate again with that layout (--compact-band, --compact-rank at calibrate)"
        if trainable or storage == "dense":  # the workflow densifies first (to_dense); a direct call is refused
            raise ValueError("dense or trainable constants: pass constants.to_dense(), not compact parts")
        for name, wanted, have in (("compact_band", band, layout.band), ("compact_rank", rank, layout.rank)):
            if wanted is not None and int(wanted) != have:
                raise ValueError(f"these constants are stored with {name}={have}, not {wanted}; {fix}")
        return layout

    def layer_constants(self, layer: int, heads) -> dict[str, torch.Tensor]:
        return self.layer_parts(layer, heads)

    def to_dense(self):
        """Dense ``Constants`` of the matrices these parts stand for (the same kind, variance and provenance; the
        per-cell counts are not kept, the per-slot coverage is in the provenance), rebuilt up to L =
        ``DENSE_VIEW_UP_TO``.

        Raises:
            ValueError: L is larger (the matrices would take layers * heads * L^2 floats), naming the fix.
        """
        if self.max_length > DENSE_VIEW_UP_TO:
            gigabytes = self.num_layers * self.num_heads * self.max_length**2 * 4 / 1e9
            raise ValueError(
                f"these constants are stored compact at L={self.max_length}: dense (L, L) matrices per head (dense "
                f"storage, trainable constants, the lambda ranking, distilled and labelled kinds) would take "
                f"{gigabytes:.1f} GB; keep compact storage with a label-free ranking (variance, first-to-last, ...) "
                f"and the average or a data-free kind, or use {spell('max_length', DENSE_VIEW_UP_TO)} or less"
            )
        heads = range(self.num_heads)
        values = torch.stack([rebuild(self.layer_parts(layer, heads), self.layout) for layer in range(self.num_layers)])
        metadata = {**self.metadata, "densified_from": {"band": self.layout.band, "rank": self.layout.rank}}
        if self.coverage is not None:
            metadata["coverage"] = coverage_summary(self.coverage, self.max_length, self.filled_cells)
        # the residual may leave a few cells slightly negative: dense matrices are attention weights
        dense = ConstantsBase.storage_class("dense")
        return dense(values.clamp_min(0), self.kind, self.max_length, self.pairs, None, self.variance, metadata)

    def matrices(self, heads, slots: int | None = None) -> dict[tuple[int, int], torch.Tensor]:
        n = self.max_length if slots is None else min(slots, self.max_length)
        order = torch.arange(n)
        out = {}
        for layer, head in heads:
            parts = self.layer_parts(int(layer), [int(head)])
            cells = StructuredSlots(parts, self.layout, order, None, torch.float32).cells(order, order)  # (1, n, n)
            out[(int(layer), int(head))] = cells[0]
        return out

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write a safetensors file (atomically), as :meth:`Constants.save` does; ``Constants.load`` reads it."""
        tensors = {f"structure.{name}": t.float().contiguous() for name, t in self.parts.items()}
        if self.coverage is not None:
            tensors["coverage"] = self.coverage.double().contiguous()
        if self.variance is not None:
            tensors["variance"] = self.variance.double().contiguous()
        meta = {
            **self._file_metadata(),
            "compact_band": str(self.layout.band),
            "compact_rank": str(self.layout.rank),
            "filled_cells": str(self.filled_cells),
        }
        return write_constants_file(path, overwrite, tensors, meta)

    @classmethod
    def from_file(cls, tensors: dict, meta: dict) -> StructuredConstants:
        """The constants of a file :meth:`save` wrote (its tensors and metadata; ``Constants.load`` opens it)."""
        fields = file_fields(meta)
        length, pairs = fields["max_length"], fields["pairs"]
        band, rank = int(meta["compact_band"]), int(meta["compact_rank"])
        layout = CompactLayout(length, band, rank, special_slots(length, pairs))
        parts = {name: tensors[f"structure.{name}"].float() for name in COMPACT_PARTS}
        return cls(
            parts,
            layout,
            fields["kind"],
            pairs,
            tensors.get("coverage"),
            int(meta.get("filled_cells", "0")),
            tensors.get("variance"),
            fields["metadata"],
        )

    def summary(self) -> dict:
        """JSON-ready facts for recipes and cards (as :meth:`Constants.summary`, plus the storage)."""
        out = {"kind": self.kind, "max_length": self.max_length, "pairs": self.pairs, **self.metadata}
        out["storage"] = {"form": "compact", "band": self.layout.band, "rank": self.layout.rank}
        if self.coverage is not None:
            out["coverage"] = coverage_summary(self.coverage, self.max_length, self.filled_cells)
        return out
