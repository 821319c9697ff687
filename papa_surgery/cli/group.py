"""``papa-surgery``: the command line, a thin click layer over the library (docs/design.md).

Every command is a short adapter (``commands``, ``checkpoints``, ``experiments``): options come from
:mod:`papa_surgery.options`, the work from one library call, imported lazily so ``--help`` answers at once.
Exit codes (``context``): 0 ok, 1 a failed run, 2 bad usage, 130 interrupted.
"""

from __future__ import annotations

import click

from .. import __version__
from .checkpoints import inspect_, push
from .commands import analyze, calibrate, convert, heal, rank
from .context import PapaGroup, configure
from .experiments import finetune, probe, report


@click.group(cls=PapaGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="papa-surgery")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or warnings (also after the command name).")
@click.option("-v", "--verbose", is_flag=True, help="More logging, and full tracebacks on errors (also after it).")
@click.pass_context
def main(ctx, quiet: bool, verbose: bool):
    """Replace a pretrained encoder's attention heads with constant matrices (PAPA, Hassid et al. 2022).

    MODEL is a Hub id, a local folder, or `minilm` for the embedded all-MiniLM-L6-v2.
    """
    configure(ctx, quiet=quiet, verbose=verbose)


for _command in (calibrate, rank, convert, heal, inspect_, push, probe, finetune, report, analyze):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
