"""The one interface of constants, whatever their storage: what every stage that takes constants reads.

Two storages implement it: :class:`~papa_surgery.calibration.constants.Constants` (one dense (L, L) matrix per layer
and head) and :class:`~papa_surgery.calibration.structured_constants.StructuredConstants` (the compact parts of
``hub_code/compact_constants.py``, never an (L, L) matrix; long inputs). Ranking, conversion, saving, distillation,
healing, sweeps and figures call the methods below and never ask which storage they hold: a storage that cannot do
something (dense matrices of constants stored compact at a long L) says so in one sentence naming the fix.

Files: one safetensors file for either storage (``format: papa-constants``, ``storage: dense | compact``), with a
format version (:data:`papa_surgery.file_formats.FILE_FORMATS`) checked on load.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from .. import registry
from ..file_formats import FILE_FORMATS, check_file_format
from .fingerprint import Compatibility

FILE_FORMAT = "papa-constants"


class ConstantsBase(Compatibility):
    """Constants of every layer and head of one source model, in either storage (module docstring).

    Every implementation has ``max_length`` (L, the slot count), ``num_layers``, ``num_heads``, ``kind`` (how they
    were made: a ``registry`` kind), ``pairs`` (calibrated on sentence pairs), ``variance`` ((layers, heads)
    input-dependence scores of calibrated kinds, else ``None``), ``coverage`` ((L,) examples per slot, ``None`` for
    data-free kinds), ``layout`` (the ``CompactLayout`` they are held in, ``None`` for dense) and ``metadata`` (JSON
    provenance), and the methods below.
    """

    storage: str = "dense"  # "dense" or "compact"
    _storages: dict[str, type] = {}  # storage -> its class: each registers itself when it is defined

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        if "storage" in cls.__dict__:  # a storage's own class, not a subclass someone derives from it
            ConstantsBase._storages[cls.storage] = cls

    @staticmethod
    def storage_class(storage: str) -> type:
        """The class of constants held in ``storage`` (``dense``: ``Constants``; ``compact``: ``StructuredConstants``;
        both are defined when ``papa_surgery.calibration`` is imported)."""
        return ConstantsBase._storages[storage]

    # -- what a ranking reads -----------------------------------------------------------------------------------
    def head_scores(self, method: str) -> list[list[float]]:
        """(layers, heads) the per-head scores ``method`` orders heads by (``variance``: the calibration's variance;
        ``norm``: the mean contribution ||alpha f||), checked against the kind the registry says it reads.

        Raises:
            ValueError: constants of another kind, or without the scores, naming what to pass instead.
        """
        registry.check_reads(method, self.kind)
        if method == "norm":
            scores = self.metadata.get("contribution")
        else:
            scores = None if self.variance is None else self.variance.tolist()
        if scores is None:
            wanted = registry.method(method).constants
            raise ValueError(
                f"the {method!r} ranking reads the per-head scores of calibrated {wanted} constants, and these "
                f"{self.kind} constants carry none (made before they were recorded, or damaged): calibrate them again "
                f"(papa_surgery.calibrate(model, tokenizer, kind={wanted!r}))"
            )
        return scores

    def serves(self, method: str) -> bool:
        """Whether ``method`` can read its scores from these constants (else a workflow calibrates what it reads)."""
        try:
            self.head_scores(method)
        except ValueError:
            return False
        return True

    def key(self) -> tuple:
        """What identifies these constants across runs and process counts: how they were made, not when."""
        meta, layout = self.metadata, self.layout
        held = (self.storage,) if layout is None else (self.storage, layout.band, layout.rank)  # variances differ
        made_from = (meta.get("corpus"), meta.get("examples"))
        if meta.get("corpus_identity"):  # which text, beyond its name (constants made before it have none)
            made_from += (meta["corpus_identity"],)
        return (self.kind, self.max_length, self.pairs, *made_from, *held)

    # -- what a conversion reads --------------------------------------------------------------------------------
    def conversion_layout(self, storage: str, trainable: bool, band=None, rank=None):
        """The ``CompactLayout`` a converted model stores these constants in (``None``: dense (L, L) matrices),
        for ``convert``'s storage options (ValueError when they cannot hold them, naming the fix)."""
        raise NotImplementedError  # pragma: no cover

    def layer_constants(self, layer: int, heads) -> torch.Tensor | dict[str, torch.Tensor]:
        """What a converted model's ``layer`` stores for ``heads`` (sorted): (Hc, L, L) matrices, or compact parts
        ``{name: (Hc, ...)}`` (stored as they are)."""
        raise NotImplementedError  # pragma: no cover

    def to_dense(self):
        """These constants as dense ``Constants`` (themselves when dense), for what trains or mixes (L, L) matrices
        (lambda ranking, distillation, labelled kinds). ValueError, naming the fix, when L is too long for them."""
        raise NotImplementedError  # pragma: no cover

    def matrices(self, heads, slots: int | None = None) -> dict[tuple[int, int], torch.Tensor]:
        """``{(layer, head): (n, n) float32}`` the matrices of ``heads``, their first ``slots`` rows and columns
        (figures of a long L read no more), never the other heads'."""
        raise NotImplementedError  # pragma: no cover

    def fill(self):
        """These constants with the cells no calibration example reached filled from the measured head."""
        return self

    # -- files ----------------------------------------------------------------------------------------------------
    def _file_metadata(self) -> dict[str, str]:
        """The metadata every constants file carries, whatever its storage."""
        return {
            "format": FILE_FORMAT,
            "format_version": str(FILE_FORMATS["constants"]),
            "storage": self.storage,
            "kind": self.kind,
            "max_length": str(self.max_length),
            "pairs": json.dumps(self.pairs),
            "provenance": json.dumps(self.metadata, sort_keys=True, default=str),
        }

    @staticmethod
    def load(path: str | Path) -> ConstantsBase:
        """Read a constants file of either storage (``Constants.load`` is this).

        Raises:
            FileNotFoundError: no such file.
            ValueError: the file is not PAPA constants, or of a newer format (naming the file and the fix).
        """
        from safetensors import safe_open

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
        except Exception as err:  # safetensors' own words: a truncated, damaged or foreign file
            raise ValueError(f"{str(path)!r} is not a safetensors constants file ({hint}): {err}") from err
        if meta.get("format") != FILE_FORMAT:
            raise ValueError(f"{str(path)!r} is not a PAPA constants file ({hint})")
        check_file_format("constants", meta.get("format_version"), path)
        try:
            return ConstantsBase.storage_class(meta.get("storage", "dense")).from_file(tensors, meta)
        except KeyError as err:
            raise ValueError(f"{str(path)!r} lacks {err.args[0]!r} in its metadata or tensors ({hint})") from None
        except (TypeError, ValueError) as err:
            raise ValueError(f"{str(path)!r}: its metadata is damaged ({err}); {hint}") from None


def file_fields(meta: dict) -> dict:
    """``kind``, ``max_length``, ``pairs`` and ``metadata`` of a constants file's metadata, each checked."""
    kind = meta["kind"]
    max_length = int(meta["max_length"])
    pairs = json.loads(meta.get("pairs", "false"))
    metadata = json.loads(meta.get("provenance", "{}"))
    if not isinstance(pairs, bool) or not isinstance(metadata, dict) or not kind:
        raise TypeError("pairs must be true/false and provenance a JSON object")
    return {"kind": kind, "max_length": max_length, "pairs": pairs, "metadata": metadata}
