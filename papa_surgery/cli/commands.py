"""The workflow's commands: ``calibrate``, ``rank``, ``convert``, ``heal``, ``analyze``: each a few lines over a job.

Options come from :mod:`papa_surgery.options` (defined once, checked by click's types); the work is one
call of :mod:`papa_surgery.workflow.jobs`, imported when the command runs so ``--help`` answers at once.
"""

from __future__ import annotations

import dataclasses

import click

from .. import registry
from ..distributed import is_main_process, scale_out
from ..options import (
    HEAL_WITH_SOURCE,
    AnalyzeOptions,
    CalibrationOptions,
    ConvertOptions,
    DistillOptions,
    FileOutputOptions,
    HealOptions,
    PushOptions,
    RankOptions,
    RunOptions,
    click_options,
    from_kwargs,
    group_errors,
    optional_group,
)
from .context import given, progress_of, verbosity
from .recorded import command_line

HEALING_CORPUS_HELP = (
    "Healing corpus: unlabelled text the model learns its source's outputs on, anything calibrate's --corpus reads. "
    "Default: the texts bundled with papa-surgery, the UD English-EWT training sentences (web text of five genres) "
    "and the WikiText-2 excerpt, online or not; text like your own heals further."
)


def _tuning(ctx) -> tuple[str, ...]:
    """The options that tune one kind (``DistillOptions``) the user set: refused for constants of another kind."""
    return tuple(f.name for f in dataclasses.fields(DistillOptions) if given(ctx, f.name))


def _ranks_on_text(ctx, constants) -> bool:
    """Whether this ``rank`` or ``convert`` with ``constants`` makes a ranking that runs the model on the corpus
    (``sensitivity``: asked for, or ``convert``'s default where it ranks at all: not with --ranking, nor at fraction 0
    or 1)."""
    p = ctx.params
    if p.get("ranking"):
        return False
    name = p.get("method")
    if name is None and ctx.info_name == "convert":
        if p.get("task") is None and p.get("fraction") in (0.0, 1.0):
            return False  # every head or none: no ranking is made
        name = registry.default_convert_method(p.get("task"), constants.max_length, constants.pairs)
    return name is not None and registry.method(name).corpus


def _refuse_calibration_with_constants(ctx, constants_file: str | None) -> None:
    """With --constants the calibration options do nothing: refuse them rather than silently ignore them."""
    if not constants_file:
        return
    from ..calibration.constants import Constants

    constants = Constants.load(constants_file)
    if given(ctx, "max_length") and ctx.params["max_length"] != constants.max_length:
        raise click.BadParameter(
            f"{ctx.params['max_length']} does not match the {constants.max_length} slots of the constants in "
            f"{constants_file}; drop --max-length (the constants fix L) or calibrate again with it",
            param_hint="'--max-length'",
        )
    fits = ctx.params.get("kind") in registry.TRAINED_KINDS or ctx.params.get("heal_steps")
    reads = fits or _ranks_on_text(ctx, constants)
    for name in ("corpus", "pairs", "max_examples"):
        if name != "pairs" and reads:
            continue  # distilling, healing or a ranking measured on text reads a corpus
        if given(ctx, name):
            flag = "--" + name.replace("_", "-")
            raise click.BadParameter(
                f"not used when --constants is given (the constants are already calibrated); drop {flag} or "
                "--constants",
                param_hint=f"'{flag}'",
            )


@click.command()
@click.argument("model")
@click_options(CalibrationOptions)
@click_options(ConvertOptions, only=("kind", "storage", "compact_band", "compact_rank"))
@click_options(DistillOptions)
@click_options(RunOptions)
@click_options(FileOutputOptions)
@verbosity
@click.pass_context
@scale_out
def calibrate(ctx, model, **kwargs):
    """Average every head's attention over an unlabelled corpus (paper 3.1), or make another kind of constants."""
    from ..options.kind_options import check_kind_options
    from ..workflow.jobs import run_calibrate

    check_kind_options(kwargs["kind"] or "average", _tuning(ctx), fitted=True)
    out = from_kwargs(FileOutputOptions, kwargs)
    path = run_calibrate(
        model,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        out.out,
        progress=progress_of(ctx),
        overwrite=out.overwrite,
        kind=kwargs["kind"] or "average",  # calibrate has no file to take a kind from
        distill=from_kwargs(DistillOptions, kwargs),
        storage=ConvertOptions(  # the storage options only (no conversion: the fraction is unused)
            fraction=0,
            storage=kwargs["storage"],
            compact_band=kwargs["compact_band"],
            compact_rank=kwargs["compact_rank"],
        ),
    )
    click.echo(f"wrote {path}")


@click.command()
@click.argument("model")
@click_options(RankOptions, exclude=("ranking",))  # rank makes a ranking: it reads none
@click_options(ConvertOptions, only=("constants",))
@click_options(CalibrationOptions)
@click_options(RunOptions)
@click_options(FileOutputOptions)
@verbosity
@click.pass_context
@scale_out
def rank(ctx, model, constants, **kwargs):
    """Order the heads from first to last to make constant (paper 3.2, 5.4)."""
    from ..workflow.jobs import run_rank

    if not kwargs.get("method"):
        raise click.UsageError(f"missing option '--method' (one of {', '.join(registry.METHODS)})")
    _refuse_calibration_with_constants(ctx, constants)
    out = from_kwargs(FileOutputOptions, kwargs)
    path = run_rank(
        model,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(RankOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        constants,
        out.out,
        progress=progress_of(ctx),
        overwrite=out.overwrite,
    )
    click.echo(f"wrote {path}")


@click.command()
@click.argument("model")
@click_options(ConvertOptions)
@click_options(CalibrationOptions)
@click_options(DistillOptions)
@click_options(RankOptions)
@click_options(HealOptions, prefix="heal", only=HEAL_WITH_SOURCE, switch="steps")
@click_options(RunOptions)
@click.option("--push", "do_push", is_flag=True, help="Publish the checkpoint to the Hub after writing it.")
@click_options(PushOptions)
@verbosity
@click.pass_context
@scale_out
def convert(ctx, model, do_push, **kwargs):
    """Make a PAPA checkpoint: calibrate, rank, convert, heal (--heal-steps N), write the folder (and --push it).

    Healing trains on --corpus when it is given, else on the default healing corpus (see heal --help).
    """
    from ..conversion.inspection import describe
    from ..workflow.jobs import run_convert

    _refuse_calibration_with_constants(ctx, kwargs.get("constants"))
    heal = optional_group(HealOptions, kwargs, "heal", "steps")
    with group_errors(HealOptions, "heal", own=(p.name for p in ctx.command.params)):  # --heal-heldout, not --heldout
        out = run_convert(
            model,
            from_kwargs(CalibrationOptions, kwargs),
            from_kwargs(RankOptions, kwargs),
            from_kwargs(ConvertOptions, kwargs),
            from_kwargs(PushOptions, kwargs),
            from_kwargs(RunOptions, kwargs),
            do_push=do_push,
            command=command_line(ctx),
            progress=progress_of(ctx),
            distill=from_kwargs(DistillOptions, kwargs),
            heal=heal,
            tuning=_tuning(ctx),
        )
    d = describe(out) if is_main_process() else {}
    click.echo(f"wrote {out} ({d.get('num_constant_heads', '?')} of {d.get('num_heads_total', '?')} heads constant)")
    _say_healed(d)


def _say_healed(d: dict) -> None:
    """The held-out agreement before and after healing, as the run ends (``inspect`` shows it later)."""
    from ..conversion.healed import healing_line

    line = healing_line(d.get("healing"))
    if line:
        click.echo(f"healed: {line}")


HEALED_OUT_HELP = "Output folder: the healed checkpoint. Default: <checkpoint-name>-healed in the current folder."


@click.command()
@click.argument("checkpoint")
@click_options(CalibrationOptions, only=("corpus", "max_examples"), helps={"corpus": HEALING_CORPUS_HELP})
@click_options(HealOptions)
@click_options(RunOptions)
@click.option("--out", type=click.Path(file_okay=False), help=HEALED_OUT_HELP)
@click.option("--overwrite", is_flag=True, help="Replace an earlier checkpoint papa-surgery wrote there.")
@verbosity
@click.pass_context
@scale_out
def heal(ctx, checkpoint, out, overwrite, **kwargs):
    """Heal a PAPA checkpoint toward its source, label-free: more than the constants learn its outputs.

    CHECKPOINT is a PAPA checkpoint folder or Hub id. The teacher is the source its recipe names (--teacher to
    choose). A run stopped midway writes nothing and resumes from its last evaluation when run again.
    """
    from ..workflow.jobs import run_heal

    path = run_heal(
        checkpoint,
        from_kwargs(CalibrationOptions, kwargs),
        from_kwargs(HealOptions, kwargs),
        from_kwargs(RunOptions, kwargs),
        out,
        overwrite=overwrite,
        command=command_line(ctx),
        progress=progress_of(ctx),
    )
    click.echo(f"wrote {path}")
    if is_main_process():
        from ..conversion.inspection import describe

        _say_healed(describe(path))


@click.command()
@click.argument("model")
@click.argument("analysis", type=click.Choice(("norms", "effective")))
@click_options(AnalyzeOptions)
@click_options(RunOptions, only=("trust_remote_code",))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Output folder (JSON + figures).")
@click.option(
    "--overwrite", is_flag=True, help="Replace an earlier analysis papa-surgery wrote at --out (never other files)."
)
@verbosity
@click.pass_context
@scale_out
def analyze(ctx, model, analysis, out, overwrite, **kwargs):
    """Norm-based (Kobayashi 2020) or effective (Brunner 2020) attention analysis."""
    from ..workflow.analysis_job import run_analyze

    options = from_kwargs(AnalyzeOptions, kwargs)
    trust = kwargs["trust_remote_code"]
    target = run_analyze(
        model, analysis, options, out, progress=progress_of(ctx), trust_remote_code=trust, overwrite=overwrite
    )
    for path in sorted(target.iterdir()) if is_main_process() else ():
        click.echo(f"wrote {path}")
