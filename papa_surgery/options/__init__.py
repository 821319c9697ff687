"""Every option, defined once: a frozen dataclass field that is also a click option, checked by click's types.

A field made with :func:`opt` carries its help text, its click type (``IntRange``, ``FloatRange``,
``Choice``, ``Path``, or the fraction types below) and its CLI spelling. :func:`click_options` turns a
dataclass into click decorators and :func:`from_kwargs` builds it back from what click parsed, so the CLI
checks a value with the field's click type as it parses it. The Python API builds the same dataclasses from
its keyword arguments, and their ``__post_init__`` runs the same click types on the values: one check for
both front ends, in each front end's words. A bad value is an :class:`ArgumentError` (a ``ValueError``) or an
:class:`ArgumentTypeError` (a ``TypeError``) naming the argument; the CLI shows it as a usage error naming
the flag (exit 2).

Messages that must name another option use :func:`spell`, which writes ``overwrite=True`` in the Python API
and ``--overwrite`` on the command line (the CLI switches it with :func:`command_line_spelling`).

Torch-free: ``papa-surgery --help`` imports this module.
"""

from ..failures import ArgumentError, ArgumentTypeError, command_line_spelling, flag, spell
from .checks import (
    FRACTION,
    POSITIVE_FLOAT,
    POSITIVE_INT,
    SLOTS,
    Checked,
    DeviceType,
    FractionListType,
    FractionType,
    check_arguments,
    click_options,
    from_kwargs,
    group_errors,
    opt,
    optional_group,
    split_kwargs,
)
from .groups import (
    DEFAULT_CORPUS_HELP,
    HEAL_WITH_SOURCE,
    AnalyzeOptions,
    CalibrationOptions,
    ConvertOptions,
    DistillOptions,
    FileOutputOptions,
    FinetuneOptions,
    HealOptions,
    PushOptions,
    RankOptions,
    RunOptions,
    SweepOptions,
)

__all__ = [
    "DEFAULT_CORPUS_HELP",
    "HEAL_WITH_SOURCE",
    "FRACTION",
    "POSITIVE_FLOAT",
    "POSITIVE_INT",
    "SLOTS",
    "AnalyzeOptions",
    "ArgumentError",
    "ArgumentTypeError",
    "CalibrationOptions",
    "Checked",
    "ConvertOptions",
    "DeviceType",
    "DistillOptions",
    "FileOutputOptions",
    "FinetuneOptions",
    "HealOptions",
    "FractionListType",
    "FractionType",
    "PushOptions",
    "RankOptions",
    "RunOptions",
    "SweepOptions",
    "check_arguments",
    "click_options",
    "command_line_spelling",
    "flag",
    "from_kwargs",
    "opt",
    "group_errors",
    "optional_group",
    "spell",
    "split_kwargs",
]
