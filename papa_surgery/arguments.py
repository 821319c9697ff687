"""What the Python API checks of the objects it is handed (models, tokenizers, constants), before any work.

A wrong type is a ``TypeError`` naming the argument (:class:`~papa_surgery.options.ArgumentTypeError`), as the
options' checks are for values; torch and transformers are imported only when a check runs.
"""

from __future__ import annotations

from pathlib import Path

from . import registry
from .options import ArgumentTypeError


def check_model(model) -> None:
    """TypeError unless ``model`` is a torch module with a config; ValueError for an unsupported family."""
    from torch import nn

    from .models.families import get_family

    if not isinstance(model, nn.Module) or not hasattr(model, "config"):
        raise ArgumentTypeError(
            "model", f"must be a transformers model (e.g. from papa_surgery.load), got {what(model)}"
        )
    get_family(model)


def check_tokenizer(tokenizer, required: bool = True) -> None:
    """TypeError unless ``tokenizer`` is a transformers tokenizer (or ``None`` when not ``required``)."""
    from transformers import PreTrainedTokenizerBase

    if tokenizer is None and not required:
        return
    if not isinstance(tokenizer, PreTrainedTokenizerBase):
        raise ArgumentTypeError(
            "tokenizer",
            f"must be a transformers tokenizer (e.g. AutoTokenizer.from_pretrained), got {what(tokenizer)}",
        )


def what(value) -> str:
    """A value as an error message quotes it: its type and (at most 120 characters of) its repr."""
    return "None" if value is None else f"the {type(value).__name__} {value!r}"[:120]


def check_constants(constants, method: str | None = None):
    """Constants of either storage (``Constants``, ``StructuredConstants``), or read from a constants file; checked
    against the kind ``method`` reads (the registry: ValueError naming what to pass)."""
    from .calibration.protocol import ConstantsBase

    if isinstance(constants, (str, Path)):
        constants = ConstantsBase.load(constants)
    if not isinstance(constants, ConstantsBase):  # dense or compact: every stage reads either
        raise ArgumentTypeError(
            "constants",
            f"must be Constants or StructuredConstants (from papa_surgery.calibrate) or the path of a constants "
            f"file, got {what(constants)}",
        )
    if method is not None:
        registry.check_reads(method, constants.kind)
    return constants
