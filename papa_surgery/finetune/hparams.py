"""Fine-tuning hyperparameters: sensible per-task defaults, every one overridable.

The defaults follow common BERT-family practice (Devlin et al. 2019; Liu et al. 2019): AdamW with linear
decay and 6% warmup, weight decay 0.01, 3 epochs (5 for the small CoLA and MRPC, whose dev scores are noisy
after 3), batch 16 and learning rate 5e-5, the top of Devlin et al.'s grid: the runs this command is for
(a few thousand examples, small encoders) take few steps, and at 2e-5 with batch 32 all-MiniLM-L6-v2 stays
at SST-2's majority baseline after one epoch on 1,000 examples (0.509; 5e-5 with batch 16: 0.712). The
probe's App. B values are for a frozen backbone and do not carry over.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

_TASK_DEFAULTS: dict[str, dict] = {"cola": {"epochs": 5}, "mrpc": {"epochs": 5}}


@dataclass(frozen=True)
class FinetuneOptions:
    """How each cell fine-tunes the whole model end to end; ``None`` = the task's default.

    Attributes:
        epochs, lr, batch_size: training length, peak learning rate, examples per step.
        weight_decay: AdamW weight decay (not applied to biases and LayerNorms, as transformers' Trainer does).
        warmup_ratio: share of the steps spent warming the learning rate up linearly.
        eval_batch_size: examples per evaluation step (also the batch of the inference-speed measurement).
        early_stopping_patience: stop after this many epochs without a better dev score; ``None`` (the
            default) trains every epoch and scores the last model.
        trainable_constants: the constant heads' matrices get gradients too (frozen by default).
        max_length: slots L of a source model (default: the task's App. B length, as the probe uses); a PAPA
            model always uses its own L.
    """

    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    weight_decay: float = 0.01
    warmup_ratio: float = 0.06
    eval_batch_size: int = 64
    early_stopping_patience: int | None = None
    trainable_constants: bool = False
    max_length: int | None = None

    def for_task(self, task) -> FinetuneOptions:
        """These options with every ``None`` filled from ``task``'s defaults."""
        defaults = {"epochs": 3, "lr": 5e-5, "batch_size": 16, **_TASK_DEFAULTS.get(task.name, {})}
        filled = {k: v for k, v in defaults.items() if getattr(self, k) is None}
        return replace(self, **filled)

    def validate(self) -> None:
        """ValueError naming the option for a value no run can use."""
        checks = {
            "epochs": self.epochs is None or self.epochs >= 1,
            "lr": self.lr is None or self.lr > 0,
            "batch_size": self.batch_size is None or self.batch_size >= 1,
            "weight_decay": self.weight_decay >= 0,
            "warmup_ratio": 0 <= self.warmup_ratio < 1,
            "eval_batch_size": self.eval_batch_size >= 1,
            "early_stopping_patience": self.early_stopping_patience is None or self.early_stopping_patience >= 1,
        }
        for name, ok in checks.items():
            if not ok:
                flag = "--" + name.replace("_", "-")
                raise ValueError(f"{flag} {getattr(self, name)!r} is out of range; see `papa-surgery finetune --help`")

    def as_dict(self) -> dict:
        return asdict(self)
