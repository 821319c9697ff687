"""``papa-surgery``: the command line, a thin click layer over the library (DESIGN.md section 5).

Every command is a short adapter: options come from :mod:`papa_surgery.options`, the work from one
library call, imported lazily so ``--help`` answers at once. Exit codes: 0 ok, 1 a failed run (one line
on stderr; the traceback with ``--verbose``), 2 bad usage.
"""

from __future__ import annotations

import logging

import click

from . import __version__
from .cli_experiments import finetune, probe, progress_of, report
from .command_line import command_line as _command_line
from .command_line import show_user_warnings
from .distributed import is_main_process, scale_out
from .failures import shown_error
from .options import (
    CalibrationOptions,
    ConvertOptions,
    DistillOptions,
    PushOptions,
    RankOptions,
    RunOptions,
    click_options,
    from_kwargs,
)


class PapaGroup(click.Group):
    """Turns library errors into one clear line and exit code 1."""

    def invoke(self, ctx):
        from .atomic import Terminated, signals_raise

        try:
            with signals_raise():  # SIGTERM/SIGHUP unwind like Ctrl-C, so partial outputs are removed
                return super().invoke(ctx)
        except (click.exceptions.Exit, click.exceptions.Abort, click.ClickException):
            raise
        except Terminated as stop:
            click.echo(f"Error: {stop}; partial outputs were removed", err=True)
            raise
        except Exception as err:  # a failed run: one line, no traceback unless --verbose
            shown = shown_error(err, verbose=bool(ctx.obj and ctx.obj.get("verbose")))
            if shown is None:
                raise
            raise shown from None


def _given(ctx, name: str) -> bool:
    """Whether option ``name`` was given by the user (command line or environment), not left at its default."""
    from click.core import ParameterSource

    return ctx.get_parameter_source(name) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)


def _check_constants_options(ctx, constants_file: str | None) -> None:
    """With --constants the calibration options do nothing: refuse them rather than silently ignore them."""
    if not constants_file:
        return
    from .constants import Constants

    constants = Constants.load(constants_file)
    if _given(ctx, "max_length") and ctx.params["max_length"] != constants.max_length:
        raise click.BadParameter(
            f"{ctx.params['max_length']} does not match the {constants.max_length} slots of the constants in "
            f"{constants_file}; drop --max-length (the constants fix L) or calibrate again with it",
            param_hint="'--max-length'",
        )
    for name in ("corpus", "pairs", "max_examples"):
        if name != "pairs" and ctx.params.get("kind") == "distilled":
            continue  # distilling the file's constants reads a corpus
        if _given(ctx, name):
            flag = "--" + name.replace("_", "-")
            raise click.BadParameter(
                f"is not used with --constants (the constants are already calibrated); drop {flag} or --constants",
                param_hint=f"'{flag}'",
            )


@click.group(cls=PapaGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
@click.version_option(__version__, prog_name="papa-surgery")
@click.option("-q", "--quiet", is_flag=True, help="No progress bars or warnings.")
@click.option("-v", "--verbose", is_flag=True, help="More logging, and full tracebacks on errors.")
@click.pass_context
def main(ctx, quiet: bool, verbose: bool):
    """Replace a pretrained encoder's attention heads with constant matrices (PAPA, Hassid et al. 2022).

    MODEL is a Hub id, a local folder, or `minilm` for the embedded all-MiniLM-L6-v2.
    """
    ctx.ensure_object(dict)
    ctx.obj.update(quiet=quiet, verbose=verbose)
    level = logging.DEBUG if verbose else logging.ERROR if quiet else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s: %(message)s")
    if not verbose:
        import os

        os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
        os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    if quiet:
        import os

        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    show_user_warnings(quiet)


@main.command()
@click.argument("model")
@click_options(CalibrationOptions)
@click.option(
    "--kind",
    type=click.Choice(("average", "distilled")),
    default="average",
    show_default=True,
    help="average: the paper's averaged attention; distilled: then trained to match the source's hidden states "
    "with every head constant.",
)
@click_options(DistillOptions)
@click_options(RunOptions)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output constants file (.safetensors).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier constants file (never another file).")
@click.pass_context
@scale_out
def calibrate(ctx, model, kind, out, overwrite, **kwargs):
    """Average every head's attention over an unlabelled corpus (paper 3.1), or distil it (--kind distilled)."""
    from .pipeline import run_calibrate

    path = run_calibrate(
        model,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        out,
        progress=progress_of(ctx),
        overwrite=overwrite,
        kind=kind,
        distill=from_kwargs(DistillOptions, kwargs),
    )
    click.echo(f"wrote {path}")


@main.command()
@click.argument("model")
@click_options(RankOptions)
@click.option("--constants", type=click.Path(exists=True, dir_okay=False), help="Constants file (for variance/lambda).")
@click_options(CalibrationOptions)
@click_options(RunOptions)
@click.option("--out", required=True, type=click.Path(dir_okay=False), help="Output ranking file (.json).")
@click.option("--overwrite", is_flag=True, help="Replace an earlier ranking file (never another file).")
@click.pass_context
@scale_out
def rank(ctx, model, constants, out, overwrite, **kwargs):
    """Order the heads from first to last to make constant (paper 3.2, 5.4)."""
    from .pipeline import run_rank

    if not kwargs.get("method"):
        raise click.UsageError("missing option '--method'")
    _check_constants_options(ctx, constants)
    path = run_rank(
        model,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(RankOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        constants,
        out,
        progress=progress_of(ctx),
        overwrite=overwrite,
    )
    click.echo(f"wrote {path}")


@main.command()
@click.argument("model")
@click_options(ConvertOptions)
@click_options(CalibrationOptions)
@click_options(DistillOptions)
@click_options(RankOptions)
@click_options(RunOptions)
@click.option("--push", "do_push", is_flag=True, help="Publish the checkpoint to the Hub after writing it.")
@click_options(PushOptions)
@click.pass_context
@scale_out
def convert(ctx, model, do_push, **kwargs):
    """Make a PAPA checkpoint: calibrate, rank, convert, write the folder (and --push it)."""
    from .pipeline import run_convert

    fraction = kwargs["fraction"]
    if not 0.0 <= fraction <= 1.0:
        raise click.BadParameter(
            f"{fraction} is not between 0 and 1 (the share of heads made constant)", param_hint="'--fraction'"
        )
    _check_constants_options(ctx, kwargs.get("constants"))
    out = run_convert(
        model,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(RankOptions, kwargs),
        from_kwargs(ConvertOptions, kwargs),
        from_kwargs(PushOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        do_push=do_push,
        command=_command_line(ctx),
        progress=progress_of(ctx),
        distill=from_kwargs(DistillOptions, kwargs),
    )
    from .inspect_checkpoint import describe

    d = describe(out) if is_main_process() else {}
    click.echo(f"wrote {out} ({d.get('num_constant_heads', '?')} of {d.get('num_heads_total', '?')} heads constant)")


@main.command("inspect")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
def inspect_(directory):
    """What a PAPA checkpoint holds: heads, kind, ranking, corpus, sizes."""
    from .inspect_checkpoint import describe, format_description

    d = describe(directory)
    click.echo(format_description(d))
    if d["problems"]:  # validated the way loading will: a folder that would not load is a failed inspection
        raise ValueError(f"{directory} would not load: {'; '.join(d['problems'])}")


@main.command()
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click_options(PushOptions)
def push(directory, **kwargs):
    """Publish a checkpoint folder to the Hugging Face Hub in one commit."""
    from .hub import push as hub_push

    opts = from_kwargs(PushOptions, kwargs)  # without --repo-id: <the token's namespace>/<folder name>
    url = hub_push(directory, opts.repo_id, private=opts.private, revision=opts.revision, create_pr=opts.create_pr)
    click.echo(f"pushed {directory} -> {url}")


@main.command()
@click.argument("model")
@click.argument("analysis", type=click.Choice(("norms", "effective")))
@click.option("--corpus", help="Corpus to analyse (as for calibrate). Default: the bundled WikiText-2 excerpt.")
@click.option("--max-length", default=128, show_default=True, type=click.IntRange(min=4), help="Slots L.")
@click.option("--max-examples", default=1000, show_default=True, type=click.IntRange(min=1), help="Examples to use.")
@click.option("--batch-size", default=32, show_default=True, type=click.IntRange(min=1), help="Examples per batch.")
@click.option("--device", help="Device (cpu, cuda...).")
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder (JSON + figures).")
@click.pass_context
@scale_out
def analyze(ctx, model, analysis, corpus, max_length, max_examples, batch_size, device, out):
    """Norm-based (Kobayashi 2020) or effective (Brunner 2020) attention analysis."""
    try:
        from .api import analyze as run_analysis
    except ImportError:
        raise RuntimeError("`papa-surgery analyze` is not yet available in this version") from None
    from pathlib import Path

    from .atomic import staged_dir
    from .corpus import default_corpus, load_corpus
    from .loading import load_config
    from .preflight import check_max_length
    from .sources import load_model, resolve_model

    config = load_config(resolve_model(model))
    if getattr(config, "papa_constant_heads", None) is not None and config.papa_constant_heads:
        raise ValueError(
            f"{model} is a PAPA checkpoint: its constant heads have no input-dependent attention to analyse; "
            f"analyze its source model ({getattr(config, 'papa_source_model', None) or 'see papa_recipe.json'})"
        )
    check_max_length(config, max_length, model)
    src = load_corpus(corpus, max_examples=max_examples) if corpus else default_corpus(max_examples=max_examples)
    # The analyses read attention probabilities: load eager (a PAPA checkpoint too), whatever the config says.
    model_obj, tokenizer = load_model(model, RunOptions(device=device, batch_size=batch_size), attn="eager")
    target = Path(out)
    # A new folder appears only when the analysis is complete; an existing one is written into, as before.
    stage = staged_dir(target) if is_main_process() and not target.exists() else _existing(target)
    with stage as folder:
        run_analysis(
            model_obj,
            tokenizer,
            src,
            analysis,
            folder,
            max_length=max_length,
            batch_size=batch_size,
            progress=progress_of(ctx),
            source_name=model,
        )
    for path in sorted(target.iterdir()) if is_main_process() else ():
        click.echo(f"wrote {path}")


def _existing(folder):
    import contextlib

    return contextlib.nullcontext(folder)


for _command in (probe, finetune, report):
    main.add_command(_command)


if __name__ == "__main__":  # pragma: no cover
    main()
