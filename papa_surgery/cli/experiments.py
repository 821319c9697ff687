"""``papa-surgery probe``, ``finetune`` and ``report``: sweeps over tasks, fractions, kinds, methods and seeds.

Adapters over :func:`papa_surgery.experiments.sweep.run_sweep` (with the probe's or the fine-tuning job) and
:func:`papa_surgery.report.write_report`; both sweep commands take :class:`~papa_surgery.options.SweepOptions`.
"""

from __future__ import annotations

import click

from ..distributed import scale_out
from ..options import (
    HEAL_WITH_SOURCE,
    DistillOptions,
    FinetuneOptions,
    HealOptions,
    RunOptions,
    SweepOptions,
    click_options,
    from_kwargs,
    group_errors,
    optional_group,
)
from .context import progress_of, verbosity


def _sweep_config(
    model_or_dir: str,
    sweep: SweepOptions,
    heal: HealOptions | None = None,
    trust: bool = False,
    sharpen_search: str | None = None,
):
    from ..experiments.config import SweepConfig
    from ..models.sources import EMBEDDED_HUB_ID, resolve_model

    options = {
        name: getattr(sweep, name)
        for name in (
            "data_dir", "corpus", "max_length", "max_train_examples", "max_eval_examples",
            "max_calibration_examples", "epochs", "lr", "batch_size", "device",
        )
        if getattr(sweep, name) is not None
    }  # fmt: skip
    if sweep.distill_steps is not None:
        options["distill_options"] = {"steps": sweep.distill_steps}
    if heal is not None:
        options["heal_options"] = heal.kwargs()
    return SweepConfig(
        model=resolve_model(model_or_dir),
        label=EMBEDDED_HUB_ID if model_or_dir in ("minilm", "embedded") else model_or_dir,
        tasks=tuple(sweep.tasks),
        fractions=tuple(sweep.fractions),
        seeds=tuple(range(sweep.seeds)),
        trust_remote_code=trust,
        sharpen_search=sharpen_search,
        **({"kinds": tuple(sweep.kinds)} if sweep.kinds else {}),
        **({"methods": tuple(sweep.methods)} if sweep.methods else {}),
        **options,
    )


def _rows_in(path) -> int:
    """How many result rows the file holds (0 when it does not exist yet)."""
    from pathlib import Path

    from ..experiments.results import is_row, read_rows

    return sum(1 for r in read_rows(path) if is_row(r)) if Path(path).is_file() else 0


def _summary(rows: list, before: int, path) -> str:
    """What a sweep did to its file: "3 rows of this sweep (3 new) in r.jsonl, which holds 6 rows"."""
    total = _rows_in(path)
    return f"{len(rows)} rows of this sweep ({total - before} new) in {path}, which holds {total} rows"


def trust_option(command):
    """``--trust-remote-code`` (:class:`~papa_surgery.options.RunOptions`): run the model's own code files."""
    return click_options(RunOptions, only=("trust_remote_code",))(command)


def sharpen_option(command):
    """``--sharpen-search`` (:class:`~papa_surgery.options.DistillOptions`): how the sharpened kind is fitted."""
    return click_options(DistillOptions, only=("sharpen_search",))(command)


def heal_options(command):
    """``--heal-steps N`` (and the other ``--heal-*``): each kind's converted model is also healed and scored."""
    return click_options(HealOptions, prefix="heal", only=HEAL_WITH_SOURCE, switch="steps")(command)


@click.command()
@click.argument("model_or_dir")
@click_options(SweepOptions)
@trust_option
@sharpen_option
@heal_options
@verbosity
@click.pass_context
@scale_out
def probe(ctx, model_or_dir, **kwargs):
    """Probe a frozen model over fractions, seeds, kinds and methods (paper 3.3, 4).

    With --heal-steps N each kind's converted model is also healed toward the source on the calibration corpus and
    probed as the kind `<kind>+healed` (average, distilled and healed side by side in the report).
    """
    from ..experiments.sweep import run_sweep

    sweep = from_kwargs(SweepOptions, kwargs)
    heal = optional_group(HealOptions, kwargs, "heal", "steps")
    config = _sweep_config(model_or_dir, sweep, heal, kwargs["trust_remote_code"], kwargs["sharpen_search"])
    before = _rows_in(sweep.out)
    with group_errors(HealOptions, "heal", own=(p.name for p in ctx.command.params)):  # --heal-heldout, not --heldout
        rows = run_sweep(config, sweep.out, progress=progress_of(ctx))
    click.echo(_summary(rows, before, sweep.out))


@click.command()
@click.argument("model_or_dir")
@click_options(SweepOptions)
@click_options(FinetuneOptions)
@trust_option
@sharpen_option
@heal_options
@verbosity
@click.pass_context
@scale_out
def finetune(ctx, model_or_dir, **kwargs):
    """Fine-tune the whole model end to end over fractions, seeds, kinds and methods, with its cost.

    Each cell converts MODEL_OR_DIR as `probe` does, loads it with the family's stock classification head,
    trains it with transformers' Trainer (defaults: 3 epochs, lr 5e-5, batch 16, warmup 6%, weight decay
    0.01; CoLA and MRPC 5 epochs) and scores it on the task's dev split. Rows also record training and inference
    examples per second, peak memory, trainable parameters and checkpoint size. --heal-steps N adds each kind's
    healed model, as `probe` does.
    """
    from ..experiments.jobs import FinetuneJob
    from ..experiments.sweep import run_sweep

    sweep = from_kwargs(SweepOptions, kwargs)
    heal = optional_group(HealOptions, kwargs, "heal", "steps")
    config = _sweep_config(model_or_dir, sweep, heal, kwargs["trust_remote_code"], kwargs["sharpen_search"])
    before = _rows_in(sweep.out)
    job = FinetuneJob(config, from_kwargs(FinetuneOptions, kwargs))
    with group_errors(HealOptions, "heal", own=(p.name for p in ctx.command.params)):
        rows = run_sweep(config, sweep.out, progress=progress_of(ctx), job=job)
    click.echo(_summary(rows, before, sweep.out))


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder for tables and figures.")
@click.option("--constants", type=click.Path(exists=True), help="Constants file or checkpoint for heat maps.")
@click.option(
    "--overwrite", is_flag=True, help="Replace an earlier report papa-surgery wrote at --out (never other files)."
)
@verbosity
def report(results, out, constants, overwrite):
    """Tables and figures from results files (paper Tables 1-2, Figs. 2-5; fine-tuned beside probed, with cost).

    --out is a new or empty folder; an earlier report there is replaced only with --overwrite, and a folder holding
    anything else is refused."""
    from ..report import write_report

    for path in write_report(list(results), out, constants=constants, overwrite=overwrite):
        click.echo(f"wrote {path}")
