"""``Constants``: one (L, L) matrix per layer and head, with provenance, saved as safetensors.

Kinds (paper section 5.2): ``average`` (calibrated on a corpus, paper 3.1), and the data-free
``identity``, ``toeplitz`` (harmonic: 1 / (1 + |i - j|)), ``zeros`` (the head contributes nothing) and
``uniform`` (every real token alike). Whatever the kind, a constant head masks padding and
renormalises each row per example, like the paper's footnote 14.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from .. import __version__, registry
from .coverage import coverage_summary
from .files import write_constants_file
from .fingerprint import config_fingerprint, model_fingerprint  # noqa: F401 (their old home)
from .kinds import offset_profile
from .protocol import ConstantsBase, file_fields

# The kinds, as the registry declares them (papa_surgery.registry: what each needs and how it is made).
DATA_FREE_KINDS = registry.DATA_FREE_KINDS
ANALYSIS_KINDS = registry.ANALYSIS_KINDS  # papa_surgery.analysis.analysis_constants
TRAINED_KINDS = registry.TRAINED_KINDS  # papa_surgery.healing.distill, starting from the average
KINDS = registry.CONSTANT_KINDS
LABELED_KINDS = registry.LABELED_KINDS  # sweeps only: trained with the probe (papa_surgery.probing.labeled)


@dataclass
class Constants(ConstantsBase):
    """Constant attention matrices for every layer and head of one source model, one dense (L, L) matrix each
    (the :class:`~papa_surgery.calibration.protocol.ConstantsBase` interface; ``StructuredConstants`` is the
    compact storage).

    Attributes:
        values: (layers, heads, L, L) float32; row i, column j is the weight slot i gives slot j.
        kind: how the matrices were made (one of ``KINDS`` or an analysis kind).
        max_length: L, the slot count.
        pairs: calibrated on sentence pairs (middle separator at L/2) rather than single sentences.
        counts: (L, L) float64, how many examples reached each cell (``None`` for data-free kinds).
        variance: (layers, heads) mean squared deviation of A from C over real entries — the label-free
            input-dependence score (``None`` for data-free kinds).
        metadata: provenance (source model, corpus, examples, library version, ...), JSON-serialisable.
    """

    values: torch.Tensor
    kind: str
    max_length: int
    pairs: bool = False
    counts: torch.Tensor | None = None
    variance: torch.Tensor | None = None
    metadata: dict = field(default_factory=dict)

    storage = "dense"

    def __post_init__(self):
        if self.values.dim() != 4 or self.values.shape[-2:] != (self.max_length, self.max_length):
            raise ValueError(
                f"constants must have shape (layers, heads, {self.max_length}, {self.max_length}), "
                f"got {tuple(self.values.shape)}"
            )
        if not torch.isfinite(self.values).all():
            raise ValueError("constants contain NaN or inf values; recalibrate or check the file")
        if (self.values < 0).any():
            raise ValueError("constants must be non-negative (they are attention weights)")
        layers_heads = tuple(self.values.shape[:2])
        if self.variance is not None:
            if tuple(self.variance.shape) != layers_heads:
                raise ValueError(f"variance must have shape {layers_heads}, got {tuple(self.variance.shape)}")
            if not torch.isfinite(self.variance).all():
                raise ValueError(
                    "the variance scores contain NaN or inf values (they would rank heads by NaN); recalibrate"
                )
        if self.counts is not None:
            if tuple(self.counts.shape) != (self.max_length, self.max_length):
                raise ValueError(
                    f"counts must have shape ({self.max_length}, {self.max_length}), got {tuple(self.counts.shape)}"
                )
            if not torch.isfinite(self.counts).all() or (self.counts < 0).any():
                raise ValueError("the coverage counts contain negative, NaN or inf values; recalibrate")

    @property
    def num_layers(self) -> int:
        return self.values.shape[0]

    @property
    def num_heads(self) -> int:
        return self.values.shape[1]

    @property
    def layout(self) -> None:
        """Dense matrices: no compact layout."""
        return None

    @property
    def coverage(self) -> torch.Tensor | None:
        """(L,) how many examples had a real token in each slot."""
        return None if self.counts is None else self.counts.diagonal().clone()

    @property
    def filled_cells(self) -> torch.Tensor | None:
        """(L, L) bool: cells no calibration example reached, whose values :meth:`fill` estimated."""
        return None if self.counts is None or not self.metadata.get("filled") else self.counts == 0

    def fill(self) -> Constants:
        """These constants with every cell no example reached filled from the measured head
        (:func:`.coverage.fill_uncovered`); data-free kinds, fully covered grids and constants already
        filled are returned as is.
        """
        from .coverage import FILL_METHOD, fill_uncovered

        if self.counts is None or self.metadata.get("filled") or bool((self.counts > 0).all()):
            return self  # filled once: later changes (distillation) to filled cells are kept
        values = fill_uncovered(self.values, self.counts, self.pairs)
        metadata = {**self.metadata, "filled": FILL_METHOD}
        out = Constants(values, self.kind, self.max_length, self.pairs, self.counts, self.variance, metadata)
        out._coverage_warned = getattr(self, "_coverage_warned", False)  # the same corpus: warn once
        return out

    @classmethod
    def from_kind(cls, kind: str, num_layers: int, num_heads: int, max_length: int, **metadata) -> Constants:
        """Dense data-free constants of one kind for every layer and head (``data_free.data_free_constants`` picks
        the storage by L; ``StructuredConstants.from_kind`` builds them in O(L) per head)."""
        profile = offset_profile(kind, max_length)  # (2L-1,)
        idx = torch.arange(max_length)
        matrix = profile[idx[None, :] - idx[:, None] + max_length - 1]  # (L, L)
        values = matrix.expand(num_layers, num_heads, max_length, max_length).clone()
        return cls(values, kind, max_length, metadata={"papa_surgery_version": __version__, **metadata})

    # -- the ConstantsBase interface ----------------------------------------------------------------------------
    def conversion_layout(self, storage: str, trainable: bool, band=None, rank=None):
        from .compaction import layout_for

        if trainable and storage == "compact":
            raise ValueError("trainable constants are stored dense; drop storage='compact' or trainable_constants")
        if storage == "auto" and self.kind in registry.DENSE_KINDS:
            return None  # stored as they were trained (registry.DENSE_KINDS says why)
        return None if trainable else layout_for(storage, self.max_length, self.pairs, band, rank, fitted=True)

    def layer_constants(self, layer: int, heads) -> torch.Tensor:
        return self.values[layer, sorted(heads)]  # (Hc, L, L)

    def to_dense(self) -> Constants:
        return self

    def matrices(self, heads, slots: int | None = None) -> dict[tuple[int, int], torch.Tensor]:
        n = self.max_length if slots is None else min(slots, self.max_length)
        return {(int(a), int(h)): self.values[int(a), int(h), :n, :n].float() for a, h in heads}

    def save(self, path: str | Path, overwrite: bool = True) -> Path:
        """Write a safetensors file (atomically) with the provenance in its metadata.

        An existing file is replaced only when it is a constants file papa-surgery wrote (never another file);
        ``overwrite=False`` refuses any existing file, also one that appears while saving (``papa_surgery.outputs``).

        Raises:
            ValueError: ``path`` is a folder or another kind of file, or exists and not ``overwrite``.
        """
        tensors = {"values": self.values.float().contiguous()}
        if self.counts is not None:
            tensors["counts"] = self.counts.double().contiguous()
        if self.variance is not None:
            tensors["variance"] = self.variance.double().contiguous()
        return write_constants_file(path, overwrite, tensors, self._file_metadata())

    @classmethod
    def from_file(cls, tensors: dict, meta: dict) -> Constants:
        """The constants of a dense file :meth:`save` wrote (its tensors and metadata; :meth:`load` opens it)."""
        fields = file_fields(meta)
        values = tensors["values"].float()
        return cls(values, counts=tensors.get("counts"), variance=tensors.get("variance"), **fields)

    def summary(self) -> dict:
        """JSON-ready facts for recipes and cards."""
        out = {"kind": self.kind, "max_length": self.max_length, "pairs": self.pairs, **self.metadata}
        if self.coverage is not None:
            out["coverage"] = coverage_summary(self.coverage, self.max_length, int((self.counts == 0).sum()))
        return out
