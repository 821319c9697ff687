"""Fine-tune a (converted) model end to end on a task with ``transformers.Trainer``, and measure its cost.

The model is saved and reloaded with the family's stock head class, exactly as a user fine-tunes a
published checkpoint: ``AutoModelForSequenceClassification.from_pretrained(folder, num_labels=...)`` (token tasks:
``AutoModelForTokenClassification``; a PAPA model by papa-surgery's own registered classes), with a freshly initialised
head seeded by ``seed``. The model passed in is never changed. The constant heads' matrices stay frozen
buffers unless ``trainable_constants``.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from ..distributed import broadcast_from_main, is_main_process, world_size
from ..models.families import is_papa_config
from ..models.papa_classes import papa_classes
from ..options import ArgumentError, FinetuneOptions, spell
from ..probing.features import token_ids
from ..probing.run import slot_count
from ..tasks.data import load_split
from ..tasks.metrics import degenerate_message, predicted_classes, score
from ..tasks.registry import MLM, TOKEN, Task, get_task
from .cost import PeakMemory, folder_bytes, parameter_counts
from .data import collator, task_dataset

logger = logging.getLogger("papa_surgery")

HEAD_CLASSES = {TOKEN: "AutoModelForTokenClassification"}
DEFAULT_HEAD_CLASS = "AutoModelForSequenceClassification"


class SavedModel:
    """A model saved once to a temporary folder and reloaded by every cell that fine-tunes it (a sweep's seeds).

    Under a launcher rank 0 alone writes it (transformers saves on rank 0 only) and every rank loads that
    folder, so the processes must share a file system: one machine, or ``TMPDIR`` on a shared one.
    """

    def __init__(self):
        self._tmp = None
        self.folder: Path | None = None
        self.bytes = 0

    def save(self, model, tokenizer) -> Path:
        if self.folder is None:
            saved = None
            if is_main_process():
                self._tmp = tempfile.TemporaryDirectory(prefix="papa-finetune-")
                folder = Path(self._tmp.name)
                model.save_pretrained(folder)
                tokenizer.save_pretrained(folder)
                saved = (str(folder), folder_bytes(folder))
            path, self.bytes = broadcast_from_main(saved)
            self.folder = Path(path)
        return self.folder


def _predictions(output, task: Task) -> tuple[list, list]:
    """(golds, preds) from ``Trainer.predict``: per example, or per sentence of its labelled tokens."""
    pred = np.argmax(output.predictions, axis=-1)
    if task.kind != TOKEN:
        return output.label_ids.tolist(), pred.tolist()
    golds, preds = [], []
    for labels, guesses in zip(output.label_ids, pred, strict=True):
        keep = labels != -100
        golds.append(labels[keep].tolist())
        preds.append(guesses[keep].tolist())
    return golds, preds


def _num_heads(model) -> int:
    from ..models.families import num_heads_layers

    heads, layers = num_heads_layers(model.config)
    return heads * layers


@contextlib.contextmanager
def _quiet_transformers():
    """transformers' warnings off for the block (its verbosity put back after)."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


def finetune(
    model: torch.nn.Module,
    tokenizer,
    task: str | Task,
    *,
    options: FinetuneOptions | None = None,
    seed: int = 0,
    data_dir=None,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    device: str | None = None,
    progress: bool = True,
    saved: SavedModel | None = None,
) -> dict:
    """Fine-tune a copy of ``model`` with the task's stock head and score it on the task's dev split.

    Args:
        model: a PAPA model (any fraction) or a source model; it is saved, reloaded with a fresh head, and
            left unchanged.
        tokenizer: its tokenizer.
        task: a registered task name (``papa_surgery.tasks.registry.TASKS``) or a :class:`Task`; not ``mlm``.
        options: hyperparameters (``None`` fields take the task's defaults, see ``FinetuneOptions``).
        seed: seeds the head's initialisation, batch order and dropout.
        data_dir: local files laid out like ``../shared/data``; ``None`` reads the Hub dataset.
        max_train_examples, max_eval_examples: keep only the first examples of a split.
        device: where to train (default: CUDA when available, else CPU).
        progress: Trainer's progress bars.
        saved: a :class:`SavedModel` shared by calls on the same, unchanged model (saved once).

    Under ``torchrun`` or ``accelerate launch`` (a process group is up) Trainer trains with DDP: each process
    takes ``batch_size / processes`` of every batch, so the global batch and the schedule equal a single
    process's; the data order differs (the sampler shards a shuffled order), so scores agree with a
    single-process run only up to that ordering, as two seeds do.

    Returns:
        The score and the cost: ``metric``, ``score``, ``examples``, ``eval_examples``, ``epochs``, ``lr``,
        ``batch_size``, ``max_length``, ``steps``, ``training_loss``, ``seconds``,
        ``train_examples_per_second``, ``inference_examples_per_second``, ``peak_memory_mb`` (with
        ``memory_kind``), ``trainable_parameters``, ``total_parameters``, ``checkpoint_bytes``, ``data``.

    Raises:
        ValueError: ``mlm`` (no fine-tuning head), trainable constants on a model without constant heads,
            bad hyperparameters, a missing split, or an input that does not fit the model's slots.
    """
    import transformers
    from transformers import EarlyStoppingCallback, PrinterCallback, Trainer, TrainingArguments, set_seed

    task = get_task(task)
    if task.kind == MLM:
        raise ValueError("task 'mlm' has no fine-tuning head: probe it (`papa-surgery probe --task mlm`)")
    opts = (options or FinetuneOptions()).for_task(task)
    papa_heads = getattr(model.config, "papa_constant_heads", None)
    if opts.trainable_constants and not papa_heads:
        raise ArgumentError("trainable_constants", "needs a model with constant heads (a fraction above 0)")
    processes = world_size()
    if opts.batch_size % processes:
        raise ValueError(
            f"{spell('batch_size', opts.batch_size)} does not split over {processes} processes: pass a multiple of "
            f"{processes}"
        )
    start = time.perf_counter()
    length = slot_count(model, task, opts.max_length)
    device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
    train_split = load_split(task, "train", data_dir, max_train_examples)
    eval_split = load_split(task, "eval", data_dir, max_eval_examples)
    sep_id, _ = token_ids(model, tokenizer)
    train_ds = task_dataset(tokenizer, train_split, task, length, sep_id)
    eval_ds = task_dataset(tokenizer, eval_split, task, length, sep_id)

    saved = saved or SavedModel()
    folder = saved.save(model, tokenizer)
    head_class = getattr(transformers, HEAD_CLASSES.get(task.kind, DEFAULT_HEAD_CLASS))
    names = list(task.label_names)
    set_seed(seed)  # the fresh head's initialisation
    extra = {"papa_trainable_constants": True} if opts.trainable_constants else {}
    # The folder just written is read by the classes the model was loaded with: papa-surgery's own (registered for
    # this load only), or the checkpoint's code a user asked to run (--trust-remote-code), which it saved beside.
    shipped = is_papa_config(model.config) and not type(model).__module__.startswith("papa_surgery.")
    # transformers reports the fresh head as MISSING weights in a table: expected here, so it is not shown
    with contextlib.nullcontext() if shipped else papa_classes(model.config.model_type), _quiet_transformers():
        net = head_class.from_pretrained(
            folder,
            num_labels=task.num_labels,
            id2label=dict(enumerate(names)),
            label2id={n: i for i, n in enumerate(names)},
            trust_remote_code=shipped,
            **extra,
        )
    trainable, total = parameter_counts(net)

    def compute_metrics(output):
        return {"score": score(task.metric, *_predictions(output, task), task.label_names)}

    stopping = opts.early_stopping_patience is not None
    with tempfile.TemporaryDirectory(prefix="papa-trainer-") as work:
        args = TrainingArguments(
            output_dir=work,
            num_train_epochs=opts.epochs,
            learning_rate=opts.lr,
            # Under a launcher Trainer runs DDP: each process takes its share of every batch, so the global
            # batch, the step count and the schedule are a single process's.
            per_device_train_batch_size=opts.batch_size // processes,
            per_device_eval_batch_size=max(1, opts.eval_batch_size // processes),
            weight_decay=opts.weight_decay,
            warmup_steps=opts.warmup_ratio,  # a float below 1 is a share of the steps
            lr_scheduler_type="linear",
            seed=seed,
            data_seed=seed,
            use_cpu=device.type == "cpu",
            eval_strategy="epoch" if stopping else "no",
            save_strategy="epoch" if stopping else "no",
            save_total_limit=1 if stopping else None,
            load_best_model_at_end=stopping,
            metric_for_best_model="score" if stopping else None,
            greater_is_better=True,
            logging_strategy="no",
            report_to="none",
            disable_tqdm=not progress,
        )
        trainer = Trainer(
            model=net,
            args=args,
            train_dataset=train_ds,
            eval_dataset=eval_ds if stopping else None,
            data_collator=collator(tokenizer, task),
            compute_metrics=compute_metrics if stopping else None,
            callbacks=[EarlyStoppingCallback(opts.early_stopping_patience)] if stopping else None,
        )
        if not progress:
            trainer.remove_callback(PrinterCallback)  # it prints the final metrics dict to stdout
        with PeakMemory(device) as memory:
            trained = trainer.train()
            output = trainer.predict(eval_ds)
    golds, preds = _predictions(output, task)
    fraction = len(papa_heads or []) / max(_num_heads(model), 1)
    warning = degenerate_message(f"the fine-tuned model (fraction {fraction:g}, seed {seed})", task, golds, preds)
    if warning:
        logger.warning("%s", warning)
    return {
        "task": task.name,
        "metric": task.metric,
        "score": score(task.metric, golds, preds, task.label_names),
        "seed": seed,
        "examples": len(train_split),
        "eval_examples": len(eval_split),
        "epochs": trained.metrics.get("epoch", opts.epochs),
        "lr": opts.lr,
        "batch_size": opts.batch_size,
        "max_length": length,
        "steps": trained.global_step,
        "training_loss": trained.training_loss,
        "seconds": round(time.perf_counter() - start, 2),
        "train_examples_per_second": trained.metrics.get("train_samples_per_second"),
        "inference_examples_per_second": output.metrics.get("test_samples_per_second"),
        "peak_memory_mb": memory.mb,
        "memory_kind": memory.kind,
        "trainable_parameters": trainable,
        "total_parameters": total,
        "checkpoint_bytes": saved.bytes,
        "predicted_classes": predicted_classes(preds),
        "device": device.type,
        "data": f"train={train_split.source} eval={eval_split.source}",
    }
