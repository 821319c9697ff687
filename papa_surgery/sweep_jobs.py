"""How a sweep scores a converted model: the job a cell runs once its model is converted.

``ProbeJob`` is the paper's protocol (a probe on the frozen backbone, paper 3.3). A job says which data it
needs (checked before the first cell), which options change its scores (rows record them, resume checks
them), which result fields a row keeps, and what it may share between cells that probe the same model.
"""

from __future__ import annotations

from .preflight import task_split
from .sweep_config import SweepConfig

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
        from .probe import FeatureCache

        return FeatureCache()

    def run(self, model, tokenizer, task, seed: int, progress: bool, shared=None, labeled: bool = False) -> dict:
        """The probe's result fields for one cell; ``labeled``: the model's trainable constants train jointly
        with the probe (the labeled kinds, paper Table 1 rows 4-5), which no other cell may share."""
        from .labeled import labeled_probe
        from .probe import probe

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
