"""What a sweep's cells are converted with: the source model, calibrated constants and rankings.

Constants are calibrated once per (corpus, pairs, slots, kind) and rankings made once per (task, method,
seed when the method is seeded); both are kept in memory and, by default, saved next to the results
(``<results>.artifacts/``) and reused when a sweep resumes.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from .distributed import broadcast_from_main, is_main_process
from .results import TASK_CORPUS
from .sweep_config import CONSTANTS_METHODS, CORPUS_KINDS, DEFAULT_CORPUS, SEEDED_METHODS, SweepConfig


def _slug(text: str) -> str:
    """A short file-name-safe form (the last path component of a path or Hub id)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text).rstrip("/").split("/")[-1] or str(text))[:48]


class SweepArtifacts:
    """The loaded source model of one sweep, with the constants and rankings its cells need."""

    def __init__(self, config: SweepConfig, out_path: Path, progress: bool, model=None, tokenizer=None):
        self.config = config
        self.progress = progress
        self.model, self.tokenizer = model, tokenizer
        self.constants: dict = {}
        self.rankings: dict = {}
        self.artifacts = out_path.with_name(out_path.name.removesuffix(".jsonl") + ".artifacts")

    def artifact(self, prefix: str, key: tuple, suffix: str) -> Path:
        """Where a constants/ranking file of this cache key is saved (``<results>.artifacts/``)."""
        name = f"{prefix}-{_slug(self.config.model_name)}-{_slug('-'.join(map(str, key)))}"
        digest = hashlib.sha1(repr((self.config.model_name, key)).encode()).hexdigest()[:8]
        return self.artifacts / f"{name}-{digest}{suffix}"

    def _saved(self, path: Path) -> bool:
        """Whether to reuse a saved artifact: rank 0 decides for all (another rank could see rank 0 writing)."""
        return broadcast_from_main(self.config.save_artifacts and path.is_file())

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

    def heads_for(self, fraction: float, method: str, spec: str, task, length: int, seed: int) -> list:
        """The [layer, head] pairs a cell makes constant: ``round(fraction * heads)`` by the method's ranking.

        Fraction 0 and 1 need no ranking (no head / every head); other fractions take the ranking's first heads.
        """
        from .ranking import head_count

        total = self.total_heads
        count = head_count(fraction, total)
        if count == 0:
            return []
        if count == total:
            return [[layer, h] for layer in range(self.num_layers) for h in range(total // self.num_layers)]
        return self.ranking(method, spec, task, length, seed).select(fraction)

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
            if self._saved(path):
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
                if self.config.save_artifacts and is_main_process():  # rank 0 alone writes
                    constants.save(path)
            self.constants[key] = constants
        return self.constants[key]

    def distilled(self, spec: str, task, length: int, heads):
        """The calibrated average distilled for ``heads`` (``papa_surgery.distill``), once per heads and corpus."""
        from .distill import distill

        key = ("distilled", spec, task.name, length, tuple(map(tuple, heads)))
        if key not in self.constants:
            corpus, _ = self.open_corpus(spec, task)
            self.constants[key] = distill(
                self.model,
                self.tokenizer,
                corpus,
                self.calibrated(spec, task, length),
                heads,
                batch_size=self.config.calibration_batch_size,
                device=self.config.device,
                progress=self.progress,
                **self.config.distill_options,
            )
        return self.constants[key]

    def constants_for(self, kind: str, spec: str, task, length: int):
        from .architectures import num_heads_layers
        from .constants import Constants

        if kind.startswith("labeled-"):  # the starting matrices; labeled.py trains them with the probe
            kind = kind.removeprefix("labeled-")
        if kind in CORPUS_KINDS:
            return self.calibrated(spec, task, length, kind)
        if kind == "distilled":  # the starting point; ``distilled`` trains it for a cell's heads
            return self.calibrated(spec, task, length)
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
        if self._saved(path):
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
            if self.config.save_artifacts and is_main_process():
                ranking.save(path)
        ranking.check_compatible(self.model.config)
        self.rankings[key] = ranking
        return ranking
