"""How a failed command ends: the one line it shows (the traceback with ``--verbose``) and its exit status.

Exit statuses: 1 for a failed run, 2 for bad usage (a click usage error or an :class:`ArgumentError` of the
library, here or in another process of the run). The command line (:class:`papa_surgery.cli.context.PapaGroup`)
uses this for one process; under a launcher rank 0 uses it to say the run's error while the other processes
wait (:func:`papa_surgery.distributed.scale_out`).

The library's own errors about a bad argument are :class:`ArgumentError` / :class:`ArgumentTypeError`, in the
words of the front end in use: :func:`spell` writes ``overwrite=True`` in Python and ``--overwrite`` inside
:func:`command_line_spelling` (every CLI command). Nothing here imports torch or click at module level.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import click


class ArgumentError(ValueError):
    """A bad value for one argument, in the library's words; the CLI shows it as bad usage of the matching flag."""

    def __init__(self, argument: str, detail: str):
        self.argument, self.detail = argument, detail
        super().__init__(f"{argument}: {detail}")


class ArgumentTypeError(TypeError):
    """An argument of the wrong type (``fraction="0.5"``); only the Python API can pass one."""

    def __init__(self, argument: str, detail: str):
        self.argument, self.detail = argument, detail
        super().__init__(f"{argument}: {detail}")


_CLI = contextvars.ContextVar("papa_cli_spelling", default=False)


# Arguments the commands take by position (``papa-surgery heal CHECKPOINT``), named as ``--help`` shows them.
POSITIONAL = {"model", "checkpoint", "directory", "model_or_dir", "analysis"}


# Python arguments that hold a group the command line gives as flags: named by the flag that turns the group on.
GROUP_SWITCHES = {"heal_options": "heal_steps"}
# A sweep's fields holding the values of a flag given once per value (``SweepConfig.tasks``: ``--task`` repeated).
REPEATED_FLAGS = {"tasks": "task"}


def flag(name: str) -> str:
    """The command-line flag of argument ``name`` (``max_length`` -> ``--max-length``; a positional argument as
    ``--help`` names it: ``checkpoint`` -> ``CHECKPOINT``; a group by its switch: ``heal_options`` ->
    ``--heal-steps``; a sweep's repeated flag by its own name: ``tasks`` -> ``--task``)."""
    if name in POSITIONAL:
        return name.upper()
    name = GROUP_SWITCHES.get(name, REPEATED_FLAGS.get(name, name))
    return "--" + name.replace("_", "-")


_NO_VALUE = object()


def on_command_line() -> bool:
    """Whether messages are being spelled for the command line (else for the Python API)."""
    return _CLI.get()


def spell(name: str, value: Any = _NO_VALUE) -> str:
    """How the user passes argument ``name`` (with ``value``) in the front end in use.

    ``spell("overwrite", True)`` is ``overwrite=True`` in Python and ``--overwrite`` on the command line;
    ``spell("max_length", 512)`` is ``max_length=512`` / ``--max-length 512``; ``spell("task")`` is
    ``task=...`` / ``--task``.
    """
    if _CLI.get():
        if value is True:
            return flag(name)
        return flag(name) if value is _NO_VALUE else f"{flag(name)} {value}"
    return f"{name}=..." if value is _NO_VALUE else f"{name}={value!r}"


@contextlib.contextmanager
def command_line_spelling() -> Iterator[None]:
    """Within it, :func:`spell` writes flags (the CLI wraps every command in it)."""
    token = _CLI.set(True)
    try:
        yield
    finally:
        _CLI.reset(token)


class NotFound(FileNotFoundError, ValueError):
    """A path the user named does not exist: a ``FileNotFoundError``, and a ``ValueError`` as before for callers
    that caught that (a failed run on the command line, exit 1)."""

    def __str__(self) -> str:  # the message alone, not OSError's "[Errno ...]" form
        return str(self.args[0]) if self.args else ""


class RemoteFailure(RuntimeError):
    """Another process of the run failed; ``rank`` is the first that did, ``message`` its error."""

    def __init__(self, rank: int, world: int, message: str, usage: bool = False):
        self.rank, self.world, self.message, self.usage = rank, world, message, usage
        super().__init__(f"process {rank} of {world} failed: {message}")


def one_line(err: BaseException) -> str:
    """An error as one line: its message's first line, or its type's name when it has no message."""
    text = str(err).strip()
    return text.splitlines()[0] if text else type(err).__name__


def is_usage_error(err: BaseException) -> bool:
    """Whether ``err`` is bad usage (exit 2): a click usage error or an argument error of the library."""
    import click

    return isinstance(err, (click.UsageError, ArgumentError, ArgumentTypeError))


def shown_error(err: Exception, verbose: bool = False) -> click.ClickException | None:
    """The click error a failed run shows: one line, exit 1; bad usage exit 2. ``None`` when ``verbose`` (traceback)."""
    import click

    if isinstance(err, click.ClickException):
        return err
    if verbose:
        return None
    if isinstance(err, (ArgumentError, ArgumentTypeError)):  # the library's argument is the command's flag
        return click.BadParameter(err.detail, param_hint=f"'{flag(err.argument)}'")
    if isinstance(err, RemoteFailure) and err.usage:  # another process's bad usage is bad usage here too
        return click.UsageError(str(err))
    return click.ClickException(one_line(err))


def exit_status(err: Exception) -> int:
    """The status a process ends with after ``err`` (what :func:`report` returns, without saying anything)."""
    return shown_error(err).exit_code


def report(err: Exception, verbose: bool = False) -> int:
    """Say ``err`` on stderr as the command line does (one line; the traceback when ``verbose``); its status."""
    shown = shown_error(err, verbose)
    if shown is None:
        import traceback

        traceback.print_exception(err)
        sys.stderr.flush()
        return 1
    shown.show()
    return shown.exit_code
