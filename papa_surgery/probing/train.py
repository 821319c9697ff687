"""Train a probe on cached backbone features and score it on the eval split.

Batches are bucketed by length (shuffle, sort within chunks of 50 batches, shuffle the batch order);
everything random (head initialisation, batch order, dropout) comes from ``seed`` inside a forked RNG,
so a run is reproducible and leaves the caller's global RNG state untouched.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from tqdm.auto import tqdm

from .features import IGNORE, FeatureStore, length_batches

BUCKET = 50  # batches per sorting chunk


def epoch_batches(lengths: Sequence[int], batch_size: int, generator: torch.Generator) -> list[list[int]]:
    """One epoch's batches: a random permutation, sorted by length within chunks, batch order shuffled."""
    perm = torch.randperm(len(lengths), generator=generator).tolist()
    chunk = batch_size * BUCKET
    batches = []
    for start in range(0, len(perm), chunk):
        part = sorted(perm[start : start + chunk], key=lambda i: lengths[i])
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    order = torch.randperm(len(batches), generator=generator).tolist()
    return [batches[i] for i in order]


def batch_labels(labels: Sequence, index: Sequence[int], width: int, kind: str) -> torch.Tensor:
    """(B,) class labels, or (B, N) token labels padded with -100."""
    if kind != "token":
        return torch.tensor([labels[i] for i in index], dtype=torch.long)
    out = torch.full((len(index), width), IGNORE, dtype=torch.long)
    for r, i in enumerate(index):
        out[r, : len(labels[i])] = labels[i]
    return out


def fit(
    head: nn.Module,
    features: Callable[[list[int]], tuple[torch.Tensor, torch.Tensor]],
    lengths: Sequence[int],
    labels: Sequence,
    kind: str,
    optimizer: torch.optim.Optimizer,
    *,
    batch_size: int,
    steps: int,
    seed: int,
    progress: bool = True,
    desc: str = "probe",
    on_step: Callable[[int], None] | None = None,
) -> tuple[int, float | None]:
    """The probe's training loop: cross-entropy steps over length-bucketed epochs until ``steps``.

    Shared by the probe (``features`` reads cached hidden states) and the lambda ranking (``features`` runs
    the mixed backbone with gradients flowing to the lambdas, which ``optimizer`` also holds).

    Args:
        head: the probe head, trained in place (left in eval mode).
        features: example indices -> ((B, N, Ly, H) hidden states of every layer, (B, N) slots).
        lengths: token count of every training example (for bucketing).
        labels: per-example class labels or token label lists.
        kind: ``sentence`` or ``token``.
        optimizer: steps every parameter that learns.
        batch_size: examples per step.
        steps: optimiser steps; epochs restart with a new batch order until they are done.
        seed: the batch order's seed.
        progress: a tqdm bar over the steps.
        desc: the bar's label.
        on_step: called with the number of steps done after each optimiser step (the lambda ranking records
            its lambdas' path with it).

    Returns:
        (steps done, the last recorded loss or ``None`` when no step ran).
    """
    if steps < 0:
        raise ValueError(f"steps must be >= 0, got {steps}")
    head.train()
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE)
    generator = torch.Generator().manual_seed(seed)
    bar = tqdm(total=steps, desc=desc, disable=not progress, unit="step", leave=False)
    done, loss_value = 0, None
    while done < steps:
        for index in epoch_batches(lengths, batch_size, generator):
            if done >= steps:
                break
            feats, slots = features(index)  # (B, N, Ly, H), (B, N)
            target = batch_labels(labels, index, slots.shape[1], kind).to(feats.device)
            logits = head(feats, slots)  # (B, C) or (B, N, C)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            done += 1
            bar.update(1)
            if on_step is not None:
                on_step(done)
            if done % 10 == 0 or done == steps:
                loss_value = float(loss.item())
                bar.set_postfix(loss=f"{loss_value:.4f}")
    bar.close()
    head.eval()
    return done, loss_value


def train_head(
    head: nn.Module,
    store: FeatureStore,
    labels: Sequence,
    kind: str,
    *,
    lr: float,
    batch_size: int,
    epochs: int,
    seed: int,
    progress: bool = True,
) -> int:
    """AdamW on cross-entropy over ``epochs`` of cached features; returns the number of optimiser steps."""
    head.to(store.device)
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr)
    steps = epochs * -(-len(store.enc) // batch_size)
    done, _ = fit(
        head, store.batch, store.enc.lengths, labels, kind, optimizer,
        batch_size=batch_size, steps=steps, seed=seed, progress=progress,
    )  # fmt: skip
    return done


@torch.no_grad()
def predict(
    head: nn.Module, store: FeatureStore, labels: Sequence, kind: str, batch_size: int = 64, progress: bool = False
) -> tuple[list, list]:
    """(gold, predicted) in example order: ints for sentence tasks, per-sentence lists of the labelled words."""
    head.eval()
    n = len(store.enc)
    golds: list = [None] * n
    preds: list = [None] * n
    for index in tqdm(length_batches(store.enc.lengths, batch_size), desc="eval", disable=not progress, leave=False):
        feats, slots = store.batch(index)
        logits = head(feats, slots).float().cpu()  # (B, C) or (B, N, C)
        for r, i in enumerate(index):
            if kind == "token":
                gold = labels[i]
                keep = gold != IGNORE
                golds[i] = gold[keep].tolist()
                preds[i] = logits[r, : len(gold)].argmax(-1)[keep].tolist()
            else:
                golds[i], preds[i] = labels[i], int(logits[r].argmax())
    return golds, preds
