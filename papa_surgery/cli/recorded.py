"""What the command line records and shows: the command as a user would retype it, and user-facing warnings.

Both stay torch-free, so ``--help`` answers at once.
"""

from __future__ import annotations

import shlex

import click

from ..options.checks import is_given

PATH_OPTIONS = ("corpus", "constants", "ranking", "results", "out", "data_dir")
MODEL_PARAMS = ("model", "model_or_dir", "teacher")  # a Hub id, the embedded model or a local model folder
LOCAL_MODEL = "<local model>"


def _public_path(value: str) -> str:
    """A local path as its last component (no home folders in recipes and cards); anything else unchanged."""
    import os
    from pathlib import Path

    text = str(value)
    if os.path.isabs(text) or text.startswith(("~", "./", "../")) or (os.sep in text and Path(text).exists()):
        return Path(text.rstrip("/\\")).name or text
    return text


def _public_model(name: str) -> str:
    """MODEL as the command line records it: itself, its Hub id for a local copy, or ``<local model>``."""
    from pathlib import Path

    if name in ("minilm", "embedded") or not (Path(name).expanduser().exists() or name.startswith(("/", ".", "~"))):
        return name
    from ..models.sources import source_info

    return source_info(name).get("hub_id") or LOCAL_MODEL


def command_line(ctx) -> str:
    """The command as a user would retype it: arguments, then every option that differs from its default.

    Local paths are not recorded: a local model (MODEL, ``--teacher``) becomes its Hub id (or ``<local model>``),
    and other paths (path options, CHECKPOINT and the like) keep only their last component.
    """
    parts = ["papa-surgery", ctx.info_name]
    for param in ctx.command.params:
        value = ctx.params.get(param.name)
        if isinstance(param, click.Argument):  # a model, or a local folder or file (CHECKPOINT, DIRECTORY...)
            parts.append(_public_model(str(value)) if param.name in MODEL_PARAMS else _public_path(str(value)))
        elif is_given(value) and value != () and value != param.default:
            flag = max(param.opts, key=len)
            values = value if isinstance(value, tuple) else (value,)
            for v in values:
                if isinstance(v, str) and param.name in (*PATH_OPTIONS, *MODEL_PARAMS):
                    v = _public_model(v) if param.name in MODEL_PARAMS else _public_path(v)
                parts.extend([flag] if v is True else [flag, str(v)])
    return " ".join(shlex.quote(p) for p in parts)


USER_WARNINGS = ("CoverageWarning", "LambdaNoiseWarning")


def show_user_warnings(quiet: bool) -> None:
    """Warnings meant for the user (``CoverageWarning``, ``LambdaNoiseWarning``) print as one plain line."""
    import warnings

    default = getattr(warnings.showwarning, "papa_default", warnings.showwarning)  # installed once per process

    def show(message, category, filename, lineno, file=None, line=None):
        if category.__name__ not in USER_WARNINGS:  # matched by name: importing them would import torch
            return default(message, category, filename, lineno, file, line)
        if not quiet:
            click.echo(f"warning: {message}", err=True)

    show.papa_default = default
    warnings.showwarning = show
