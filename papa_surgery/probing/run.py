"""``probe()``: score one model on one task with the paper's probe (frozen backbone, trained head).

Works for any transformers encoder: a source model or a PAPA model (whose ``config.papa_max_length``
sets the slot count, so the source baseline and every fraction use the same layout when the caller
passes that length as ``max_length``).

Data-parallel: under ``torch.distributed`` (e.g. ``accelerate launch``) the backbone forward, which
dominates the cost, is sharded over processes (see ``features.FeatureStore``); every process then
trains the same small probe on the same gathered features with the same seed, so the score equals a
single process's score. The probe's own training is not split across processes: it is a few
milliseconds per step and splitting it would change dropout masks and summation order. When the
features exceed the cache budget, every process runs the backbone on every batch itself (same score,
no speed-up). Progress bars show on rank 0 only.
"""

from __future__ import annotations

import logging
import time

import torch
from torch import nn

from ..tasks.data import load_split
from ..tasks.metrics import degenerate_message, neg_log_perplexity, perplexity, predicted_classes, score
from ..tasks.registry import MLM, Task, get_task
from .features import FeatureStore, backbone_of, dist_info, encode_split, token_ids
from .heads import build_head
from .mlm import masked_nll, require_mlm_head
from .train import predict, train_head

logger = logging.getLogger("papa_surgery")

DEFAULT_CACHE_GB = 4.0


class FeatureCache:
    """Tokenised splits and their hidden states, kept across ``probe()`` calls on the same model.

    Entries are keyed by the model object and (task, split, data source, slot count); the caller must not
    change the model's weights while it shares a cache (make a new cache, or :meth:`clear` it, after).
    """

    def __init__(self):
        self._stores: dict = {}

    def get(self, model: nn.Module, key: tuple) -> FeatureStore | None:
        entry = self._stores.get((id(model), key))
        return entry[1] if entry is not None and entry[0] is model else None

    def put(self, model: nn.Module, key: tuple, store: FeatureStore) -> None:
        self._stores[(id(model), key)] = (model, store)

    def clear(self) -> None:
        self._stores.clear()


def slot_count(model: nn.Module, task: Task, max_length: int | None = None) -> int:
    """L: a PAPA model's ``papa_max_length``, else ``max_length``, else the task's App. B sequence length
    (capped at the model's ``max_position_embeddings``)."""
    papa = getattr(model.config, "papa_max_length", None)
    if papa is not None:
        if max_length is not None and max_length != papa:
            raise ValueError(
                f"max_length={max_length} differs from the PAPA model's papa_max_length={papa}: its constant "
                f"matrices have {papa} slots; leave max_length out or pass {papa}"
            )
        return int(papa)
    if max_length is not None:
        return int(max_length)
    limit = getattr(model.config, "max_position_embeddings", None)
    return int(min(task.max_length, limit)) if isinstance(limit, int) and limit > 0 else task.max_length


def probe(
    model: nn.Module,
    tokenizer,
    task: str | Task,
    data_dir=None,
    seed: int = 0,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    max_length: int | None = None,
    device=None,
    progress: bool = True,
    cache_gb: float = DEFAULT_CACHE_GB,
    reuse: FeatureCache | None = None,
) -> dict:
    """Train the task's probe on the frozen ``model`` and score it on the task's eval split.

    Args:
        model: a transformers encoder (any head; its ``base_model`` is probed). For ``mlm``, a model with a
            masked-LM head, scored with that head and no training.
        tokenizer: its tokenizer.
        task: a registered task name (``tasks.TASKS``) or a :class:`Task`.
        data_dir: a local folder laid out like ``../shared/data``; ``None`` reads the Hub dataset.
        seed: seeds the probe's initialisation, batch order and dropout (and MLM masking).
        max_train_examples, max_eval_examples: keep only the first examples of a split.
        epochs, batch_size, lr, max_length: override the App. B defaults of the task.
        device: where to run; default: where the model's parameters are (the model is moved if given).
        progress: tqdm bars (features, each epoch).
        cache_gb: memory budget for cached hidden states; beyond it the backbone runs every batch.
        reuse: a :class:`FeatureCache` shared by calls on the same, unchanged model (e.g. a sweep's seeds):
            the tokenisation and hidden states of each split are then computed once.

    Returns:
        ``{"task", "metric", "score", "examples", "eval_examples", "steps", "seconds", "seed", "epochs",
        "lr", "batch_size", "max_length", "data", "cached"}`` (+ ``"perplexity"`` for mlm, ``"note"``).

    Raises:
        ValueError: unknown task, missing local split/column, a label outside the task's label set, an
            input that does not fit a PAPA model's slots, or ``mlm`` on a model without an MLM head.
    """
    task = get_task(task)
    start = time.perf_counter()
    progress = progress and dist_info()[0] == 0
    length = slot_count(model, task, max_length)
    if device is not None:
        model.to(device)
    device = torch.device(device) if device is not None else next(model.parameters()).device
    if task.kind == MLM:
        require_mlm_head(model, tokenizer)
    sep_id, pad_id = token_ids(model, tokenizer)
    epochs = task.epochs if epochs is None else epochs
    batch_size = batch_size or task.batch_size
    lr = lr or task.lr

    result = {
        "task": task.name,
        "metric": task.metric,
        "seed": seed,
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "max_length": length,
    }
    eval_split = load_split(task, "eval", data_dir, max_eval_examples)
    train_split = None if task.kind == MLM else load_split(task, "train", data_dir, max_train_examples)
    was_training = model.training
    try:
        if task.kind == MLM:
            enc = encode_split(tokenizer, eval_split.texts, None, "sentence", False, length, sep_id)
            total, count = masked_nll(model, tokenizer, enc, seed, max(batch_size, 8), device, progress)
            result.update(
                score=neg_log_perplexity(total, count),
                perplexity=perplexity(total, count),
                examples=0,
                eval_examples=len(eval_split),
                masked_tokens=count,
                steps=0,
                data=eval_split.source,
                cached=False,
            )
            return _finish(result, task, start)
        stores = []
        for name, split in (("train", train_split), ("eval", eval_split)):
            key = (task.name, name, split.source, length, sep_id)
            store = reuse.get(model, key) if reuse is not None else None
            if store is None:
                enc = encode_split(tokenizer, split.texts, split.labels, task.kind, task.pairs, length, sep_id)
                store = FeatureStore(
                    model, enc, pad_id, device, cache_gb * 2**30, progress=progress, desc=f"{name} features"
                )
                if reuse is not None:
                    reuse.put(model, key, store)
            stores.append(store)
        train_store, eval_store = stores
        backbone = backbone_of(model)
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(seed)
            layers, hidden = backbone.config.num_hidden_layers + 1, backbone.config.hidden_size
            head = build_head(task.kind, layers, hidden, length, task.num_labels)
            steps = train_head(
                head,
                train_store,
                train_store.enc.labels,
                task.kind,
                lr=lr,
                batch_size=batch_size,
                epochs=epochs,
                seed=seed,
                progress=progress,
            )
        golds, preds = predict(head, eval_store, eval_store.enc.labels, task.kind)
    finally:
        model.train(was_training)
    warning = degenerate_message(f"the probe (seed {seed})", task, golds, preds)
    if warning:
        logger.warning("%s", warning)
    result.update(
        score=score(task.metric, golds, preds, task.label_names),
        predicted_classes=predicted_classes(preds),
        examples=len(train_split),
        eval_examples=len(eval_split),
        steps=steps,
        data=f"train={train_split.source} eval={eval_split.source}",
        cached=train_store.cached and eval_store.cached,
    )
    return _finish(result, task, start)


def _finish(result: dict, task: Task, start: float) -> dict:
    result["seconds"] = round(time.perf_counter() - start, 3)
    if task.note:
        result["note"] = task.note
    return result
