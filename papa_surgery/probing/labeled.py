"""Labeled constants (paper Table 1, rows 4-5): constant matrices trained jointly with the probe on the task.

``labeled-average`` starts from the calibrated average, ``labeled-toeplitz`` from the harmonic Toeplitz
matrices. Every head of the cell's fraction is constant (as for the other kinds); the backbone stays frozen and
only the constant matrices and the probe get gradients. The matrices are masked and row-normalised at use
exactly as frozen ones (the paper's footnote 14; negative entries count as zero). Feature caching cannot apply
while training (the constants change the hidden states), so the backbone runs every step with gradients flowing
only into the constants; the eval split is then encoded once with the trained matrices.

The training loop is the probe's (``probe.train.fit``), as for the lambda ranking.
"""

from __future__ import annotations

import time

import torch

from ..hub_code.modeling_papa import attention_modules
from ..tasks.data import load_split
from ..tasks.metrics import score
from ..tasks.registry import MLM, get_task
from .features import FeatureStore, backbone_of, encode_split, pad_batch, token_ids
from .heads import build_head
from .train import fit, predict


def constant_parameters(model) -> list[torch.nn.Parameter]:
    """The trainable ``papa_constants`` of a model converted with ``trainable_constants=True``."""
    params = [
        m.papa_constants
        for m in attention_modules(model)
        if isinstance(getattr(m, "papa_constants", None), torch.nn.Parameter)
    ]
    if not params:
        raise ValueError("labeled constants need a model converted with trainable_constants=True and constant heads")
    return params


def labeled_probe(
    model,
    tokenizer,
    task,
    data_dir=None,
    seed: int = 0,
    max_train_examples: int | None = None,
    max_eval_examples: int | None = None,
    epochs: int | None = None,
    batch_size: int | None = None,
    lr: float | None = None,
    device=None,
    progress: bool = True,
    cache_gb: float = 4.0,
) -> dict:
    """Train ``model``'s constants (in place) jointly with a fresh probe on the task; score on its eval split.

    Args:
        model: a PAPA model converted with ``trainable_constants=True`` (its constants are trained in place).
        Others: as :func:`papa_surgery.probing.run.probe` (App. B defaults; the constants share the probe's lr).

    Returns:
        The probe's result fields (``metric``, ``score``, ``examples``, ``eval_examples``, ``steps``,
        ``seconds``, ``data``, ``cached`` = False).
    """
    task = get_task(task)
    if task.kind == MLM:
        raise ValueError("labeled constants are trained with a labelled task's probe, not 'mlm'")
    start = time.perf_counter()
    if device is not None:
        model.to(device)
    device = next(model.parameters()).device
    length = int(model.config.papa_max_length)
    sep_id, pad_id = token_ids(model, tokenizer)
    epochs = task.epochs if epochs is None else epochs
    batch_size = batch_size or task.batch_size
    lr = lr or task.lr
    train = load_split(task, "train", data_dir, max_train_examples)
    evaluation = load_split(task, "eval", data_dir, max_eval_examples)
    enc = encode_split(tokenizer, train.texts, train.labels, task.kind, task.pairs, length, sep_id)

    backbone = backbone_of(model)  # eval mode: no dropout
    for param in model.parameters():
        param.requires_grad_(False)
    constants = constant_parameters(model)
    for param in constants:
        param.requires_grad_(True)

    def features(index):
        padded = pad_batch(enc, index, pad_id)
        inputs = {k: padded[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in padded}
        out = backbone(**inputs, output_hidden_states=True, return_dict=True)
        return torch.stack(out.hidden_states, dim=2).float(), padded["slots"].to(device)  # (B, N, Ly, H), (B, N)

    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(seed)
        config = backbone.config
        head = build_head(task.kind, config.num_hidden_layers + 1, config.hidden_size, length, task.num_labels).to(
            device
        )
        optimizer = torch.optim.AdamW([*head.parameters(), *constants], lr=lr)
        steps = epochs * -(-len(enc) // batch_size)
        done, _ = fit(
            head, features, enc.lengths, enc.labels, task.kind, optimizer,
            batch_size=batch_size, steps=steps, seed=seed, progress=progress, desc="labeled probe",
        )  # fmt: skip
    with torch.no_grad():
        for param in constants:
            param.clamp_(min=0)  # what the attention used (negative entries count as zero), stored non-negative
            param.requires_grad_(False)
    eval_enc = encode_split(tokenizer, evaluation.texts, evaluation.labels, task.kind, task.pairs, length, sep_id)
    store = FeatureStore(model, eval_enc, pad_id, device, cache_gb * 2**30, progress=progress, desc="eval features")
    golds, preds = predict(head, store, eval_enc.labels, task.kind)
    return {
        "metric": task.metric,
        "score": score(task.metric, golds, preds, task.label_names),
        "examples": len(train),
        "eval_examples": len(evaluation),
        "steps": done,
        "seconds": round(time.perf_counter() - start, 3),
        "data": f"train={train.source} eval={evaluation.source}",
        "cached": False,
    }
