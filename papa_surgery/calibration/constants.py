"""``Constants``: one (L, L) matrix per layer and head, with provenance, saved as safetensors.

Kinds (paper section 5.2): ``average`` (calibrated on a corpus, paper 3.1), and the data-free
``identity``, ``toeplitz`` (harmonic: 1 / (1 + |i - j|)), ``zeros`` (the head contributes nothing) and
``uniform`` (every real token alike). Whatever the kind, a constant head masks padding and
renormalises each row per example, like the paper's footnote 14.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open

from .. import __version__, registry
from .coverage import coverage_summary
from .files import write_constants_file
from .fingerprint import Compatibility, config_fingerprint, model_fingerprint  # noqa: F401 (their old home)

# The kinds, as the registry declares them (papa_surgery.registry: what each needs and how it is made).
DATA_FREE_KINDS = registry.DATA_FREE_KINDS
ANALYSIS_KINDS = registry.ANALYSIS_KINDS  # papa_surgery.analysis.analysis_constants
TRAINED_KINDS = registry.TRAINED_KINDS  # papa_surgery.healing.distill, starting from the average
KINDS = registry.CONSTANT_KINDS
LABELED_KINDS = registry.LABELED_KINDS  # sweeps only: trained with the probe (papa_surgery.probing.labeled)


def _kind_matrix(kind: str, max_length: int) -> torch.Tensor:
    """(L, L) matrix of a data-free kind."""
    idx = torch.arange(max_length)
    if kind == "identity":
        return torch.eye(max_length)
    if kind == "toeplitz":
        return 1.0 / (1.0 + (idx[:, None] - idx[None, :]).abs().float())
    if kind == "zeros":
        return torch.zeros(max_length, max_length)
    if kind == "uniform":
        return torch.ones(max_length, max_length)
    raise ValueError(f"unknown constant kind {kind!r}; choose one of {', '.join(KINDS)}")


@dataclass
class Constants(Compatibility):
    """Constant attention matrices for every layer and head of one source model.

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
        """Data-free constants of one kind for every layer and head."""
        if kind in ANALYSIS_KINDS:
            raise ValueError(f"{kind!r} constants come from papa_surgery.analysis.analysis_constants() on a corpus")
        if kind in TRAINED_KINDS:
            raise ValueError(f"{kind!r} constants come from papa_surgery.healing.distillation.distill() on a corpus")
        if kind == "average":
            raise ValueError(
                "'average' constants come from calibrate(); data-free kinds: " + ", ".join(DATA_FREE_KINDS)
            )
        mat = _kind_matrix(kind, max_length)
        values = mat.expand(num_layers, num_heads, max_length, max_length).clone()
        return cls(values, kind, max_length, metadata={"papa_surgery_version": __version__, **metadata})

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
        meta = {
            "format": "papa-constants",
            "kind": self.kind,
            "max_length": str(self.max_length),
            "pairs": json.dumps(self.pairs),
            "provenance": json.dumps(self.metadata, sort_keys=True, default=str),
        }
        return write_constants_file(path, overwrite, tensors, meta)

    @classmethod
    def load(cls, path: str | Path) -> Constants:
        """Read a file written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not PAPA constants (naming the file and the fix).
        """
        path = Path(path)
        hint = "write one with papa-surgery calibrate"
        if path.is_dir():
            raise ValueError(
                f"constants {str(path)!r} is a folder; pass the .safetensors file papa-surgery calibrate wrote"
                " (a checkpoint's constants are inside its model; convert its source instead)"
            )
        if not path.is_file():
            raise FileNotFoundError(f"constants file {str(path)!r} does not exist")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:
            raise ValueError(f"{str(path)!r} is not a safetensors constants file ({hint}): {err}") from err
        if meta.get("format") == "papa-constants" and meta.get("storage") == "compact":
            from .structured_constants import StructuredConstants

            try:
                return StructuredConstants.from_file(tensors, meta)
            except (KeyError, TypeError, ValueError) as err:
                raise ValueError(f"{str(path)!r}: its structured constants are damaged ({err}); {hint}") from None
        if meta.get("format") != "papa-constants" or "values" not in tensors:
            raise ValueError(f"{str(path)!r} is not a PAPA constants file ({hint})")
        try:
            kind = meta["kind"]
            max_length = int(meta["max_length"])
            pairs = json.loads(meta.get("pairs", "false"))
            metadata = json.loads(meta.get("provenance", "{}"))
            if not isinstance(pairs, bool) or not isinstance(metadata, dict) or not kind:
                raise TypeError("pairs must be true/false and provenance a JSON object")
        except KeyError as err:
            raise ValueError(f"{str(path)!r}: its metadata lacks {err.args[0]!r} ({hint})") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"{str(path)!r}: its metadata is damaged ({err}); {hint}") from None
        try:
            return cls(
                values=tensors["values"].float(),
                kind=kind,
                max_length=max_length,
                pairs=pairs,
                counts=tensors.get("counts"),
                variance=tensors.get("variance"),
                metadata=metadata,
            )
        except ValueError as err:
            raise ValueError(f"{str(path)!r}: {err}") from None

    def summary(self) -> dict:
        """JSON-ready facts for recipes and cards."""
        out = {"kind": self.kind, "max_length": self.max_length, "pairs": self.pairs, **self.metadata}
        if self.coverage is not None:
            out["coverage"] = coverage_summary(self.coverage, self.max_length, int((self.counts == 0).sum()))
        return out
