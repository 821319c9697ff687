"""What the Python API checks of the objects it is handed (models, tokenizers, constants), before any work.

A wrong type is a ``TypeError`` naming the argument (:class:`~papa_surgery.options.ArgumentTypeError`), as the
options' checks are for values; torch and transformers are imported only when a check runs.
"""

from __future__ import annotations

import operator
from pathlib import Path

from . import registry
from .options import ArgumentError, ArgumentTypeError, spell


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
    return "None" if value is None else " ".join(f"the {type(value).__name__} {value!r}".split())[:120]  # one line


def check_max_length(config, max_length: int, model_name: str, argument: str = "max_length") -> None:
    """ArgumentError when ``max_length`` slots need more positions than the model has (before any work)."""
    from .models.families import is_papa_config
    from .models.loading import position_limit
    from .models.sources import public_name_of

    if is_papa_config(config):
        return
    limit = position_limit(config)
    if limit is not None and max_length > limit:
        raise ArgumentError(
            argument,
            f"{max_length} slots exceed the {limit} positions of {public_name_of(model_name)} "
            f"(max_position_embeddings); pass {spell(argument, limit)} or less",
        )


def check_cell_options(model, options: dict) -> dict:
    """A probe's or fine-tuning cell's keyword arguments checked as ``probe``/``finetune`` check their flags: the
    counts and rates positive, ``max_length`` at least 4 and within ``model``'s positions, ``data_dir`` an existing
    folder, ``device`` one this machine has (a negative ``max_train_examples`` was a slice that dropped the last
    example)."""
    from .options import RunOptions, SweepOptions, check_arguments

    checked = check_arguments(options, SweepOptions, RunOptions)
    if checked.get("max_length") is not None:
        name = getattr(model.config, "_name_or_path", None) or "the model"
        check_max_length(model.config, checked["max_length"], name)
    return checked


def check_fit_arguments(model, tokenizer, constants, heads, numbers: dict):
    """``(constants, heads)`` of ``distill`` / ``sharpen``, all their arguments checked before any work, naming one:
    constants as :func:`check_constants` takes them (a file's path too), ``heads`` a list of ``[layer, head]``
    pairs (``ranking.select(fraction)``), and ``numbers`` (steps, lr, batch_size, max_examples, seed, device)
    as the command line checks its flags."""
    from .options import CalibrationOptions, HealOptions, RunOptions, check_arguments

    check_model(model)
    check_tokenizer(tokenizer)
    constants = check_constants(constants)
    try:  # any sequence of integer pairs (numpy's too); None: no head
        heads = [[operator.index(x) for x in pair] for pair in (heads if heads is not None else [])]
        if any(len(pair) != 2 or any(isinstance(x, bool) for x in pair) for pair in heads):
            raise TypeError
    except TypeError:
        raise ArgumentTypeError(
            "heads", f"must be a list of [layer, head] pairs (e.g. ranking.select(0.5)), got {what(heads)}"
        ) from None
    check_arguments(numbers, HealOptions, RunOptions, CalibrationOptions)
    return constants, heads


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


# A folder's files that hold a tokenizer's vocabulary (one is enough; a config alone makes an empty tokenizer).
TOKENIZER_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "spm.model", "tokenizer.model",
                   "sentencepiece.model", "sentencepiece.bpe.model")  # fmt: skip


def tokenizer_of(model):
    """The tokenizer of the folder or Hub id ``model`` was loaded from (its source's, for a converted model), or an
    ``ArgumentError`` asking for one. No code runs: a tokenizer of custom code must be passed."""
    from transformers import AutoTokenizer

    from .failures import one_line
    from .models.papa_classes import papa_classes
    from .models.sources import resolve_model

    name = getattr(model.config, "_name_or_path", None)
    name = str(resolve_model(name)) if name and name != "None" else None  # a converted model's says "None"
    try:
        if not name:
            raise ValueError("the model does not say where it was loaded from")
        if Path(name).is_dir() and not any((Path(name) / f).is_file() for f in TOKENIZER_FILES):
            raise ValueError(f"{name} holds no tokenizer files")  # AutoTokenizer would make an empty vocabulary
        with papa_classes(getattr(model.config, "model_type", None)):  # a PAPA config read by the library's class
            return AutoTokenizer.from_pretrained(name, trust_remote_code=False)  # never the interactive prompt
    except Exception as err:
        raise ArgumentError(
            "tokenizer",
            f"none given, and the tokenizer of {name or 'the model'} could not be loaded ({one_line(err)[:200]}); "
            "pass the source's tokenizer (tokenizer=...): a checkpoint without one loads no tokenizer that works",
        ) from None
