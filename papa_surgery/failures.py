"""How a failed command ends: the one line it shows (the traceback with ``--verbose``) and its exit status.

Exit statuses: 1 for a failed run, 2 for bad usage (a click usage error or an :class:`OptionError`, here or in
another process of the run). The command line (:class:`papa_surgery.cli.PapaGroup`) uses this for one
process; under a launcher rank 0 uses it to say the run's error while the other processes wait
(:func:`papa_surgery.distributed.scale_out`). Nothing here imports torch or click at module level.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click


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
    """Whether ``err`` is bad usage (exit 2): a click usage error or an :class:`OptionError`."""
    import click

    from .options import OptionError

    return isinstance(err, (click.UsageError, OptionError))


def shown_error(err: Exception, verbose: bool = False) -> click.ClickException | None:
    """The click error a failed run shows: one line, exit 1; bad usage exit 2. ``None`` when ``verbose`` (traceback)."""
    import click

    from .options import OptionError

    if isinstance(err, click.ClickException):
        return err
    if verbose:
        return None
    if isinstance(err, OptionError):
        return click.BadParameter(err.detail, param_hint=f"'{err.option}'")
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
