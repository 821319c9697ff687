"""How an option is defined and checked: errors in each front end's words, click types, ``opt`` fields.

See :mod:`papa_surgery.options` for the whole picture.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import numbers
import os
import re
from collections.abc import Iterable
from dataclasses import field
from fractions import Fraction
from typing import Any

import click

from ..failures import ArgumentError, ArgumentTypeError, flag

# ---------------------------------------------------------------------------------------- click types


class FractionType(click.ParamType):
    """A share between 0 and 1, as a decimal or a fraction (``0.875`` or ``7/8``)."""

    name = "fraction"
    py_types = (int, float, Fraction)  # the Python API's numbers; a string is the command line's spelling

    def convert(self, value, param, ctx) -> float:
        if isinstance(value, bool):
            self.fail(f"{value!r} is not a number between 0 and 1", param, ctx)
        try:
            number = float(Fraction(str(value).strip())) if isinstance(value, str) else float(value)
        except (ValueError, ZeroDivisionError, TypeError):
            self.fail(
                f"{value!r} is not a number between 0 and 1 (a decimal such as 0.875 or a fraction 7/8)", param, ctx
            )
        if math.isnan(number) or not 0.0 <= number <= 1.0:
            self.fail(f"{value} is not between 0 and 1 (the share of heads made constant)", param, ctx)
        return number


class FractionListType(click.ParamType):
    """Comma-separated shares between 0 and 1 (``0,1/2,7/8,1``); equal values (``0.5`` and ``1/2``) count once."""

    name = "fractions"
    py_types = (str, list, tuple)

    def convert(self, value, param, ctx) -> tuple[float, ...]:
        if isinstance(value, tuple) and all(isinstance(v, float) for v in value):
            return value  # already converted (click passes defaults through convert too)
        items = value.split(",") if isinstance(value, str) else list(value)
        if not items or any(not str(x).strip() for x in items):
            self.fail(f"{value!r} has an empty item; write the shares separated by commas, e.g. 0,1/2,1", param, ctx)
        one = FractionType()
        out: dict[float, float] = {}
        for item in items:
            number = one.convert(item, param, ctx)
            out.setdefault(round(number, 6), number)
        return tuple(out.values())


class DeviceType(click.ParamType):
    """A torch device this machine has: ``cpu``, ``cuda``, ``cuda:1``, ``mps``, ``xpu``...

    The name is checked first, then (importing torch, only when a device is given) whether this PyTorch build
    and machine can run on it, so ``--device cuda`` on a CPU build is a usage error in plain words, not torch's
    message after the model has loaded.
    """

    name = "device"
    py_types = (str,)
    _PATTERN = re.compile(r"^(cpu|cuda|mps|xpu|npu|hpu|meta)(:\d+)?$")

    def convert(self, value, param, ctx) -> str:
        text = str(value)
        if not (hasattr(value, "type") and hasattr(value, "index")) and not self._PATTERN.match(text):  # torch.device
            self.fail(f"{value!r} is not a device: use cpu, cuda, cuda:N, mps or xpu", param, ctx)
        problem = device_unavailable(text)
        if problem:
            self.fail(problem, param, ctx)
        return text


def device_unavailable(name: str) -> str | None:
    """Why this PyTorch cannot run on device ``name`` here, in plain words (``None``: it can)."""
    import os

    kind, _, index = name.partition(":")
    if kind not in ("cuda", "mps", "xpu"):
        return None  # cpu; meta; accelerators of third-party plugins (npu, hpu) check themselves
    import torch

    build = f"this PyTorch ({torch.__version__})"
    if kind == "cuda":
        if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
            return f"{name} is not available: {build} is built without CUDA; use cpu or a CUDA build of PyTorch"
        count = torch.cuda.device_count()
        if count == 0:
            visible = os.environ.get("CUDA_VISIBLE_DEVICES")
            where = f" (CUDA_VISIBLE_DEVICES={visible!r})" if visible is not None else ""
            return f"{name} is not available: no CUDA GPU is visible{where}; use cpu"
        if index and int(index) >= count:
            return f"{name} is not available: {count} CUDA GPU(s) are visible (cuda:0 to cuda:{count - 1})"
    elif kind == "mps":
        mps = getattr(torch.backends, "mps", None)
        if mps is None or not mps.is_built():
            return f"{name} is not available: {build} is built without MPS (Apple GPU) support; use cpu"
        if not mps.is_available():
            return f"{name} is not available on this machine (MPS needs an Apple GPU and macOS 12.3 or later); use cpu"
    elif not (hasattr(torch, "xpu") and torch.xpu.is_available()):
        return f"{name} is not available: {build} sees no Intel XPU; use cpu"
    return None


FRACTION = FractionType()
POSITIVE_INT = click.IntRange(min=1)
POSITIVE_FLOAT = click.FloatRange(min=0, min_open=True)
SLOTS = click.IntRange(min=4)

# ------------------------------------------------------------------------------------- defining options


def opt(
    help: str,
    default: Any = None,
    *,
    flag: str | None = None,
    short: str | None = None,
    cli: bool = True,
    **click_kwargs,
):
    """A dataclass field that is also a click option (``--name`` from the field name unless ``flag``).

    ``cli=False``: an argument of the Python API only (checked the same way, no flag of its own).
    """
    meta = {"help": help, "flag": flag, "short": short, "cli": cli, "click": click_kwargs}
    return field(default=default, metadata=meta)


def _python_types(meta: dict) -> tuple[type, ...] | None:
    """The Python types the API may pass for a field (``None``: anything the click type converts)."""
    kwargs = meta.get("click", {})
    if kwargs.get("is_flag"):
        return (bool,)
    kind = kwargs.get("type")
    if isinstance(kind, (click.IntRange,)) or kind is int:
        return (int,)
    if isinstance(kind, (click.FloatRange,)) or kind is float:
        return (int, float)
    if isinstance(kind, click.Choice):
        return (str,)
    if isinstance(kind, click.Path):
        return (str, os.PathLike)
    return getattr(kind, "py_types", None)


def _described(value) -> str:
    return f"the {type(value).__name__} {value!r}"


class Checked:
    """Mixin for option dataclasses: every field is checked with its click type when the dataclass is built."""

    def __post_init__(self):
        for f in dataclasses.fields(self):
            meta = f.metadata
            value = getattr(self, f.name)
            if "help" not in meta:
                continue
            if value is None and meta["click"].get("required"):
                raise ArgumentError(f.name, "is required")
            if value is None or (value == f.default and type(value) is type(f.default)):
                continue
            kwargs = meta["click"]
            if kwargs.get("multiple"):
                values = value if isinstance(value, (tuple, list)) else (value,)
                checked = tuple(_check(f.name, meta, v) for v in values)
                object.__setattr__(self, f.name, checked)
            else:
                object.__setattr__(self, f.name, _check(f.name, meta, value))


def _plain(value, types: tuple[type, ...]):
    """numpy's integers and floats as Python's, a ``torch.device`` as its name: values a field's type stands for."""
    if isinstance(value, bool) or isinstance(value, types):
        return value
    if int in types and isinstance(value, numbers.Integral):
        return int(value)
    if float in types and isinstance(value, numbers.Real):
        return float(value)
    if str in types and type(value).__module__ == "torch" and type(value).__name__ == "device":
        return str(value)
    return value


def _check(name: str, meta: dict, value):
    types = _python_types(meta)
    value = value if types is None else _plain(value, types)
    if types is not None and (
        not isinstance(value, types)
        or (isinstance(value, bool) and bool not in types and not meta["click"].get("is_flag"))
    ):
        want = " or ".join(t.__name__ for t in types)
        raise ArgumentTypeError(name, f"must be {want}, got {_described(value)}")
    kind = meta["click"].get("type")
    if isinstance(kind, click.ParamType):
        try:
            return kind.convert(value, None, None)
        except click.BadParameter as err:
            raise ArgumentError(name, err.message) from None
    return value


def is_given(value) -> bool:
    """Whether a parsed option's value was given: not ``None`` and not ``False``, by identity, since ``0 == False``
    and an option given as 0 (``--heal-warmup 0``, ``--fraction 0``) is given."""
    return value is not None and value is not False


def _prefixed(name: str, prefix: str | None) -> str:
    return f"{prefix}_{name}" if prefix else name


def click_options(
    cls,
    only: tuple[str, ...] | None = None,
    exclude: tuple[str, ...] = (),
    prefix: str | None = None,
    switch: str | None = None,
    helps: dict[str, str] | None = None,
):
    """Decorator adding one click option per field of the dataclass ``cls`` (in field order; ``only`` those, none of
    ``exclude``: an option the command would only refuse, such as ``rank --ranking``).

    ``helps`` replaces a field's help where one command reads the option its own way (``heal --corpus``).

    ``prefix`` names the options ``--<prefix>-<name>`` (parameter ``<prefix>_<name>``) where a command holds the
    group as an optional extra beside options it would clash with (``convert --heal-steps`` beside the lambda
    ranking's ``--steps``): they default to unset, the help says the group's default, and
    :func:`optional_group` reads them back (``None`` unless the group's ``switch`` option is given).
    """

    unknown = (set(only or ()) | set(exclude)) - {f.name for f in dataclasses.fields(cls)}
    if unknown:  # a misspelt name would silently keep (or drop) an option
        raise TypeError(f"{cls.__name__} has no option field {', '.join(sorted(unknown))}")

    def decorate(func):
        for f in reversed(dataclasses.fields(cls)):
            chosen = (only is None or f.name in only) and f.name not in exclude
            if "help" not in f.metadata or not f.metadata["cli"] or not chosen:
                continue
            meta = f.metadata
            name = _prefixed(f.name, prefix)
            names = [flag(name) if prefix else meta["flag"] or flag(name)]
            if meta["short"] and not prefix:
                names.insert(0, meta["short"])
            kwargs = dict(meta["click"])
            help_text = (helps or {}).get(f.name, meta["help"])
            if prefix:  # unset unless given: the group is off without its switch (optional_group)
                if f.name == switch:
                    help_text += f" Off unless given; the other {flag(prefix)}-* options then apply."
                elif f.default is not None and not kwargs.get("is_flag"):
                    help_text += f" [default: {f.default}]"
                kwargs["required"] = False
            elif kwargs.get("is_flag"):
                kwargs.setdefault("default", bool(f.default))
            elif f.default is not None and not isinstance(f.default, dataclasses._MISSING_TYPE):
                kwargs.setdefault("default", f.default)  # click 8.2+ treats default=None as a value when required
                kwargs.setdefault("show_default", True)
            func = click.option(*names, name, help=help_text, **kwargs)(func)
        return func

    return decorate


def from_kwargs(cls, kwargs: dict):
    """Build ``cls`` from parsed click values (or API keyword arguments), ignoring keys of other option groups."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in names})


def optional_group(cls, kwargs: dict, prefix: str, switch: str):
    """``cls`` from options added with ``click_options(cls, prefix=prefix)``, or ``None`` when ``--<prefix>-<switch>``
    is not given (the group is off); another of its options without the switch is a usage error."""
    values = {f.name: kwargs.get(_prefixed(f.name, prefix)) for f in dataclasses.fields(cls)}
    given = {k: v for k, v in values.items() if is_given(v)}
    if switch not in given:
        if given:
            name = _prefixed(next(iter(given)), prefix)
            raise ArgumentError(name, f"does nothing without {flag(_prefixed(switch, prefix))}")
        return None
    with group_errors(cls, prefix):  # a field of the group, named as this command spells it (--heal-...)
        return cls(**given)


@contextlib.contextmanager
def group_errors(cls, prefix: str, own: Iterable[str] = ()):
    """Inside, an ``ArgumentError`` about a field of ``cls`` (raised by the job, such as healing's ``heldout``)
    names the option as a command holding the group under ``prefix`` spells it (``convert --heal-heldout``): the
    bare name is another command's flag (``heal --heldout``). Names in ``own`` (the command's unprefixed options,
    such as the lambda ranking's ``steps``) are the command's own and kept."""
    names = {f.name for f in dataclasses.fields(cls)} - set(own)
    try:
        yield
    except ArgumentError as err:
        if err.argument not in names:
            raise
        raise ArgumentError(_prefixed(err.argument, prefix), err.detail) from None


def check_arguments(values: dict, *classes) -> dict:
    """``values`` with each one that is a field of ``classes`` (the first that has it) checked and converted by that
    field's click type, as building the dataclass would; for calls that take some of a group's options loosely
    (``papa_surgery.probe``'s ``max_train_examples``). ``None`` is left as it is; other keys pass through."""
    fields = {}
    for cls in reversed(classes):
        fields.update({f.name: f for f in dataclasses.fields(cls) if "help" in f.metadata})
    return {
        name: value if value is None or name not in fields else _check(name, fields[name].metadata, value)
        for name, value in values.items()
    }


def split_kwargs(kwargs: dict, *classes) -> tuple:
    """One dataclass per class from ``kwargs``; ``TypeError`` for a keyword none of them has."""
    known = {f.name for cls in classes for f in dataclasses.fields(cls)}
    unknown = sorted(set(kwargs) - known)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
        )
    return tuple(from_kwargs(cls, kwargs) for cls in classes)
