"""What a sweep covers: ``SweepConfig`` (tasks, fractions, seeds, kinds, methods, corpora) and its cells."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .. import registry
from .results import TASK_CORPUS, Cell, resolve_heal_options

DEFAULT_FRACTIONS = (0.0, 0.5, 0.875, 0.9375, 1.0)  # paper Fig. 2: {1, 1/2, 1/8, 1/16, 0} of heads kept
DEFAULT_CORPUS = "default"  # the workflow's one default corpus (papa_surgery.calibration.default_corpus)


def _as_tuple(value) -> tuple:
    if value is None:
        return ()
    if isinstance(value, (str, int, float)):
        return (value,)
    return tuple(value)


@dataclass(frozen=True)
class SweepConfig:
    """One sweep: which model, tasks and cells, and how the probe runs.

    Attributes:
        model: a Hub id or local folder (source model, or a PAPA checkpoint probed as it is).
        tasks: registered task names (``papa_surgery.tasks.registry.TASKS``).
        fractions: shares of heads made constant (0 = the source, 1 = attention-free); default the paper's Fig. 2.
        seeds: how many seeds (``3`` -> 0, 1, 2) or the seeds themselves.
        kinds: constant kinds (``papa_surgery.registry.SWEEP_KINDS``: ``average`` = calibrated, the data-free
            ``identity``, ``toeplitz``, ``zeros``, ``uniform``, the trained ``distilled`` and the labelled ones).
        methods: ranking methods; default ``variance`` (no labels); ``lambda`` learns the paper's ranking.
        corpus: calibration corpus: ``None``/``"task"`` = the task's own training texts, unlabelled (the
            paper); ``"task:NAME"`` = the training texts of task NAME (paper Table 2 uses ``task:mnli``);
            ``"default"`` = the workflow's default corpus; else anything ``load_corpus`` reads. A tuple
            sweeps several corpora (Table 2).
        data_dir: read tasks from local files (``../shared/data`` layout) instead of the Hub.
        max_length: slot count L for every task; default each task's App. B sequence length.
        max_train_examples, max_eval_examples: keep only the first examples of each split.
        max_calibration_examples: cap on calibration examples; default ``max_train_examples`` for task corpora.
        epochs, lr, batch_size: override the task's App. B probe hyperparameters.
        calibration_batch_size: examples per calibration forward pass.
        device, dtype: where and in which dtype the model runs.
        cache_gb: memory budget for the probe's cached hidden states.
        save_artifacts: save constants and rankings in ``<results>.artifacts/`` (and reuse them on resume).
        rank_options: extra keyword arguments for ``ranking.lambda_rank`` training (lambda methods only).
        heal_options: :class:`papa_surgery.options.HealOptions` fields (``steps``, ``train``, ...); given, every
            kind's converted model is also healed on the cell's calibration corpus (``"default"``: the default
            healing corpus) and scored as the kind ``<kind>+healed`` (``registry.healed_label``); empty (the
            default): no healing.
        distill_options: keyword arguments for ``distill.distill`` (``steps``, ``objective``, ``lr``) of the
            ``distilled`` kind, which distils the calibrated average for each cell's constant heads.
        sharpen_search: how the ``sharpened`` kind fits its exponents for each cell's constant heads
            (``registry.SHARPEN_SEARCHES``; default ``per-head``, as ``convert --kind sharpened``).
        label: the model's name in the results (default ``model``; e.g. a Hub id for a local copy).
        trust_remote_code: load ``model`` with the code files it ships (a PAPA checkpoint's ``modeling_papa.py``)
            instead of papa-surgery's own classes.
    """

    model: str
    tasks: tuple[str, ...] = ("sst2",)
    fractions: tuple[float, ...] = DEFAULT_FRACTIONS
    seeds: int | tuple[int, ...] = 3
    kinds: tuple[str, ...] = ("average",)
    methods: tuple[str, ...] = ("variance",)
    corpus: str | tuple[str, ...] | None = None
    data_dir: str | None = None
    max_length: int | None = None
    max_train_examples: int | None = None
    max_eval_examples: int | None = None
    max_calibration_examples: int | None = None
    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    calibration_batch_size: int = 32
    device: str | None = None
    dtype: str | None = None
    cache_gb: float = 4.0
    save_artifacts: bool = True
    rank_options: dict = field(default_factory=dict, hash=False)
    distill_options: dict = field(default_factory=dict, hash=False)
    sharpen_search: str | None = None
    heal_options: dict = field(default_factory=dict, hash=False)
    label: str | None = None
    trust_remote_code: bool = False

    @property
    def model_name(self) -> str:
        """The model as results rows name it."""
        return self.label or self.model

    @property
    def resolved_sharpen_search(self) -> str:
        """The ``sharpened`` kind's search: the one given, else the default (``registry.DEFAULT_SHARPEN_SEARCH``)."""
        return self.sharpen_search or registry.DEFAULT_SHARPEN_SEARCH

    @property
    def seed_list(self) -> tuple[int, ...]:
        if isinstance(self.seeds, int):
            return tuple(range(self.seeds))
        return tuple(int(s) for s in self.seeds)

    @property
    def corpora(self) -> tuple[str, ...]:
        return tuple(TASK_CORPUS if c is None else str(c) for c in (_as_tuple(self.corpus) or (None,)))

    def validate(self) -> None:
        """ValueError for any input the sweep cannot run (before anything is computed or written)."""
        from ..options import FRACTION, ArgumentError
        from ..tasks import get_task

        if not _as_tuple(self.tasks):
            raise ArgumentError("tasks", "a sweep needs at least one task")
        for name in _as_tuple(self.tasks):
            try:
                get_task(name)
            except ArgumentError as err:  # the field is tasks (its flag --task, given once per task)
                raise ArgumentError("tasks", err.detail) from None
        if not _as_tuple(self.fractions):
            raise ArgumentError("fractions", "a sweep needs at least one fraction")
        for f in _as_tuple(self.fractions):
            try:
                FRACTION.convert(f, None, None)
            except Exception as err:
                raise ArgumentError("fractions", getattr(err, "message", str(err))) from None
        seeds = self.seed_list
        if not seeds or any(s < 0 for s in seeds) or len(set(seeds)) != len(seeds):
            raise ArgumentError(
                "seeds", f"must be a positive count or distinct non-negative integers, got {self.seeds!r}"
            )
        for kind in _as_tuple(self.kinds) or ("",):
            registry.kind(kind, sweeps=True)
        if self.heal_options:
            from ..options import HealOptions

            HealOptions(**self.heal_options)  # the same checks as the command line's
            labeled = [k for k in _as_tuple(self.kinds) if registry.kind(k, sweeps=True).sweeps_only]
            if labeled:
                raise ArgumentError(
                    "heal_options",
                    f"the {labeled[0]!r} kind trains its constants with each cell's probe: it has no converted model "
                    "to heal; sweep it without healing",
                )
        if self.sharpen_search is not None and self.sharpen_search not in registry.SHARPEN_SEARCHES:
            raise ArgumentError(
                "sharpen_search",
                f"must be one of {', '.join(registry.SHARPEN_SEARCHES)}, got {self.sharpen_search!r}",
            )
        for method in _as_tuple(self.methods) or ("",):
            registry.method(method)
        for spec in self.corpora:
            if spec.startswith(TASK_CORPUS + ":"):
                try:
                    get_task(spec.split(":", 1)[1])
                except ArgumentError as err:  # named in --corpus task:NAME, not in --task
                    raise ArgumentError("corpus", err.detail) from None
        if self.data_dir is not None and not Path(self.data_dir).is_dir():
            raise ArgumentError("data_dir", f"{self.data_dir} is not a folder")
        if self.max_length is not None and self.max_length < 4:
            raise ArgumentError("max_length", f"must be at least 4, got {self.max_length}")

    def score_options(self, task) -> dict:
        """The options that change a score of ``task``, resolved against the task's defaults (App. B).

        Rows record them; resuming with a different value is an error naming the option.
        """
        from ..tasks.registry import get_task

        task = get_task(task)
        return {
            "max_length": self.max_length or task.max_length,
            "max_train_examples": self.max_train_examples,
            "max_eval_examples": self.max_eval_examples,
            "max_calibration_examples": self.max_calibration_examples,
            "epochs": task.epochs if self.epochs is None else self.epochs,
            "lr": task.lr if self.lr is None else self.lr,
            "batch_size": self.batch_size or task.batch_size,
            "dtype": self.dtype or "fp32",
            "rank_options": {k: self.rank_options[k] for k in sorted(self.rank_options)},
            **(
                {"distill_options": {k: self.distill_options[k] for k in sorted(self.distill_options)}}
                if "distilled" in _as_tuple(self.kinds)
                else {}
            ),
            **({"sharpen_search": self.resolved_sharpen_search} if "sharpened" in _as_tuple(self.kinds) else {}),
            **({"heal_options": self.resolved_heal_options} if self.heal_options else {}),
        }

    @property
    def resolved_heal_options(self) -> dict:
        """``heal_options`` as rows record them: :func:`resolve_heal_options`."""
        return resolve_heal_options(self.heal_options)

    def cells(self) -> list[Cell]:
        """Every cell of the sweep, in the order it runs (seeds innermost, so a converted model serves all).

        Equal cells (``0.5`` and ``1/2``, a repeated kind...) appear once. With ``heal_options`` every kind is
        followed by its healed twin (``average``, ``average+healed``, ...).
        """
        from ..tasks.registry import get_task

        out, seen = [], set()
        for task in _as_tuple(self.tasks):
            for corpus in self.corpora:
                for kind in self._labels():
                    for method in _as_tuple(self.methods):
                        for fraction in _as_tuple(self.fractions):
                            for seed in self.seed_list:
                                cell = Cell(
                                    model=self.model_name,
                                    task=get_task(task).name,
                                    fraction=float(fraction),
                                    kind=kind,
                                    method=method,
                                    seed=int(seed),
                                    corpus=corpus,
                                )
                                if cell.key not in seen:
                                    seen.add(cell.key)
                                    out.append(cell)
        return out

    def _labels(self) -> list[str]:
        """The kinds of the cells: each kind, then its healed twin when the sweep heals."""
        kinds = _as_tuple(self.kinds)
        return [label for k in kinds for label in ((k, registry.healed_label(k)) if self.heal_options else (k,))]


def parse_fractions(text: str | Sequence[float]) -> tuple[float, ...]:
    """``"0,0.5,7/8"`` -> (0.0, 0.5, 0.875); ValueError for an empty item or a share outside [0, 1]."""
    import click

    from ..options import ArgumentError, FractionListType

    try:
        return FractionListType().convert(text, None, None)
    except click.BadParameter as err:
        raise ArgumentError("fractions", err.message) from None
