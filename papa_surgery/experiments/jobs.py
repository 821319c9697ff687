"""How a sweep scores a converted model: the job a cell runs once its model is converted, one per protocol.

``ProbeJob`` is the paper's protocol (a probe on the frozen backbone, paper 3.3); ``FinetuneJob`` the
practitioner's (the whole model fine-tuned end to end, with its cost). A job says which data it needs
(checked before the first cell), which options change its scores (rows record them, resume checks them),
which result fields a row keeps, and what it may share between cells that score the same model.
"""

from __future__ import annotations

from ..options import FinetuneOptions
from ..tasks import task_split
from .config import SweepConfig

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


class ProbeJob:
    """Probe the frozen converted model on the task (App. B hyperparameters unless the config overrides them)."""

    name = "probe"
    fields = PROBE_FIELDS

    def __init__(self, config: SweepConfig):
        self.config = config

    def check_data(self, task) -> None:
        """Read the splits the job uses now, so a missing file fails before any line is written (every kind,
        the labeled ones included, probes)."""
        cfg = self.config
        task_split(task, "eval", cfg.data_dir, cfg.max_eval_examples)
        if task.kind != "mlm":
            task_split(task, "train", cfg.data_dir, cfg.max_train_examples)

    def score_options(self, task) -> dict:
        """The options that change a score of ``task`` (recorded in rows; resume refuses other values)."""
        return self.config.score_options(task)

    def shared_state(self):
        """What cells probing one converted model share: its cached backbone features."""
        from ..probing import FeatureCache

        return FeatureCache()

    def run(self, model, tokenizer, task, seed: int, progress: bool, shared=None, labeled: bool = False) -> dict:
        """The probe's result fields for one cell; ``labeled``: the model's trainable constants train jointly
        with the probe (the labeled kinds, paper Table 1 rows 4-5), which no other cell may share."""
        from ..probing import probe
        from ..probing.labeled import labeled_probe

        cfg = self.config
        options = dict(
            data_dir=cfg.data_dir,
            seed=seed,
            max_train_examples=cfg.max_train_examples,
            max_eval_examples=cfg.max_eval_examples,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            lr=cfg.lr,
            device=cfg.device,
            progress=progress,
            cache_gb=cfg.cache_gb,
        )
        if labeled:
            result = labeled_probe(model, tokenizer, task, **options)
        else:
            result = probe(model, tokenizer, task, reuse=shared, **options)
        return {k: result.get(k) for k in self.fields if k in result}


FINETUNE_FIELDS = (
    "metric",
    "score",
    "examples",
    "eval_examples",
    "epochs",
    "steps",
    "training_loss",
    "seconds",
    "train_examples_per_second",
    "inference_examples_per_second",
    "peak_memory_mb",
    "memory_kind",
    "trainable_parameters",
    "total_parameters",
    "checkpoint_bytes",
    "device",
    "data",
)


class FinetuneJob:
    """Fine-tune the whole converted model on the task (``FinetuneOptions``; the sweep's epochs, lr and
    batch size override the task's fine-tuning defaults), then score it with the task's metric."""

    name = "finetune"
    fields = FINETUNE_FIELDS

    def __init__(self, config: SweepConfig, options: FinetuneOptions | None = None):
        from dataclasses import replace

        self.config = config
        overrides = {k: getattr(config, k) for k in ("epochs", "lr", "batch_size", "max_length")}
        self.options = replace(options or FinetuneOptions(), **{k: v for k, v in overrides.items() if v is not None})

    def check_data(self, task) -> None:
        """Read both splits now (and refuse ``mlm`` and the labeled kinds), so a bad input fails before any line
        is written."""
        if any(kind.startswith("labeled-") for kind in self.config.kinds):
            raise ValueError("labeled kinds train their constants with the probe: run them in `papa-surgery probe`")
        if task.kind == "mlm":
            raise ValueError("task 'mlm' has no fine-tuning head: probe it (`papa-surgery probe --task mlm`)")
        cfg = self.config
        task_split(task, "train", cfg.data_dir, cfg.max_train_examples)
        task_split(task, "eval", cfg.data_dir, cfg.max_eval_examples)

    def score_options(self, task) -> dict:
        """Every option that changes a fine-tuned score: the sweep's (data, slots, calibration) with the
        fine-tuning hyperparameters, resolved against the task's defaults, in place of the probe's."""
        hyper = {k: v for k, v in self.options.for_task(task).as_dict().items() if k != "max_length"}
        return {**self.config.score_options(task), **hyper}

    def shared_state(self):
        """Cells fine-tuning one converted model (a sweep's seeds) save it once."""
        from ..finetuning.train import SavedModel

        return SavedModel()

    def run(self, model, tokenizer, task, seed: int, progress: bool, shared=None, labeled: bool = False) -> dict:
        """The fine-tuned score and cost fields of one cell (``labeled`` never comes: ``check_data`` refuses it)."""
        from ..finetuning.train import finetune

        cfg = self.config
        result = finetune(
            model,
            tokenizer,
            task,
            options=self.options,
            seed=seed,
            data_dir=cfg.data_dir,
            max_train_examples=cfg.max_train_examples,
            max_eval_examples=cfg.max_eval_examples,
            device=cfg.device,
            progress=progress,
            saved=shared,
        )
        return {k: result.get(k) for k in self.fields if k in result}
