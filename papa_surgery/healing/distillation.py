"""Distilled constants: label-free attention transfer from the source to its converted model.

Averaging (paper 3.1) is a lower bound on the best constant matrices (the paper's Limitations). ``distill``
starts from given constants (the average) and, with every backbone weight frozen, optimises the matrices of
the heads being made constant so that the converted model's hidden states match the source's on the
unlabelled calibration corpus:

- ``objective="layers"`` (default): the mean over layers of each layer's hidden-state error, relative to the
  source's variance there. Every layer gets a direct signal, so early layers' constants are not left to the
  gradient that survives the layers above them, and the last layer (what users read) is one of the terms;
- ``objective="last"``: the last hidden states only (end to end).

Constants stay non-negative (they are optimised as ``exp(theta)``, theta initialised at ``log C``) and are masked
and row-normalised at use exactly as averaged ones (the same PAPA attention runs them). Deterministic for a seed
(fixed batch order, eval mode, no dropout); under ``torch.distributed`` each process takes every
world_size-th batch, the loss is normalised over all processes' tokens and gradients are summed: a step of
two processes with ``batch_size`` each is a step of one process with twice that batch.
"""

from __future__ import annotations

import itertools
import math

import torch
from torch import nn
from tqdm.auto import tqdm

from ..calibration.constants import Constants
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow, process_batches
from ..conversion.surgery import convert, normalize_heads
from ..hub_code.modeling_papa import attention_modules, heads_by_layer

OBJECTIVES = ("layers", "last")
FLOOR = 1e-8  # exp(theta) never reaches an exact zero; cells below this start at it


def _hidden(model, inputs) -> tuple[torch.Tensor, ...]:
    return model(**inputs, output_hidden_states=True).hidden_states  # (layers + 1) x (B, N, D)


def hidden_error(outputs, targets, mask: torch.Tensor, objective: str, across_processes: bool = False) -> torch.Tensor:
    """The distillation loss: mean squared hidden-state error over real tokens, relative to the targets' variance.

    With ``across_processes`` (under ``torch.distributed``) the token count and the targets' variance are those
    of every process's batch together, and the value returned is this process's share: the shares add up to the
    loss of the whole global batch, so summed gradients equal one process's on that batch.
    """
    pairs = list(zip(outputs[1:], targets[1:], strict=True)) if objective == "layers" else [(outputs[-1], targets[-1])]
    real = mask.bool()  # (B, N)
    errors, stats = [], []
    for out, target in pairs:
        kept = target[real]  # (tokens, D)
        errors.append((out[real] - kept).pow(2).sum())
        kept = kept.double()
        stats.append(torch.stack([kept.new_tensor(kept.numel()), kept.sum(), kept.pow(2).sum()]))
    stats = torch.stack(stats)  # (terms, 3): values, their sum, their sum of squares
    if across_processes and _distributed():
        torch.distributed.all_reduce(stats)
    count, total, squares = stats.unbind(-1)
    variance = (squares / count - (total / count) ** 2).clamp_min(1e-12)
    return (torch.stack(errors) / (count * variance).to(errors[0].dtype)).mean()


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def distill(
    model,
    tokenizer,
    corpus,
    constants: Constants,
    heads,
    *,
    steps: int = 200,
    lr: float = 0.01,
    batch_size: int = 16,
    objective: str = "layers",
    seed: int = 0,
    max_examples: int | None = None,
    device=None,
    progress: bool = True,
) -> Constants:
    """Constants whose ``heads`` are trained to reproduce the source's hidden states (module docstring).

    Args:
        model: the source model (never changed: it runs frozen as the teacher).
        tokenizer: its tokenizer.
        corpus: the unlabelled corpus (anything :func:`papa_surgery.corpus.load_corpus` accepts), usually the
            calibration corpus.
        constants: the starting matrices (usually ``average`` from :func:`papa_surgery.calibrate.calibrate`).
        heads: ``[[layer, head], ...]`` that will be constant (e.g. ``ranking.select(fraction)``); the other
            heads keep their attention while training and their matrices are returned unchanged.
        steps: optimisation steps (the step budget); one batch per step, cycling over the corpus.
        lr: Adam learning rate on ``theta = log C``.
        batch_size: examples per step (per process).
        objective: ``"layers"`` or ``"last"``.
        seed: the seed (order is fixed; the seed makes the run reproducible where randomness enters).
        max_examples: use at most this many examples of the corpus.
        device: where to train (default: the model's device).
        progress: show a progress bar.

    Returns:
        ``Constants`` of kind ``distilled``, with the counts and variance of ``constants`` and the run's settings
        and loss before/after in ``metadata["distilled"]``.
    """
    if objective not in OBJECTIVES:
        raise ValueError(f"unknown distillation objective {objective!r}; choose one of {', '.join(OBJECTIVES)}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    corpus = load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
    layers, num_heads = constants.num_layers, constants.num_heads
    heads = normalize_heads(heads, layers, num_heads)
    if not heads:
        return constants
    torch.manual_seed(seed)
    device, restore = borrow(model, device)
    try:
        student = convert(model, constants, heads, tokenizer=tokenizer, trainable_constants=True, storage="dense")
        student.to(device).eval()
        for p in student.parameters():
            p.requires_grad_(False)
        thetas = _log_constants(student)
        optimizer = torch.optim.Adam(thetas.values(), lr=lr)
        losses = []
        bar = tqdm(range(steps), desc="distill", unit="step", disable=not progress)
        batches = _cycle(corpus, batch_size)
        for _ in bar:
            enc = encode(tokenizer, next(batches), constants.max_length, pairs=constants.pairs).to(device)
            inputs = model_inputs(model, enc)
            with torch.no_grad():
                targets = _hidden(model, inputs)
            _set_constants(student, thetas)
            loss = hidden_error(_hidden(student, inputs), targets, enc["attention_mask"], objective, True)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            losses.append(_sum_over_processes(thetas.values(), loss.detach()))
            optimizer.step()
            bar.set_postfix(loss=f"{losses[-1]:.4f}")
    finally:
        restore()
    values = constants.values.clone()
    for layer, hs in heads_by_layer(heads).items():
        values[layer, sorted(hs)] = thetas[layer].detach().exp().float().cpu()
    window = max(1, min(10, steps // 5))
    metadata = {
        **constants.metadata,
        "distilled": {
            "from_kind": constants.kind,
            "heads": heads,
            "steps": steps,
            "lr": lr,
            "batch_size": batch_size,
            "objective": objective,
            "seed": seed,
            "corpus": corpus.description,
            "loss_first_steps": sum(losses[:window]) / window,
            "loss_last_steps": sum(losses[-window:]) / window,
        },
    }
    c = constants
    out = Constants(values, "distilled", c.max_length, c.pairs, c.counts, c.variance, metadata)
    out._coverage_warned = getattr(c, "_coverage_warned", False)  # the same corpus: warn once
    return out


def _log_constants(student) -> dict[int, nn.Parameter]:
    """``theta = log C`` per layer with constant heads; the module's own constants stop being a parameter."""
    thetas = {}
    for layer, module in enumerate(attention_modules(student)):
        data = getattr(module, "papa_constants", None)
        if data is None:
            continue
        thetas[layer] = nn.Parameter(data.detach().float().clamp_min(FLOOR).log())  # (Hc, L, L)
        del module.papa_constants  # re-set as exp(theta) before each forward, a plain tensor attribute
    return thetas


def _set_constants(student, thetas: dict[int, nn.Parameter]) -> None:
    modules = attention_modules(student)
    for layer, theta in thetas.items():
        modules[layer].papa_constants = theta.exp()  # (Hc, L, L), non-negative by construction


def _cycle(corpus, batch_size: int):
    """Batches of this process's shard, over and over, in a fixed order."""
    for epoch in itertools.count():
        bar, _ = process_batches(corpus, batch_size, f"epoch {epoch}", progress=False)
        empty = True
        for batch in bar:
            empty = False
            yield batch
        if empty:
            raise ValueError(f"the corpus {corpus.description} gave no examples to distil on")


def _sum_over_processes(params, loss: torch.Tensor) -> float:
    """Add up every process's gradient and loss share (each process then takes the same step); the loss."""
    if _distributed():
        for p in params:
            if p.grad is None:  # every process must join every all_reduce, in the same order
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        torch.distributed.all_reduce(loss)
    return float(loss)


def distillation_loss(model, tokenizer, corpus, constants: Constants, heads, objective="layers", batch_size=16):
    """The objective of :func:`distill` averaged over one pass of ``corpus`` (for comparing constants)."""
    corpus = load_corpus(corpus, pairs=constants.pairs)
    papa = convert(model, constants, heads, tokenizer=tokenizer, storage="dense")
    total, count = 0.0, 0
    with torch.no_grad():
        bar, _ = process_batches(corpus, batch_size, "loss", progress=False)
        for batch in bar:
            enc = encode(tokenizer, batch, constants.max_length, pairs=constants.pairs)
            inputs = model_inputs(model, enc)
            loss = hidden_error(_hidden(papa, inputs), _hidden(model, inputs), enc["attention_mask"], objective)
            total, count = total + float(loss) * len(batch), count + len(batch)
    return total / max(count, 1) if count else math.nan
