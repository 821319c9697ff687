"""The one workflow: constants -> ranking -> PAPA model with its recipe (-> healed), for one loaded source model.

:class:`Workflow` decides, once, which constants a kind needs and how they are made, which constants and data a
ranking method reads, and how a converted model records its provenance; the registry
(:mod:`papa_surgery.registry`) holds the facts it reads. The Python API (``papa_surgery.calibrate``, ``rank``,
``convert``), the CLI's jobs (:mod:`.jobs`) and sweeps (:mod:`papa_surgery.experiments`) all call it; sweeps
pass a :class:`Cache` that keeps constants and rankings between cells and on disk between runs.

    flow = Workflow(model, tokenizer, source_name="sentence-transformers/all-MiniLM-L6-v2")
    constants = flow.constants("average")           # the default corpus, at the source's own length (256 here)
    ranking = flow.ranking("variance", constants=constants)
    papa = flow.convert(constants, ranking, fraction=0.5)                  # papa.papa_recipe: how to redo it
    healed = flow.heal(papa, corpus=None, options=HealOptions(steps=400))  # toward the source, label-free
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from .. import registry
from ..calibration.corpus import Corpus
from ..options import DistillOptions, HealOptions, RunOptions
from .corpora import open_corpus, open_healing_corpus

logger = logging.getLogger("papa_surgery")


class Cache:
    """Where a workflow keeps what it made, by key: in memory (this class) or also on disk (sweeps).

    ``fetch(what, key, make)`` returns the kept value of ``(what, key)`` or makes, keeps and returns it.
    """

    def __init__(self):
        self.kept: dict[tuple, Any] = {}

    def fetch(self, what: str, key: tuple, make: Callable[[], Any]) -> Any:
        if (what, key) not in self.kept:
            self.kept[(what, key)] = self.load(what, key)
            if self.kept[(what, key)] is None:
                self.kept[(what, key)] = value = make()
                self.store(what, key, value)
        return self.kept[(what, key)]

    def load(self, what: str, key: tuple) -> Any:
        """A value saved by an earlier run (``None``: none); the in-memory cache has none."""
        return None

    def store(self, what: str, key: tuple, value: Any) -> None:
        """Save a new value for later runs (the in-memory cache keeps it in memory only)."""


def corpus_key(corpus: Corpus) -> tuple:
    """What identifies a corpus's examples across runs: its description, which examples they are (two files of one
    name, or one edited since, differ: :attr:`Corpus.identity`), pairs and cap."""
    return corpus.key()


class Workflow:
    """The workflow's steps for one loaded source model (never changed: steps copy what they convert).

    Args:
        model, tokenizer: the source model and its tokenizer.
        source_name: the source's Hub id (or public name) recorded in constants, rankings and recipes.
        run: device, dtype, batch size and seed of the passes.
        progress: tqdm bars.
        cache: keeps constants and rankings (default: in memory, for this workflow only).
    """

    def __init__(self, model, tokenizer, *, source_name=None, run: RunOptions | None = None, progress=True, cache=None):
        from ..models.loading import public_name

        self.model, self.tokenizer = model, tokenizer
        loaded_from = getattr(model.config, "_name_or_path", None) or None
        # A local folder loaded in Python: named as the CLI names it (its Hub id when it is a copy, else its name)
        self.local = _local_source(loaded_from) if source_name is None else None
        self.source = source_name or (self.local or {}).get("model") or public_name(loaded_from) or None
        self.run = run or RunOptions()
        self.progress = progress
        self.cache = cache or Cache()

    @property
    def source_length(self):
        """The length the source uses (:func:`papa_surgery.workflow.lengths.source_length`): the default L."""
        from .lengths import source_length

        if not hasattr(self, "_source_length"):
            self._source_length = source_length(self.model.config, self.tokenizer)
        return self._source_length

    def slots(self, max_length: int | None) -> int:
        """L for a run: ``max_length`` when given, else the source's own length."""
        return self.source_length.length if max_length is None else int(max_length)

    @property
    def shape(self) -> tuple[int, int]:
        """(layers, heads per layer) of the source."""
        from ..models.families import num_heads_layers

        heads, layers = num_heads_layers(self.model.config)
        return layers, heads

    def every_head(self) -> list[list[int]]:
        """Every ``[layer, head]`` of the source, in order (what fraction 1 makes constant, whatever the ranking)."""
        layers, per_layer = self.shape
        return [[layer, h] for layer in range(layers) for h in range(per_layer)]

    # ------------------------------------------------------------------------------------------ constants
    def constants(
        self,
        kind: str = "average",
        *,
        corpus=None,
        max_length: int | None = None,
        pairs: bool = False,
        max_examples: int | None = None,
        heads=None,
        distill: DistillOptions | None = None,
        storage: str = "auto",
        compact_band: int | None = None,
        compact_rank: int | None = None,
    ):
        """The constants of ``kind`` for every head (a ``distilled`` kind: trained for ``heads``), on ``max_length``
        slots (default: the source's own length, :attr:`source_length`).

        Data-free kinds read no corpus; corpus averages (``average``, ``norm-average``, ``effective-average``)
        are one pass over ``corpus`` (``None``: the default corpus); ``distilled`` starts from the average and
        trains the matrices of ``heads`` (default: every head) toward the source's hidden states; a labelled
        kind returns its starting matrices (the probe of a sweep cell trains them); compact ``storage`` (band, rank)
        makes the average calibrate into it.
        """
        from ..calibration.average import structure_of
        from ..calibration.budget import check_kind_fits

        chosen = registry.kind(kind, sweeps=True)
        max_length = self.slots(max_length)
        if chosen.starts_from and chosen.made == registry.LABELED:
            chosen = registry.kind(chosen.starts_from)
        if chosen.made == registry.DATA_FREE:  # O(L) per head in a compact layout: any L
            from ..calibration.compaction import DENSE_UP_TO, layout_for
            from ..calibration.data_free import data_free_constants

            # built straight into the structure wherever it is stored compact: exact, so no residual unless asked
            compact = storage == "compact" or (storage == "auto" and max_length > DENSE_UP_TO)
            layout = layout_for("compact", max_length, False, compact_band, compact_rank or 0) if compact else None
            if layout is None:
                check_kind_fits(chosen, self.shape, max_length)
            layers, per_layer = self.shape
            return data_free_constants(chosen.name, layers, per_layer, max_length, layout, source_model=self.source)
        pairs = corpus.pairs if isinstance(corpus, Corpus) else pairs
        structure = structure_of(chosen.name, storage, max_length, pairs, compact_band, compact_rank)
        if structure is None or chosen.made == registry.TRAINED:
            check_kind_fits(chosen, self.shape, max_length)  # before the corpus is read: at a long L dense cannot fit
        corpus = corpus if isinstance(corpus, Corpus) else open_corpus(corpus, pairs=pairs, max_examples=max_examples)
        if chosen.made == registry.TRAINED:
            start = self.constants(chosen.starts_from, corpus=corpus, max_length=max_length, storage="dense")
            return self.trained(chosen.name, start, heads, corpus, distill)
        key = (chosen.name, corpus_key(corpus), max_length) + ((structure,) if structure else ())
        return self.cache.fetch("constants", key, lambda: self._average(chosen.name, corpus, max_length, structure))

    def _average(self, kind: str, corpus: Corpus, max_length: int, structure=None):
        options = dict(
            max_length=max_length,
            pairs=corpus.pairs,
            batch_size=self.run.batch_size,
            device=self.run.device,
            progress=self.progress,
            source_name=self.source,
        )
        if kind == "average":
            from ..calibration.average import calibrate

            if structure is not None:
                options.update(storage="compact", compact_band=structure[0], compact_rank=structure[1])
            return calibrate(self.model, self.tokenizer, corpus, **options)
        from ..analysis import analysis_constants

        return analysis_constants(kind, self.model, self.tokenizer, corpus, **options)

    def trained(self, kind: str, constants, heads, corpus, options: DistillOptions | None = None):
        """``constants`` with the matrices of ``heads`` (default: every head) fitted on ``corpus`` as the trained
        ``kind`` says: ``distilled`` (trained toward the source's hidden states) or ``sharpened`` (an exponent per
        layer, or per head, fitted to them)."""
        from ..healing.distillation import distill
        from ..healing.sharpness import sharpen

        heads = self.every_head() if heads is None else heads
        corpus = corpus if isinstance(corpus, Corpus) else open_corpus(corpus, pairs=constants.pairs)
        run, common = self.run, dict(batch_size=self.run.batch_size, device=self.run.device, progress=self.progress)
        options = options or DistillOptions()
        if kind == "sharpened":  # of these options only the search applies
            kwargs = {**common, "search": options.sharpen_search}
            fit = lambda: sharpen(self.model, self.tokenizer, corpus, constants, heads, **kwargs)  # noqa: E731
            fitted_with = options.sharpen_search
        else:
            kwargs = {**common, "seed": run.seed, **options.kwargs()}
            fit = lambda: distill(self.model, self.tokenizer, corpus, constants, heads, **kwargs)  # noqa: E731
            fitted_with = tuple(sorted(options.kwargs().items()))
        key = (kind, corpus_key(corpus), constants.key(), tuple(map(tuple, heads)), fitted_with)
        return self.cache.fetch("trained", key, fit)

    # -------------------------------------------------------------------------------------------- ranking
    def ranking(
        self,
        method: str | None = None,
        *,
        task: str | None = None,
        data_dir=None,
        constants=None,
        calibration: dict | None = None,
        seed: int | None = None,
        **lambda_options,
    ):
        """Every head in the order ``method`` makes them constant (default: lambda with a task, else variance).

        A method that reads constants (``registry.Method.constants``) uses ``constants`` when they are of that
        kind and calibrated, and otherwise calibrates them with ``calibration`` (the keyword arguments of
        :meth:`constants`: corpus, max_length, pairs, max_examples). ``lambda_options``: the lambda training's
        (steps, epochs, lr, lambda_lr, max_train_examples; :class:`papa_surgery.ranking.lambdas.LambdaOptions`).
        """
        chosen = registry.check_method(method or registry.default_method(task), task)
        seed = self.run.seed if seed is None else seed
        if chosen.reverses:
            from ..ranking.order import reversed_ranking

            base = self.ranking(
                chosen.reverses,
                task=task,
                data_dir=data_dir,
                constants=constants,
                calibration=calibration,
                seed=seed,
                **lambda_options,
            )
            return reversed_ranking(base)
        from ..calibration.coverage import coverage_unsaid
        from ..ranking.methods import constants_serve, measured_corpus

        cal = calibration or {}
        if chosen.constants is not None and not constants_serve(chosen, constants):
            # what the method reads: a corpus short of the slots is said when a model gets these constants (the
            # ranking measures the slots the corpus reaches; a data-free kind's model gets other constants)
            with coverage_unsaid():
                constants = self.constants(chosen.constants, **cal)
        corpus = lambda_options.pop("corpus", cal.get("corpus"))
        if chosen.corpus:  # measured on text: the one given, else the calibration's, else the default corpus
            corpus = measured_corpus(chosen.name, corpus, constants, cal.get("max_examples"))
        key = (
            chosen.name,
            task if chosen.task else None,
            None if chosen.constants is None else constants.key(),
            seed if chosen.seeded else None,
            tuple(sorted(lambda_options.items())) if chosen.task or chosen.corpus else None,
        )
        if chosen.corpus:  # only then: the keys of the rankings a sweep has cached stay as they were
            key += (corpus_key(corpus),)
        return self.cache.fetch(
            "ranking", key, lambda: self._rank(chosen.name, constants, task, data_dir, seed, corpus, lambda_options)
        )

    def _rank(self, method: str, constants, task, data_dir, seed: int, corpus, lambda_options: dict):
        from ..ranking.methods import rank_heads

        options = dict(lambda_options)  # batch size, epochs, lr: the task's App. B values unless given
        if registry.method(method).task or registry.method(method).corpus:
            options.setdefault("device", self.run.device)
            options.setdefault("progress", self.progress)
        if registry.method(method).corpus:
            options.setdefault("batch_size", self.run.batch_size)
        return rank_heads(
            method,
            self.model,
            tokenizer=self.tokenizer,
            constants=constants,
            task=task,
            data_dir=data_dir,
            seed=seed,
            source_name=self.source,
            corpus=corpus,
            **options,
        )

    # ------------------------------------------------------------------------------------------ conversion
    def convert(
        self,
        constants,
        ranking,
        fraction: float | None = None,
        *,
        heads=None,
        kind: str | None = None,
        method: str | None = None,
        dtype: str = "fp32",
        storage: str = "auto",
        compact_band: int | None = None,
        compact_rank: int | None = None,
        trainable_constants: bool = False,
        command: str | None = None,
        record: dict | None = None,
    ):
        """The PAPA model whose first ``fraction`` of ``ranking``'s heads (or exactly ``heads``; at fraction 0 or 1
        with neither, none or every head) are constant.

        ``kind`` and ``method`` name what made the constants and the heads when ``constants`` and ``ranking`` do
        not say it themselves (a sweep's fraction 1 needs no ranking).

        The model carries ``papa_recipe`` (:func:`papa_surgery.conversion.build_recipe`), everything needed to
        redo it; ``record`` adds to the recipe's source entry (a CLI job records where the model came from).
        """
        from ..conversion.recipe import build_recipe
        from ..conversion.surgery import convert as convert_heads
        from ..distributed import world_size

        if heads is None and ranking is None and fraction in (0.0, 1.0):  # no head or every head: no order needed
            heads = self.every_head() if fraction else []
        elif heads is None:
            ranking.check_compatible(self.model.config)
            heads = ranking.select(fraction)
        papa = convert_heads(
            self.model,
            constants,
            heads,
            tokenizer=self.tokenizer,
            kind=kind or constants.kind,
            method=method or (None if ranking is None else ranking.method),
            fraction=fraction,
            dtype=dtype,
            **dict(storage=storage, compact_band=compact_band, compact_rank=compact_rank),
            trainable_constants=trainable_constants,
            source_name=self.source,
        )
        papa.papa_recipe = build_recipe(papa, constants, ranking, command=command)
        papa.papa_recipe["source"]["max_length"] = self.source_length.as_dict()  # the card says when L is below it
        papa.papa_recipe["source"].update(record if record is not None else self.local or {})
        papa.papa_recipe["processes"] = world_size()
        return papa

    # -------------------------------------------------------------------------------------------- healing
    def heal(self, papa, corpus=None, options: HealOptions | None = None, *, max_examples=None, state_path=None):
        """``papa`` healed toward this workflow's source model (the teacher) on ``corpus``.

        ``corpus=None`` reads the default healing corpus (:func:`open_healing_corpus`; sentence pairs need one
        given). ``options``: steps, what trains, learning rates, objective (:class:`~papa_surgery.options.HealOptions`);
        the batch size, seed and device are the workflow's. The returned model's ``papa_recipe["healing"]`` records
        the run and its held-out agreement before and after (:func:`papa_surgery.healing.heal_model`).
        """
        from ..healing.run import heal_model

        pairs = getattr(papa.config, "papa_calibrated_on", None) == "pairs"
        if not isinstance(corpus, Corpus):
            corpus = open_healing_corpus(corpus, pairs=pairs, max_examples=max_examples)
        return heal_model(
            papa,
            self.model,
            self.tokenizer,
            corpus,
            options,
            batch_size=self.run.batch_size,
            seed=self.run.seed,
            device=self.run.device,
            max_examples=max_examples,
            progress=self.progress,
            state_path=state_path,
            teacher_name=self.source,
        )


def _local_source(name_or_path: str | None) -> dict | None:
    """:func:`papa_surgery.models.sources.source_record` of a model loaded from a local folder (else ``None``)."""
    from pathlib import Path

    if not name_or_path or not Path(name_or_path).is_dir():
        return None
    from ..models.sources import source_info, source_record

    return source_record(name_or_path, name_or_path, source_info(name_or_path))
