"""Sweeps (paper 4, 5): calibrate -> rank -> convert -> probe over tasks, kinds, methods, fractions and seeds.

Every cell (task, corpus, kind, method, fraction, seed) converts the source with ``round(fraction * heads)``
constant heads and probes the converted model; fraction 0 is a conversion with no constant heads, so the
baseline uses the same slot layout and probe as every other fraction (and equals the source). Constants
are calibrated once per (corpus, pairs, slots) and rankings made once per (task, method, seed when the
method is seeded); both are kept in memory and, by default, saved next to the results.

Results are appended to a JSONL file one cell at a time (flushed), so an interrupted sweep resumes where it
stopped: cells already in the file are skipped. Two cells whose converted models are identical (fraction 0
for every kind and method; fraction 1 for every method) are probed once and the second row says so in
``reused_from``. Every input is checked (tasks, kinds, methods, fractions, corpora, data files, model)
before the first line is written.
"""

from __future__ import annotations

import hashlib
import logging
import re
from pathlib import Path

from . import __version__
from .results import TASK_CORPUS, append_row, cell_key, check_options, is_row, locked, read_rows
from .sweep_config import (  # noqa: F401  (re-exported: the sweep's public names)
    CONSTANTS_METHODS,
    CORPUS_KINDS,
    DEFAULT_CORPUS,
    DEFAULT_FRACTIONS,
    SEEDED_METHODS,
    SweepConfig,
    _as_tuple,
    parse_fractions,
)

logger = logging.getLogger("papa_surgery")


def _slug(text: str) -> str:
    """A short file-name-safe form (the last path component of a path or Hub id)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text).rstrip("/").split("/")[-1] or str(text))[:48]


class _Sweep:
    """State of one ``run_sweep`` call: the loaded model, calibrations, rankings and the current conversion."""

    def __init__(self, config: SweepConfig, out_path: Path, progress: bool, model=None, tokenizer=None):
        self.config = config
        self.out_path = out_path
        self.progress = progress
        self.model, self.tokenizer = model, tokenizer
        self.mlm_model = None
        self.constants: dict = {}
        self.rankings: dict = {}
        self.results: dict = {}  # probe-identity -> (row fields, key of the cell that ran)
        self.current = None  # (identity, converted model, FeatureCache)
        self.artifacts = out_path.with_name(out_path.name.removesuffix(".jsonl") + ".artifacts")

    def artifact(self, prefix: str, key: tuple, suffix: str) -> Path:
        """Where a constants/ranking file of this cache key is saved (``<results>.artifacts/``)."""
        name = f"{prefix}-{_slug(self.config.model_name)}-{_slug('-'.join(map(str, key)))}"
        digest = hashlib.sha1(repr((self.config.model_name, key)).encode()).hexdigest()[:8]
        return self.artifacts / f"{name}-{digest}{suffix}"

    # ---------------------------------------------------------------------------------------- loading
    def load(self, need_mlm: bool) -> None:
        from .loading import load_source

        cfg = self.config
        if self.model is None and need_mlm:
            self.model, self.tokenizer = load_source(
                cfg.model, "AutoModelForMaskedLM", dtype=cfg.dtype, device=cfg.device
            )
        elif self.model is None:
            self.model, self.tokenizer = load_source(cfg.model, dtype=cfg.dtype, device=cfg.device)
        elif cfg.device is not None:
            self.model.to(cfg.device)
        self.model.eval()
        if need_mlm:
            from .probe.mlm import require_mlm_head

            require_mlm_head(self.model, self.tokenizer)

    @property
    def num_layers(self) -> int:
        from .architectures import num_heads_layers

        return num_heads_layers(self.model.config)[1]

    @property
    def total_heads(self) -> int:
        from .architectures import num_heads_layers

        heads, layers = num_heads_layers(self.model.config)
        return heads * layers

    @property
    def is_papa(self) -> bool:
        from .architectures import is_papa_config

        return is_papa_config(self.model.config)

    def length(self, task) -> int:
        from .probe import slot_count

        return slot_count(self.model, task, self.config.max_length)

    # ---------------------------------------------------------------------------------------- preflight
    def preflight(self, tasks) -> None:
        """Read every split and corpus and check every slot count now, so a bad input writes no line."""
        from .architectures import get_family

        cfg = self.config
        get_family(self.model)
        limit = getattr(self.model.config, "max_position_embeddings", None)
        for task in tasks:
            length = self.length(task)
            if isinstance(limit, int) and limit > 0 and length > limit and not self.is_papa:
                raise ValueError(
                    f"max_length={length} exceeds the model's max_position_embeddings={limit}; pass a smaller one"
                )
            _split(task, "eval", cfg.data_dir, cfg.max_eval_examples)
            if task.kind != "mlm":
                _split(task, "train", cfg.data_dir, cfg.max_train_examples)
            if not self.is_papa:
                for spec in cfg.corpora:
                    if spec not in (TASK_CORPUS, DEFAULT_CORPUS) and not spec.startswith(TASK_CORPUS + ":"):
                        self.open_corpus(spec, task)
        if not self.is_papa and any(m in ("lambda", "reversed-lambda") for m in cfg.methods):
            from . import rank_methods

            if not hasattr(rank_methods, "rank_heads"):
                raise ValueError(
                    "the lambda ranking is not available in this papa-surgery build; use --method variance"
                )

    # ---------------------------------------------------------------------------------------- calibration
    def open_corpus(self, spec: str, task):
        """(corpus, cache key) of a corpus spec for ``task``."""
        from .corpus import default_corpus, load_corpus
        from .probe import get_task, load_split

        cfg = self.config
        if spec == DEFAULT_CORPUS or (spec == TASK_CORPUS and task.kind == "mlm"):
            # mlm has no training split: calibrate on the bundled WikiText excerpt
            return default_corpus(cfg.max_calibration_examples), ("default", cfg.max_calibration_examples)
        if spec == TASK_CORPUS or spec.startswith(TASK_CORPUS + ":"):
            source = task if spec == TASK_CORPUS else get_task(spec.split(":", 1)[1])
            limit = cfg.max_calibration_examples or cfg.max_train_examples
            split = load_split(source, "train", cfg.data_dir, limit)
            texts = [" ".join(t) if isinstance(t, list) else t for t in split.texts]  # token tasks: word lists
            corpus = load_corpus(texts, pairs=source.pairs)
            corpus.description = f"{source.name} training texts, unlabelled ({split.source})"
            return corpus, ("task", source.name, limit)
        corpus = load_corpus(spec, pairs=task.pairs, max_examples=cfg.max_calibration_examples)
        return corpus, ("corpus", spec, task.pairs, cfg.max_calibration_examples)

    def calibrated(self, spec: str, task, length: int, kind: str = "average"):
        """Constants averaged over a corpus: calibrated (``average``) or from an analysis (``norm-average``...)."""
        from .analysis import corpus_constants
        from .constants import Constants

        corpus, key = self.open_corpus(spec, task)
        key = (*key, length) if kind == "average" else (*key, length, kind)
        if key not in self.constants:
            path = self.artifact("constants", key, ".safetensors")
            constants = None
            if self.config.save_artifacts and path.is_file():
                constants = Constants.load(path)
                if constants.max_length != length or constants.variance is None:
                    constants = None
            if constants is None:
                constants = corpus_constants(
                    kind,
                    self.model,
                    self.tokenizer,
                    corpus,
                    max_length=length,
                    pairs=corpus.pairs,
                    batch_size=self.config.calibration_batch_size,
                    device=self.config.device,
                    progress=self.progress,
                    source_name=self.config.model_name,
                )
                if self.config.save_artifacts:
                    constants.save(path)
            self.constants[key] = constants
        return self.constants[key]

    def constants_for(self, kind: str, spec: str, task, length: int):
        from .architectures import num_heads_layers
        from .constants import Constants

        if kind in CORPUS_KINDS:
            return self.calibrated(spec, task, length, kind)
        heads, layers = num_heads_layers(self.model.config)
        return Constants.from_kind(kind, layers, heads, length, source_model=self.config.model_name)

    # ---------------------------------------------------------------------------------------- ranking
    def ranking(self, method: str, spec: str, task, length: int, seed: int):
        from . import rank_methods
        from . import ranking as ranking_mod

        seeded = method in SEEDED_METHODS
        uses_constants = method in CONSTANTS_METHODS
        key = (
            method,
            task.name if method in ("lambda", "reversed-lambda") else None,
            (spec, task.name if spec == TASK_CORPUS else None, length) if uses_constants else None,
            seed if seeded else None,
        )
        if key in self.rankings:
            return self.rankings[key]
        path = self.artifact("ranking", key, ".json")
        if self.config.save_artifacts and path.is_file():
            ranking = ranking_mod.Ranking.load(path)
        elif method == "reversed-lambda":  # the lambda ranking read backwards: train the lambdas once
            ranking = ranking_mod.reversed_ranking(self.ranking("lambda", spec, task, length, seed))
        else:
            kind = "norm-average" if method == "norm" else "average"  # the norm ranking reads head contributions
            constants = self.calibrated(spec, task, length, kind) if uses_constants else None
            opts = {}
            if method == "lambda":
                opts = dict(
                    max_train_examples=self.config.max_train_examples,
                    device=self.config.device,
                    progress=self.progress,
                    source_name=self.config.model_name,
                )
                opts.update(self.config.rank_options)
            ranking = rank_methods.rank_heads(
                method,
                self.model,
                tokenizer=self.tokenizer,
                constants=constants,
                task=task.name,
                data_dir=self.config.data_dir,
                seed=seed,
                **opts,
            )
            if self.config.save_artifacts:
                ranking.save(path)
        ranking.check_compatible(self.model.config)
        self.rankings[key] = ranking
        return ranking

    # ---------------------------------------------------------------------------------------- one cell
    def run_cell(self, cell: dict, task) -> dict:
        from .convert import convert
        from .probe import FeatureCache
        from .ranking import head_count

        cfg = self.config
        length = self.length(task)
        kind, method, spec, fraction, seed = (
            cell["kind"],
            cell["method"],
            cell["corpus"],
            cell["fraction"],
            cell["seed"],
        )
        total = self.total_heads
        count = head_count(fraction, total)
        # Fraction 0 and 1 need no ranking (no head / every head); other fractions take the ranking's first heads.
        if count == 0:
            heads = []
        elif count == total:
            heads = [[layer, h] for layer in range(self.num_layers) for h in range(total // self.num_layers)]
        else:
            heads = self.ranking(method, spec, task, length, seed).select(fraction)
        # Constants matter only for constant heads: fraction 0 is the source whatever the kind or corpus.
        constants = self.constants_for(kind if heads else "zeros", spec, task, length)
        calibrated = bool(heads) and kind == "average"
        identity = (
            task.name,
            length,
            tuple(map(tuple, heads)),
            (kind, spec if calibrated else None) if heads else None,
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
        if self.current is None or self.current[0] != identity:
            self.current = None  # free the previous conversion and its cached features first
            model = convert(
                self.model,
                constants,
                heads,
                tokenizer=self.tokenizer,
                kind=kind,
                method=method,
                fraction=fraction,
                source_name=cfg.model_name,
            )
            self.current = (identity, model, FeatureCache())
        _, model, cache = self.current
        result = self.probe(model, task, seed, reuse=cache)
        fields = {
            "constant_heads": len(heads),
            "num_heads_total": total,
            "max_length": length,
            **{k: result.get(k) for k in PROBE_FIELDS if k in result},
        }
        self.results[(identity, seed)] = (fields, {k: cell[k] for k in ("kind", "method", "corpus")})
        return {**fields, **corpus_info}

    def probe(self, model, task, seed: int, reuse=None) -> dict:
        """The probe of one cell, with the sweep's data and probe options."""
        from .probe import probe

        cfg = self.config
        return probe(
            model,
            self.tokenizer,
            task,
            data_dir=cfg.data_dir,
            seed=seed,
            max_train_examples=cfg.max_train_examples,
            max_eval_examples=cfg.max_eval_examples,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            device=cfg.device,
            progress=self.progress,
            cache_gb=cfg.cache_gb,
            reuse=reuse,
        )

    def run_checkpoint_cell(self, cell: dict, task) -> dict:
        """Probe a PAPA checkpoint as it is (its heads, constants and layout are fixed)."""
        result = self.probe(self.model, task, cell["seed"])
        conf = self.model.config
        return {
            "constant_heads": len(conf.papa_constant_heads or []),
            "max_length": conf.papa_max_length,
            "corpus_description": None,
            **{k: result.get(k) for k in PROBE_FIELDS if k in result},
        }


def _split(task, split: str, data_dir, max_examples):
    """``probe.load_split`` naming the fix when the Hub dataset cannot be reached (offline, no network)."""
    from .probe import load_split

    try:
        return load_split(task, split, data_dir, max_examples)
    except OSError as err:  # ConnectionError, offline mode
        if data_dir is not None:
            raise
        raise ValueError(
            f"task {task.name!r}: the Hub dataset could not be reached ({str(err).splitlines()[0]}); pass "
            "--data-dir with local files (e.g. --data-dir ../shared/data)"
        ) from None


PROBE_FIELDS = (
    "metric",
    "score",
    "examples",
    "eval_examples",
    "steps",
    "seconds",
    "data",
    "cached",
    "note",
    "perplexity",
)


def _checkpoint_cells(config: SweepConfig, model_config) -> list[dict]:
    """Cells for a PAPA checkpoint: tasks x seeds at its own fraction, kind and method."""
    from .architectures import num_heads_layers
    from .probe.tasks import get_task

    heads, layers = num_heads_layers(model_config)
    fraction = getattr(model_config, "papa_fraction", None)
    if fraction is None:
        fraction = len(model_config.papa_constant_heads or []) / (heads * layers)
    kind = getattr(model_config, "papa_kind", None) or "average"
    method = getattr(model_config, "papa_method", None) or "given"
    if tuple(config.fractions) not in (DEFAULT_FRACTIONS, (float(fraction),)) or len(config.kinds) > 1:
        raise ValueError(
            f"{config.model} is a PAPA checkpoint (fraction {fraction:g}, kind {kind}): it is probed as it is; "
            "to sweep fractions, kinds or methods pass its source model"
        )
    return [
        dict(
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
    config: SweepConfig, out_path: str | Path, progress: bool = True, model=None, tokenizer=None
) -> list[dict]:
    """Run every cell of ``config`` not already in ``out_path``, appending one JSONL line per cell.

    Args:
        config: the sweep.
        out_path: the results file (JSONL); created if missing, appended to otherwise.
        progress: tqdm bars (cells; calibration, features and epochs inside a cell).
        model, tokenizer: an already loaded model to use instead of loading ``config.model`` (which then
            only labels the rows).

    Returns:
        The rows of every cell of this sweep (those found in the file and those just run), in cell order.

    Raises:
        ValueError: a bad input (unknown task, kind or method, a fraction outside [0, 1], a missing data
            file or column, an unreadable corpus or model...), raised before any line is written.
    """
    from tqdm.auto import tqdm

    from .architectures import is_papa_config
    from .probe.tasks import get_task

    config.validate()
    out_path = Path(out_path)
    tasks = [get_task(t) for t in _as_tuple(config.tasks)]
    model_config = model.config if model is not None else _config_of(config)
    papa = is_papa_config(model_config)
    cells = _checkpoint_cells(config, model_config) if papa else config.cells()
    options = {task.name: config.score_options(task) for task in tasks}
    with locked(out_path):  # a second sweep on this file waits, then skips what this one wrote
        existing = [r for r in read_rows(out_path, repair=True) if is_row(r)]
        for cell in cells:
            check_options(existing, cell, options[cell["task"]], out_path)
        done = {cell_key(r): r for r in existing}
        todo = [c for c in cells if cell_key(c) not in done]
        if todo:
            sweep = _Sweep(config, out_path, progress, model, tokenizer)
            sweep.load(need_mlm=any(t.kind == "mlm" for t in tasks))
            sweep.preflight(tasks)
            if done:
                logger.info("%s: %d of %d cells already done; resuming", out_path, len(cells) - len(todo), len(cells))
            bar = tqdm(todo, desc="sweep", unit="cell", disable=not progress)
            for cell in bar:
                bar.set_postfix_str(
                    f"{cell['task']} {cell['kind']}/{cell['method']} f={cell['fraction']:g} seed={cell['seed']}"
                )
                task = get_task(cell["task"])
                body = sweep.run_checkpoint_cell(cell, task) if papa else sweep.run_cell(cell, task)
                row = {
                    **cell,
                    "kept_fraction": round(1.0 - cell["fraction"], 10),
                    **body,
                    "options": options[task.name],
                    "papa_surgery_version": __version__,
                }
                append_row(out_path, row)
                done[cell_key(row)] = row
    return [done[cell_key(c)] for c in cells]


def _config_of(config: SweepConfig):
    from .loading import load_config

    return load_config(config.model)
