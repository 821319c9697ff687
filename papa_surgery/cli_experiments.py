"""``papa-surgery probe``, ``finetune`` and ``report``: sweeps over tasks, fractions, kinds, methods and seeds.

Thin click adapters over ``papa_surgery.sweep.run_sweep`` (with the probe or the fine-tuning job) and
``papa_surgery.report.write_report``; the two sweep commands share one definition of their options.
"""

from __future__ import annotations

import click

from .distributed import scale_out


def progress_of(ctx) -> bool:
    """Whether to show progress bars (not with ``papa-surgery -q``)."""
    return not (ctx.obj or {}).get("quiet", False)


def sweep_options(protocol: str):
    """The options both sweep commands take; ``protocol`` names whose epochs, lr and batch size they override."""
    options = [
        click.argument("model_or_dir"),
        click.option(
            "--task", "tasks", required=True, multiple=True, help="Task(s): sst2, cola, mrpc, mnli, ner, pos, pos-ud."
        ),
        click.option("--data-dir", help="Read tasks from local files (e.g. ../shared/data) instead of the Hub."),
        click.option(
            "--fractions",
            default="0,1/2,7/8,15/16,1",
            show_default=True,
            help="Comma-separated shares of heads made constant (decimals or fractions such as 7/8).",
        ),
        click.option("--seeds", default=3, show_default=True, type=click.IntRange(min=1), help="Seeds per cell."),
        click.option("--kind", "kinds", multiple=True, help="Constant kind(s) (default average)."),
        click.option("--method", "methods", multiple=True, help="Ranking method(s) (default variance)."),
        click.option("--corpus", help="Calibration corpus (default: the task's own unlabelled training text)."),
        click.option("--max-length", type=click.IntRange(min=4), help="Slots L (default: the task's App. B length)."),
        click.option("--max-train-examples", type=click.IntRange(min=1), help="Cap training examples per task."),
        click.option("--max-eval-examples", type=click.IntRange(min=1), help="Cap evaluation examples per task."),
        click.option("--max-calibration-examples", type=click.IntRange(min=1), help="Cap calibration examples."),
        click.option("--epochs", type=click.IntRange(min=1), help=f"Override the task's {protocol} epochs."),
        click.option("--lr", type=float, help=f"Override the task's {protocol} learning rate."),
        click.option("--batch-size", type=click.IntRange(min=1), help=f"Override the task's {protocol} batch size."),
        click.option("--device", help="Device (cpu, cuda...)."),
        click.option(
            "--distill-steps", type=click.IntRange(min=1), help="Step budget of the distilled kind (default 200)."
        ),
        click.option("--out", required=True, type=click.Path(dir_okay=False), help="Results file (JSONL, appended)."),
        click.pass_context,
    ]

    def decorate(command):
        for option in reversed(options):
            command = option(command)
        return command

    return decorate


def _sweep_config(model_or_dir, tasks, fractions, kinds, methods, options: dict):
    from .sources import EMBEDDED_HUB_ID, resolve_model
    from .sweep import SweepConfig, parse_fractions

    try:
        values = parse_fractions(fractions)
    except (ValueError, ZeroDivisionError) as err:
        raise click.BadParameter(f"{fractions!r}: {err}", param_hint="'--fractions'") from None
    options = {k: v for k, v in options.items() if v is not None}
    seeds = tuple(range(options.pop("seeds")))
    if "distill_steps" in options:
        options["distill_options"] = {"steps": options.pop("distill_steps")}
    label = EMBEDDED_HUB_ID if model_or_dir in ("minilm", "embedded") else model_or_dir
    return SweepConfig(
        model=resolve_model(model_or_dir),
        label=label,
        tasks=tuple(tasks),
        fractions=values,
        seeds=seeds,
        **({"kinds": tuple(kinds)} if kinds else {}),
        **({"methods": tuple(methods)} if methods else {}),
        **options,
    )


@click.command()
@sweep_options("probe")
@scale_out
def probe(ctx, model_or_dir, tasks, fractions, kinds, methods, out, **kwargs):
    """Probe a frozen model over fractions, seeds, kinds and methods (paper 3.3, 4)."""
    from .sweep import run_sweep

    config = _sweep_config(model_or_dir, tasks, fractions, kinds, methods, kwargs)
    rows = run_sweep(config, out, progress=progress_of(ctx))
    click.echo(f"{len(rows)} result rows in {out}")


@click.command()
@sweep_options("fine-tuning")
@click.option("--weight-decay", default=0.01, show_default=True, type=click.FloatRange(min=0), help="AdamW decay.")
@click.option(
    "--warmup-ratio", default=0.06, show_default=True, type=click.FloatRange(0, 1, max_open=True), help="Warmup share."
)
@click.option("--eval-batch-size", default=64, show_default=True, type=click.IntRange(min=1), help="Eval batch.")
@click.option(
    "--early-stopping-patience",
    type=click.IntRange(min=1),
    help="Stop after this many epochs without a better dev score (default: off, every epoch runs).",
)
@click.option("--trainable-constants", is_flag=True, help="Give the constant heads' matrices gradients too.")
@scale_out
def finetune(
    ctx,
    model_or_dir,
    tasks,
    fractions,
    kinds,
    methods,
    out,
    weight_decay,
    warmup_ratio,
    eval_batch_size,
    early_stopping_patience,
    trainable_constants,
    **kwargs,
):
    """Fine-tune the whole model end to end over fractions, seeds, kinds and methods, with its cost.

    Each cell converts MODEL_OR_DIR as `probe` does, loads it with the family's stock classification head,
    trains it with transformers' Trainer (defaults: 3 epochs, lr 5e-5, batch 16, warmup 6%, weight decay
    0.01; CoLA and MRPC 5 epochs) and scores it on the task's dev split. Rows also record training and inference
    examples per second, peak memory, trainable parameters and checkpoint size.
    """
    from .finetune import FinetuneJob, FinetuneOptions
    from .sweep import run_sweep

    config = _sweep_config(model_or_dir, tasks, fractions, kinds, methods, kwargs)
    options = FinetuneOptions(
        weight_decay=weight_decay,
        warmup_ratio=warmup_ratio,
        eval_batch_size=eval_batch_size,
        early_stopping_patience=early_stopping_patience,
        trainable_constants=trainable_constants,
    )
    rows = run_sweep(config, out, progress=progress_of(ctx), job=FinetuneJob(config, options))
    click.echo(f"{len(rows)} result rows in {out}")


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False))
@click.option("--out", required=True, type=click.Path(file_okay=False), help="Folder for tables and figures.")
@click.option("--constants", type=click.Path(exists=True), help="Constants file or checkpoint for heat maps.")
def report(results, out, constants):
    """Tables and figures from results files (paper Tables 1-2, Figs. 2-5; fine-tuned beside probed, with cost)."""
    from .report import write_report

    for path in write_report(list(results), out, constants=constants):
        click.echo(f"wrote {path}")
