"""Sweeps (paper 4, 5): calibrate -> rank -> convert -> score over tasks, kinds, methods, fractions and seeds.

Every cell (task, corpus, kind, method, fraction, seed) converts the source with ``round(fraction * heads)``
constant heads and scores the converted model with the sweep's job (``sweep_jobs.ProbeJob``: the paper's
probe); fraction 0 is a conversion with no constant heads, so the baseline uses the same slot layout and
job as every other fraction (and equals the source). Constants and rankings come from ``SweepArtifacts``.

Results are appended to a JSONL file one cell at a time (flushed), so an interrupted sweep resumes where it
stopped: cells already in the file are skipped. Under ``torch.distributed`` every process runs every cell
(the data passes inside are sharded) and rank 0 alone reads, locks and writes the file and the artifacts;
rows record the process count. Two cells whose converted models are identical (fraction 0
for every kind and method; fraction 1 for every method) are scored once and the second row says so in
``reused_from``. Every input is checked (tasks, kinds, methods, fractions, corpora, data files, model)
before the first line is written.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from .. import __version__, registry
from ..distributed import broadcast_from_main, is_main_process, on_main, world_size
from ..failures import spell
from ..outputs.overwrite import check_results_file
from .artifacts import SweepArtifacts, is_default
from .config import (
    DEFAULT_CORPUS,
    DEFAULT_FRACTIONS,
    SweepConfig,
    _as_tuple,
)
from .jobs import ProbeJob
from .results import (
    TASK_CORPUS,
    Cell,
    append_row,
    cell_key,
    check_options,
    is_row,
    locked,
    protocol,
    read_rows,
)

logger = logging.getLogger("papa_surgery")


class _Cells:
    """Runs one sweep's cells: converts each cell's model (once per distinct model) and runs the job on it."""

    def __init__(self, artifacts: SweepArtifacts, job):
        self.art = artifacts
        self.job = job
        self.results: dict = {}  # (model identity, seed) -> (row fields, key of the cell that ran)
        self.current = None  # (identity, converted model, the job's shared state)

    def preflight(self, tasks) -> None:
        """Read every split and corpus and check every slot count now, so a bad input writes no line."""
        from ..arguments import check_max_length
        from ..models.families import get_family

        art, cfg = self.art, self.art.config
        get_family(art.model)
        for task in tasks:
            # bad usage of --max-length (exit 2), whether given or the task's App. B length
            check_max_length(art.model.config, art.length(task), cfg.model_name)
            self.job.check_data(task)
            if task.note:  # what the score measures (MNLI's local files: trained on dev-matched), said before it runs
                logger.warning("%s: %s", task.name, task.note)
            if not art.is_papa:
                for spec in cfg.corpora:
                    if spec not in (TASK_CORPUS, DEFAULT_CORPUS) and not spec.startswith(TASK_CORPUS + ":"):
                        art.open_corpus(spec, task)

    def run_cell(self, cell: Cell, task) -> dict:
        """Convert the cell's model (unless the previous cell's is the same) and run the job on it."""
        art = self.art
        length = art.length(task)
        label, method, spec, fraction, seed = cell.kind, cell.method, cell.corpus, cell.fraction, cell.seed
        kind, healed = registry.split_healed(label)
        heads = art.heads_for(fraction, method, spec, task, length, seed)
        healed = healed and bool(heads)  # fraction 0 is the source: nothing to heal
        # Constants matter only for constant heads: fraction 0 is the source whatever the kind or corpus.
        constants = art.constants_for(kind if heads else "zeros", spec, task, length, heads=heads)
        calibrated = bool(heads) and kind in ("average", *registry.TRAINED_KINDS, "labeled-average")
        labeled = bool(heads) and kind.startswith("labeled-")
        identity = (
            task.name,
            length,
            tuple(map(tuple, heads)),
            (kind, spec if calibrated or healed else None, healed) if heads else None,
        )
        corpus_info = {
            "corpus": spec,
            "corpus_description": constants.metadata.get("corpus") if calibrated else None,
            "calibration_examples": constants.metadata.get("examples") if calibrated else None,
        }
        shared = self.results.get((identity, seed))
        if shared is not None:
            fields, source_cell = shared
            return {**fields, **corpus_info, "reused_from": source_cell}
        if labeled or self.current is None or self.current[0] != identity:
            self.current = None  # free the previous conversion and its shared state first
            model = art.flow.convert(
                constants,
                None,
                fraction,
                heads=heads,
                kind=kind,
                method=method,
                trainable_constants=labeled,  # labeled kinds: trained with this cell's probe, never shared
            )
            if healed:  # toward the source, on the cell's calibration corpus
                model = art.heal(model, spec, task)
            self.current = None if labeled else (identity, model, self.job.shared_state())
        state = None
        if not labeled:
            _, model, state = self.current
        scored = self.job.run(model, art.tokenizer, task, seed, art.progress, shared=state, labeled=labeled)
        fields = {"constant_heads": len(heads), "num_heads_total": art.total_heads, "max_length": length, **scored}
        if healed:
            fields["healing"] = healing_summary(model.papa_recipe["healing"])
        self.results[(identity, seed)] = (fields, {"kind": label, "method": method, "corpus": spec})
        return {**fields, **corpus_info}

    def run_checkpoint_cell(self, cell: Cell, task) -> dict:
        """Score a PAPA checkpoint as it is (its heads, constants and layout are fixed)."""
        conf = self.art.model.config
        return {
            "constant_heads": len(conf.papa_constant_heads or []),
            "max_length": conf.papa_max_length,
            "corpus_description": None,
            **self.job.run(self.art.model, self.art.tokenizer, task, cell.seed, self.art.progress),
        }


def _checkpoint_cells(config: SweepConfig, model_config) -> list[Cell]:
    """Cells for a PAPA checkpoint: tasks x seeds at its own fraction, kind and method."""
    from ..models.families import num_heads_layers
    from ..tasks.registry import get_task

    heads, layers = num_heads_layers(model_config)
    fraction = getattr(model_config, "papa_fraction", None)
    if fraction is None:
        fraction = len(model_config.papa_constant_heads or []) / (heads * layers)
    kind = getattr(model_config, "papa_kind", None) or "average"
    if _recipe(config.model).get("healing"):
        kind = registry.healed_label(kind)
    method = getattr(model_config, "papa_method", None) or "given"
    if config.heal_options:
        raise ValueError(
            f"{config.model} is a PAPA checkpoint: heal it with papa-surgery heal, then probe the healed checkpoint"
        )
    if tuple(config.fractions) not in (DEFAULT_FRACTIONS, (float(fraction),)) or len(config.kinds) > 1:
        raise ValueError(
            f"{config.model} is a PAPA checkpoint (fraction {fraction:g}, kind {kind}): it is probed as it is; "
            "to sweep fractions, kinds or methods pass its source model"
        )
    return [
        Cell(
            model=config.model_name,
            task=get_task(t).name,
            fraction=float(fraction),
            kind=kind,
            method=method,
            seed=s,
            corpus="checkpoint",
        )
        for t in _as_tuple(config.tasks)
        for s in config.seed_list
    ]


def run_sweep(
    config: SweepConfig, out_path: str | Path, progress: bool = True, model=None, tokenizer=None, job=None
) -> list[dict]:
    """Run every cell of ``config`` not already in ``out_path``, appending one JSONL line per cell.

    Args:
        config: the sweep.
        out_path: the results file (JSONL); created if missing, appended to otherwise.
        progress: tqdm bars (cells; calibration, features and epochs inside a cell).
        model, tokenizer: an already loaded model to use instead of loading ``config.model`` (which then
            only labels the rows).
        job: how each cell's converted model is scored (default ``ProbeJob(config)``: the paper's probe).

    Returns:
        The rows of every cell of this sweep (those found in the file and those just run), in cell order.

    Raises:
        ValueError: a bad input (unknown task, kind or method, a fraction outside [0, 1], a missing data
            file or column, an unreadable corpus or model, an ``out_path`` that is not a results file...),
            raised before any line is written.
    """
    from tqdm.auto import tqdm

    from ..models.families import is_papa_config
    from ..tasks.registry import get_task

    config.validate()
    job = job or ProbeJob(config)
    check_results_file(out_path)  # rows are appended to a results file, never to another file (nor `dir/`)
    out_path = Path(out_path)
    tasks = [get_task(t) for t in _as_tuple(config.tasks)]
    model_config = model.config if model is not None else _config_of(config)
    papa = is_papa_config(model_config)
    cells = [c.with_protocol(job.name) for c in (_checkpoint_cells(config, model_config) if papa else config.cells())]
    options = {task.name: job.score_options(task) for task in tasks}
    main = is_main_process()  # under torch.distributed rank 0 alone reads, locks and appends to the file
    with locked(out_path) if main else contextlib.nullcontext():  # a second sweep waits, then skips our cells
        existing = broadcast_from_main([r for r in read_rows(out_path, repair=True) if is_row(r)] if main else None)
        for cell in cells:
            check_options(existing, cell, options[cell.task], out_path)
        done = {cell_key(r): r for r in existing}
        todo = [c for c in cells if c.key not in done]
        check_healing_text(existing, todo, out_path)
        if todo:
            artifacts = SweepArtifacts(config, out_path, progress, model, tokenizer)
            artifacts.load(need_mlm=any(t.kind == "mlm" for t in tasks))
            sweep = _Cells(artifacts, job)
            sweep.preflight(tasks)
            if done:
                logger.info("%s: %d of %d cells already done; resuming", out_path, len(cells) - len(todo), len(cells))
            bar = tqdm(todo, desc="sweep", unit="cell", disable=not progress or not main)
            for cell in bar:
                bar.set_postfix_str(cell.describe())
                task = get_task(cell.task)
                body = sweep.run_checkpoint_cell(cell, task) if papa else sweep.run_cell(cell, task)
                row = {
                    **cell.fields(),
                    "kept_fraction": round(1.0 - cell.fraction, 10),
                    **body,
                    "options": options[task.name],
                    "processes": world_size(),
                    "papa_surgery_version": __version__,
                }
                on_main(append_row, out_path, row)
                done[cell_key(row)] = row
    return [done[c.key] for c in cells]


def check_healing_text(rows: list[dict], todo: list[Cell], path) -> None:
    """ValueError when a cell to run heals on the default corpus and ``path`` holds healed rows of the same model,
    task, protocol and corpus that healed on another text than the default healing corpus this version has.

    Rows written before the default healing corpus healed such cells on calibration's default corpus (and recorded
    no healing text); rows healed then and rows healed now would stand in one table without being comparable.
    """
    from ..calibration.corpus import default_healing_corpus
    from ..tasks.registry import get_task

    current = None
    for cell in todo:
        if not (registry.split_healed(cell.kind)[1] and is_default(cell.corpus, get_task(cell.task))):
            continue
        for row in rows:
            healing = row.get("healing")
            same = (row.get("model"), row.get("task"), protocol(row), row.get("corpus") or TASK_CORPUS) == (
                cell.model, cell.task, cell.protocol, cell.corpus
            )  # fmt: skip
            if not (same and isinstance(healing, dict)):
                continue  # another cell's row, or not healed (fraction 0 has nothing to heal)
            current = current or default_healing_corpus().description
            text = healing.get("corpus")
            if text != current:
                what = text or "the calibration corpus (the row records no healing text)"
                default = "the default corpus" if cell.corpus != TASK_CORPUS else "mlm's own text, the default corpus"
                raise ValueError(
                    f"{path} holds {cell.task} results of {cell.model} healed on {what}; with {default} a cell "
                    f"now heals on {current}, and its rows would not compare with those: write to another "
                    f"{spell('out')}, or remove the healed rows to rerun them"
                )


def _recipe(model: str) -> dict:
    """The ``papa_recipe.json`` of a local checkpoint folder (``{}``: none, or not a folder)."""
    from ..conversion.inspection import read_recipe

    return read_recipe(Path(model)) if Path(model).is_dir() else {}


def healing_summary(record: dict) -> dict:
    """What a healed cell's row keeps of the healing record: how it trained and the held-out agreement."""
    keep = ("train", "freeze_constants", "corpus", "steps", "batch_size", "objective", "lr", "constants_lr",
            "seconds", "training_examples")  # fmt: skip
    out = {k: record.get(k) for k in keep}
    for when in ("before", "after"):
        out[f"heldout_sentence_cosine_{when}"] = (record.get(f"heldout_{when}") or {}).get("sentence_cosine")
    return out


def _config_of(config: SweepConfig):
    from ..models.loading import load_config

    return load_config(config.model, trust_remote_code=config.trust_remote_code)
