"""Train a probe on cached backbone features and score it on the eval split.

Batches are bucketed by length (shuffle, sort within chunks of 50 batches, shuffle the batch order);
everything random (head initialisation, batch order, dropout) comes from ``seed`` inside a forked RNG,
so a run is reproducible and leaves the caller's global RNG state untouched.
"""

from __future__ import annotations

from collections.abc import Sequence

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
    """AdamW on cross-entropy over ``epochs``; returns the number of optimiser steps."""
    device = store.device
    head.to(device).train()
    optimizer = torch.optim.AdamW(head.parameters(), lr=lr)
    loss_fn = nn.CrossEntropyLoss(ignore_index=IGNORE)
    generator = torch.Generator().manual_seed(seed)
    lengths = store.enc.lengths
    steps = 0
    for epoch in range(epochs):
        batches = epoch_batches(lengths, batch_size, generator)
        bar = tqdm(batches, desc=f"epoch {epoch + 1}/{epochs}", disable=not progress, leave=False)
        for index in bar:
            feats, slots = store.batch(index)  # (B, N, Ly, H), (B, N)
            target = batch_labels(labels, index, slots.shape[1], kind).to(device)
            logits = head(feats, slots)  # (B, C) or (B, N, C)
            loss = loss_fn(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            steps += 1
            if steps % 20 == 0:
                bar.set_postfix(loss=f"{loss.item():.4f}")
    head.eval()
    return steps


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
