"""What a sweep's cells are converted with: the source model, and the workflow's constants and rankings.

A sweep runs :class:`papa_surgery.workflow.Workflow` on its source model with an :class:`ArtifactCache`:
constants are made once per (kind, corpus, slots) and rankings once per (method, task, constants, seed when
the method is seeded), kept in memory and, by default, saved next to the results (``<results>.artifacts/``)
and reused when a sweep resumes. This module adds what is particular to sweeps: the task corpora (a task's
own unlabelled training text, the paper's choice) and the heads a cell's fraction makes constant.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from ..distributed import broadcast_from_main, is_main_process
from ..options import DistillOptions, RunOptions
from ..workflow import Cache, Workflow
from .config import DEFAULT_CORPUS, SweepConfig
from .results import TASK_CORPUS


def is_default(spec: str, task) -> bool:
    """A sweep's corpus spec that means the default corpus: ``default``, or the task's own text where ``mlm`` has
    none (its task corpus is the default corpus)."""
    return spec == DEFAULT_CORPUS or (spec == TASK_CORPUS and task.kind == "mlm")


def _slug(text: str) -> str:
    """A short file-name-safe form (the last path component of a path or Hub id)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", str(text).rstrip("/").split("/")[-1] or str(text))[:48]


class ArtifactCache(Cache):
    """The workflow's cache for a sweep: constants and rankings also saved in ``folder`` and read back on resume.

    Under ``torch.distributed`` rank 0 decides whether a saved file is reused (another rank could see it being
    written) and alone writes. Distilled constants are kept in memory only (they depend on a cell's heads).
    """

    SAVED = {"constants": ".safetensors", "ranking": ".json"}

    def __init__(self, folder: Path, model_name: str, save: bool):
        super().__init__()
        self.folder, self.model_name, self.save = folder, model_name, save

    def path(self, what: str, key: tuple) -> Path:
        digest = hashlib.sha1(repr((self.model_name, key)).encode()).hexdigest()[:12]
        return self.folder / f"{what}-{_slug(self.model_name)}-{_slug(key[0])}-{digest}{self.SAVED[what]}"

    def load(self, what: str, key: tuple):
        if what not in self.SAVED or not broadcast_from_main(self.save and self.path(what, key).is_file()):
            return None
        if what == "ranking":
            from ..ranking.order import Ranking

            return Ranking.load(self.path(what, key))
        from ..calibration.constants import Constants

        constants = Constants.load(self.path(what, key))
        return constants if constants.variance is not None else None  # a damaged or foreign file: make it again

    def store(self, what: str, key: tuple, value) -> None:
        if what in self.SAVED and self.save and is_main_process():  # rank 0 alone writes
            value.save(self.path(what, key))


class SweepArtifacts:
    """The loaded source model of one sweep, with the workflow that makes the constants and rankings its cells need."""

    def __init__(self, config: SweepConfig, out_path: Path, progress: bool, model=None, tokenizer=None):
        self.config = config
        self.progress = progress
        self.model, self.tokenizer = model, tokenizer
        self.artifacts = out_path.with_name(out_path.name.removesuffix(".jsonl") + ".artifacts")
        self.flow: Workflow | None = None

    # ---------------------------------------------------------------------------------------- loading
    def _load_kwargs(self) -> dict:
        cfg = self.config
        return {"dtype": cfg.dtype, "device": cfg.device, "trust_remote_code": cfg.trust_remote_code}

    def load(self, need_mlm: bool) -> None:
        from ..models.loading import load_source

        cfg = self.config
        if self.model is None and need_mlm:
            self.model, self.tokenizer = load_source(cfg.model, "AutoModelForMaskedLM", **self._load_kwargs())
        elif self.model is None:
            self.model, self.tokenizer = load_source(cfg.model, **self._load_kwargs())
        elif cfg.device is not None:
            self.model.to(cfg.device)
        self.model.eval()
        if need_mlm:
            from ..probing.mlm import require_mlm_head

            require_mlm_head(self.model, self.tokenizer)
        self.flow = Workflow(
            self.model,
            self.tokenizer,
            source_name=cfg.model_name,
            run=RunOptions(device=cfg.device, batch_size=cfg.calibration_batch_size),
            progress=self.progress,
            cache=ArtifactCache(self.artifacts, cfg.model_name, cfg.save_artifacts),
        )

    @property
    def num_layers(self) -> int:
        return self.flow.shape[0]

    @property
    def total_heads(self) -> int:
        layers, heads = self.flow.shape
        return layers * heads

    @property
    def is_papa(self) -> bool:
        from ..models.families import is_papa_config

        return is_papa_config(self.model.config)

    def length(self, task) -> int:
        from ..probing import slot_count

        return slot_count(self.model, task, self.config.max_length)

    def heads_for(self, fraction: float, method: str, spec: str, task, length: int, seed: int) -> list:
        """The [layer, head] pairs a cell makes constant: ``round(fraction * heads)`` by the method's ranking.

        Fraction 0 and 1 need no ranking (no head / every head); other fractions take the ranking's first heads.
        """
        from ..ranking.order import head_count

        total = self.total_heads
        count = head_count(fraction, total)
        if count == 0:
            return []
        if count == total:
            return self.flow.every_head()
        return self.ranking(method, spec, task, length, seed).select(fraction)

    def open_corpus(self, spec: str, task):
        """The calibration corpus of a sweep's corpus spec for ``task``.

        ``task`` (the default): the task's own training texts, labels unused (paper 4.1); ``task:NAME``: those
        of task NAME (paper Table 2); ``default``: the workflow's default corpus; else what ``load_corpus``
        reads. ``mlm`` has no training split: its task corpus is the default corpus.
        """
        from ..calibration.corpus import load_corpus
        from ..tasks import get_task, load_split
        from ..workflow import open_corpus

        cfg = self.config
        if is_default(spec, task):
            return open_corpus(None, max_examples=cfg.max_calibration_examples)
        if spec == TASK_CORPUS or spec.startswith(TASK_CORPUS + ":"):
            source = task if spec == TASK_CORPUS else get_task(spec.split(":", 1)[1])
            limit = cfg.max_calibration_examples or cfg.max_train_examples
            split = load_split(source, "train", cfg.data_dir, limit)
            texts = [" ".join(t) if isinstance(t, list) else t for t in split.texts]  # token tasks: word lists
            corpus = load_corpus(texts, pairs=source.pairs)
            corpus.description = f"{source.name} training texts, unlabelled ({split.source})"
            return corpus
        return load_corpus(spec, pairs=task.pairs, max_examples=cfg.max_calibration_examples)

    def constants_for(self, kind: str, spec: str, task, length: int, heads=None):
        """The constants a cell of ``kind`` converts with (``distilled``, ``sharpened``: fitted for the cell's
        ``heads``)."""
        from .. import registry

        chosen = registry.kind(kind, sweeps=True)
        corpus = self.open_corpus(spec, task) if chosen.needs_corpus else None
        distill = DistillOptions(
            **{f"distill_{k}": v for k, v in self.config.distill_options.items()},
            sharpen_search=self.config.resolved_sharpen_search,
        )
        return self.flow.constants(kind, corpus=corpus, max_length=length, heads=heads, distill=distill)

    def heal(self, model, spec: str, task):
        """``model`` (converted for a cell) healed toward the source on the cell's calibration corpus (where that
        is the default corpus, the default healing corpus: ``open_healing_corpus``)."""
        from ..options import HealOptions
        from ..workflow import open_healing_corpus

        if is_default(spec, task):
            corpus = open_healing_corpus(None, max_examples=self.config.max_calibration_examples)
        else:
            corpus = self.open_corpus(spec, task)
        return self.flow.heal(model, corpus, HealOptions(**self.config.heal_options))

    # ---------------------------------------------------------------------------------------- ranking
    def ranking(self, method: str, spec: str, task, length: int, seed: int):
        from .. import registry

        options = {}
        if registry.method(method).task:
            options = dict(max_train_examples=self.config.max_train_examples, **self.config.rank_options)
        needs = registry.method(method).constants
        corpus = self.open_corpus(spec, task) if needs else None
        ranking = self.flow.ranking(
            method,
            task=task.name,
            data_dir=self.config.data_dir,
            calibration={"corpus": corpus, "max_length": length},
            seed=seed,
            **options,
        )
        ranking.check_compatible(self.model.config)
        return ranking
