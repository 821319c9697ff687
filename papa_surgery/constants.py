"""``Constants``: one (L, L) matrix per layer and head, with provenance, saved as safetensors.

Kinds (paper section 5.2): ``average`` (calibrated on a corpus, paper 3.1), and the data-free
``identity``, ``toeplitz`` (harmonic: 1 / (1 + |i - j|)), ``zeros`` (the head contributes nothing) and
``uniform`` (every real token alike). Whatever the kind, a constant head masks padding and
renormalises each row per example, like the paper's footnote 14.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file

from . import __version__

DATA_FREE_KINDS = ("identity", "toeplitz", "zeros", "uniform")
ANALYSIS_KINDS = ("norm-average", "effective-average")  # papa_surgery.analysis.analysis_constants
KINDS = ("average", *ANALYSIS_KINDS, *DATA_FREE_KINDS)


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
class Constants:
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

    @classmethod
    def from_kind(cls, kind: str, num_layers: int, num_heads: int, max_length: int, **metadata) -> Constants:
        """Data-free constants of one kind for every layer and head."""
        if kind in ANALYSIS_KINDS:
            raise ValueError(f"{kind!r} constants come from papa_surgery.analysis.analysis_constants() on a corpus")
        if kind == "average":
            raise ValueError(
                "'average' constants come from calibrate(); data-free kinds: " + ", ".join(DATA_FREE_KINDS)
            )
        mat = _kind_matrix(kind, max_length)
        values = mat.expand(num_layers, num_heads, max_length, max_length).clone()
        return cls(values, kind, max_length, metadata={"papa_surgery_version": __version__, **metadata})

    def check_compatible(self, config, source: str | None = None) -> None:
        """ValueError unless these constants fit a model with ``config`` (layers and heads; source id)."""
        from .architectures import num_heads_layers

        heads, layers = num_heads_layers(config)
        if (layers, heads) != (self.num_layers, self.num_heads):
            raise ValueError(
                f"constants have {self.num_layers} layers x {self.num_heads} heads but the model has "
                f"{layers} x {heads}; calibrate constants for this model"
            )
        made_for = self.metadata.get("source_model")
        if source and made_for and _model_name(made_for) != _model_name(source):
            raise ValueError(
                f"constants were calibrated on {made_for!r}, not {source!r}; calibrate for this model or pass "
                f"the matching source"
            )

    def save(self, path: str | Path) -> Path:
        """Write a safetensors file (atomically) with the provenance in its metadata."""
        path = Path(path)
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
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as tmp:
            tmp_path = Path(tmp.name)
        try:
            save_file(tensors, str(tmp_path), metadata=meta)
            tmp_path.replace(path)
        finally:
            tmp_path.unlink(missing_ok=True)
        return path

    @classmethod
    def load(cls, path: str | Path) -> Constants:
        """Read a file written by :meth:`save`.

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not PAPA constants.
        """
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"constants file {str(path)!r} does not exist")
        try:
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except Exception as err:
            raise ValueError(f"{str(path)!r} is not a safetensors constants file: {err}") from err
        if meta.get("format") != "papa-constants" or "values" not in tensors:
            raise ValueError(f"{str(path)!r} is not a PAPA constants file (write one with papa-surgery calibrate)")
        return cls(
            values=tensors["values"].float(),
            kind=meta["kind"],
            max_length=int(meta["max_length"]),
            pairs=json.loads(meta.get("pairs", "false")),
            counts=tensors.get("counts"),
            variance=tensors.get("variance"),
            metadata=json.loads(meta.get("provenance", "{}")),
        )

    def summary(self) -> dict:
        """JSON-ready facts for recipes and cards."""
        out = {"kind": self.kind, "max_length": self.max_length, "pairs": self.pairs, **self.metadata}
        cov = self.coverage
        if cov is not None:
            seen = int((cov > 0).sum())
            out["coverage"] = {
                "slots_seen": seen,
                "slots_total": self.max_length,
                "min_examples_per_seen_slot": int(cov[cov > 0].min()) if seen else 0,
                "examples_at_slot_0": int(cov[0]),
            }
        return out


def _model_name(name: str) -> str:
    """Compare sources by their last path component, so a local copy of a Hub model still matches."""
    return str(name).rstrip("/").split("/")[-1] if name else name
