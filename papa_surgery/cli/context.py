"""What every command shares: verbosity (``-q``/``-v`` before or after the command name), progress, errors.

Exit codes: 0 ok, 1 a failed run (one line on stderr; the traceback with ``--verbose``), 2 bad usage (a
click usage error, or a library :class:`~papa_surgery.options.ArgumentError` shown as the flag's error),
130 interrupted with Ctrl-C. Torch-free.
"""

from __future__ import annotations

import logging
import os

import click

from .recorded import show_user_warnings

INTERRUPTED = 130  # 128 + SIGINT, the shell's convention


def configure(ctx: click.Context, quiet: bool = False, verbose: bool = False) -> None:
    """Set this run's verbosity (the group's flags and a command's own ``-q``/``-v`` add up)."""
    root = ctx.find_root()
    root.ensure_object(dict)
    obj = root.obj
    obj["quiet"] = obj.get("quiet", False) or quiet
    obj["verbose"] = obj.get("verbose", False) or verbose
    if ctx is not root:
        ctx.obj = obj
    level = logging.DEBUG if obj["verbose"] else logging.ERROR if obj["quiet"] else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s")
    logging.getLogger().setLevel(level)
    if not obj["verbose"]:
        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if obj["quiet"]:
        os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"
    show_user_warnings(obj["quiet"])


def _set(name: str):
    def callback(ctx, param, value):
        if value:
            configure(ctx, **{name: True})

    return callback


def verbosity(command):
    """``-q``/``--quiet`` and ``-v``/``--verbose`` on a command too, so they work after its name."""
    command = click.option(
        "-v", "--verbose", is_flag=True, expose_value=False, is_eager=True, callback=_set("verbose"),
        help="More logging, and full tracebacks on errors.",
    )(command)  # fmt: skip
    return click.option(
        "-q", "--quiet", is_flag=True, expose_value=False, is_eager=True, callback=_set("quiet"),
        help="No progress bars or warnings.",
    )(command)  # fmt: skip


def progress_of(ctx) -> bool:
    """Whether to show progress bars (not with ``-q``)."""
    return not (ctx.find_root().obj or {}).get("quiet", False)


def given(ctx, name: str) -> bool:
    """Whether option ``name`` was given by the user (command line or environment), not left at its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


class PapaGroup(click.Group):
    """Runs a command with flag spelling in library messages, and turns its errors into one line and a status."""

    def invoke(self, ctx):
        from ..failures import shown_error
        from ..options import command_line_spelling
        from ..outputs.signals import Terminated, signals_raise

        try:
            # SIGTERM/SIGHUP unwind like Ctrl-C, so partial outputs are removed
            with signals_raise(), command_line_spelling():
                return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException):
            raise
        except (KeyboardInterrupt, click.exceptions.Abort):
            click.echo("Aborted: interrupted; partial outputs were removed", err=True)
            raise click.exceptions.Exit(INTERRUPTED) from None
        except Terminated as stop:
            click.echo(f"Error: {stop}; partial outputs were removed", err=True)
            raise
        except Exception as err:  # a failed run: one line, no traceback unless --verbose
            shown = shown_error(err, verbose=bool(ctx.obj and ctx.obj.get("verbose")))
            if shown is None:
                raise
            raise shown from None
