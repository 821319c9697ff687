"""``FinetuneJob``: a sweep job that fine-tunes each cell's converted model end to end (``papa-surgery finetune``)."""

from __future__ import annotations

from ..preflight import task_split
from ..sweep_config import SweepConfig
from .hparams import FinetuneOptions

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
        self.options.validate()

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
        from .train import SavedModel

        return SavedModel()

    def run(self, model, tokenizer, task, seed: int, progress: bool, shared=None, labeled: bool = False) -> dict:
        """The fine-tuned score and cost fields of one cell (``labeled`` never comes: ``check_data`` refuses it)."""
        from .train import finetune

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
