"""The healing training loop: a fixed step budget over the training examples, the teacher's outputs as targets.

Batches are grouped by length, as ``transformers.Trainer``'s ``group_by_length`` does: each run of ``GROUPED``
global batches of a seeded permutation per epoch is sorted by token count and cut into batches, which are taken in a
seeded order. A batch is padded to its longest example, so similar lengths cut the padded tokens both models compute
on (on the bundled WikiText-2 excerpt at L=128: about 80 per example in random batches, 35 grouped).

Deterministic for a seed: step ``s`` reads a fixed global batch (``G`` = batch size x processes examples, fixed by
the seed, the epoch and the examples' lengths), both models run in eval mode (no dropout), and nothing else draws
random numbers. So a run that stopped after step ``s`` and resumes from its saved state (:mod:`.state`) takes
exactly the steps an uninterrupted run takes.

AdamW (no weight decay) with two parameter groups (the constants' ``theta = log C`` and the other trained weights,
each with its own peak learning rate), a linear warm-up then cosine decay to zero, and the gradient's global norm
clipped at 1. Under ``torch.distributed`` each process takes its slice of the global batch, the loss is each
process's share of the global batch's (:mod:`.objective`) and gradients are summed: N processes with batch ``b``
take the steps of one process with batch ``N * b``.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from ..calibration.encoding import encode, model_inputs

logger = logging.getLogger("papa_surgery")
CLIP_NORM = 1.0


@dataclass(frozen=True)
class LoopSettings:
    """The loop's settings (resolved: no ``None``)."""

    steps: int
    batch_size: int
    lr: float  # peak learning rate of the trained weights (LoRA adapters or layer weights)
    constants_lr: float  # peak learning rate of the constants' theta
    warmup: float  # share of the steps spent warming up
    seed: int
    eval_every: int  # measure the held-out agreement every this many steps (0: never during the loop)
    decay: bool = True  # cosine decay after the warm-up (False: the peak rate throughout)


def lr_factor(step: int, settings: LoopSettings) -> float:
    """The learning-rate multiplier at ``step``: linear warm-up, then cosine decay toward zero at the last step."""
    warm = round(settings.warmup * settings.steps)
    if step < warm:
        return (step + 1) / warm
    if not settings.decay:
        return 1.0
    progress = (step - warm) / max(1, settings.steps - warm)
    return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))


GROUPED = 50  # global batches sorted by length together (transformers' LengthGroupedSampler takes 50 too)


def example_lengths(tokenizer, examples: list, max_length: int, pairs: bool) -> list[int]:
    """Each example's token count, truncated at ``max_length`` (what grouping by length sorts on)."""
    if pairs:
        firsts, seconds = [a for a, _ in examples], [b for _, b in examples]
        ids = tokenizer(firsts, seconds, truncation=True, max_length=max_length)["input_ids"]
    else:
        ids = tokenizer(list(examples), truncation=True, max_length=max_length)["input_ids"]
    return [len(i) for i in ids]


class GroupedBatches:
    """Which examples each step reads (module docstring), made once per run from the examples' token counts; each
    epoch's order is computed when a step first reaches it."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int):
        self.lengths, self.batch_size, self.seed = torch.tensor(lengths), batch_size, seed
        self._orders: dict[tuple[int, int], torch.Tensor] = {}

    def indices(self, step: int) -> list[int]:
        """This process's example indices at ``step``: its slice of the step's global batch."""
        from ..distributed import rank, world_size

        world, me = world_size(), rank()
        size = self.batch_size * world
        out = []
        for position in range(step * size + me * self.batch_size, step * size + (me + 1) * self.batch_size):
            epoch, offset = divmod(position, len(self.lengths))
            out.append(int(self._order(size, epoch)[offset]))
        return out

    def _order(self, size: int, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s example order: a seeded permutation whose runs of ``GROUPED`` global batches are sorted
        by length (longest first; ties in permutation order), cut into batches of ``size`` and those batches shuffled
        (seeded). A run's last, partial batch stays last so every other batch is full."""
        key = (size, epoch)
        if key not in self._orders:
            if len(self._orders) > 2:  # steps move forward, and a global batch spans at most two epochs
                self._orders.clear()
            generator = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            permutation = torch.randperm(len(self.lengths), generator=generator)
            parts = []
            for run in permutation.split(size * GROUPED):
                run = run[torch.sort(-self.lengths[run], stable=True).indices]
                batches = list(run.split(size))
                full = len(batches) - (len(batches[-1]) < size)
                order = torch.randperm(full, generator=generator).tolist() + list(range(full, len(batches)))
                parts += [batches[i] for i in order]
            self._orders[key] = torch.cat(parts)
        return self._orders[key]


def optimizer_for(trainable, settings: LoopSettings) -> tuple[torch.optim.Optimizer, torch.optim.lr_scheduler.LambdaLR]:
    groups = [{"params": trainable.constants, "lr": settings.constants_lr}]
    if trainable.weights:
        groups.append({"params": trainable.weights, "lr": settings.lr})
    groups = [g for g in groups if g["params"]]
    optimizer = torch.optim.AdamW(groups, weight_decay=0.0)
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_factor(step, settings))


def _sum_gradients(params, loss: torch.Tensor) -> float:
    """Add up every process's gradient and loss share (each process then takes the same step); the loss."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        for p in params:
            if p.grad is None:  # every process must join every all_reduce, in the same order
                p.grad = torch.zeros_like(p)
            torch.distributed.all_reduce(p.grad)
        torch.distributed.all_reduce(loss)
    return float(loss)


def train(
    trainable,
    teacher,
    tokenizer,
    examples: list,
    *,
    max_length: int,
    pairs: bool,
    objective,
    settings: LoopSettings,
    measure: Callable[[], dict] | None = None,
    state=None,
    progress: bool = True,
) -> dict:
    """Run the loop on ``trainable`` (:func:`.trainable.prepare`); the history.

    Args:
        trainable: the student and its parameter groups.
        teacher: the source model (frozen, eval mode).
        tokenizer, max_length, pairs: how examples are encoded.
        examples: the training examples.
        objective: the :class:`~.objective.Objective`.
        settings: steps, batch, learning rates, warm-up, seed, evaluation interval.
        measure: the held-out agreement of the student now (called every ``eval_every`` steps; the caller measures
            the model before and after).
        state: a :class:`~.state.HealState` to resume from and save to at every evaluation (``None``: none).
        progress: a bar with the loss and the time left.

    Returns:
        ``{"steps", "losses" (per step), "evaluations" [{"step", ...agreement}], "seconds", "resumed_from"}``.
    """
    from ..distributed import is_main_process

    optimizer, scheduler = optimizer_for(trainable, settings)
    params = [p for group in optimizer.param_groups for p in group["params"]]
    history = {"steps": settings.steps, "losses": [], "evaluations": [], "seconds": 0.0, "resumed_from": 0}
    if state is not None and state.restore(trainable, optimizer, scheduler, history):
        logger.info("resuming healing at step %d of %d from %s", history["resumed_from"], settings.steps, state.path)
    start, started = history["resumed_from"], time.perf_counter() - history["seconds"]
    show = progress and is_main_process()
    bar = tqdm(range(start, settings.steps), desc="heal", unit="step", disable=not show, initial=start,
               total=settings.steps)  # fmt: skip

    def evaluate(step: int) -> None:
        if measure is None:
            return
        result = {"step": step, **measure()}
        history["evaluations"].append(result)
        line = (
            f"step {step}/{settings.steps}: held-out loss {result['loss']:.4f}, token cosine "
            f"{result['token_cosine']:.4f}, sentence cosine {result['sentence_cosine']:.4f}"
        )
        if show:
            bar.write(line)
        elif is_main_process():
            logger.info(line)

    order = GroupedBatches(example_lengths(tokenizer, examples, max_length, pairs), settings.batch_size, settings.seed)
    for step in bar:
        batch = [examples[i] for i in order.indices(step)]
        enc = encode(tokenizer, batch, max_length, pairs=pairs)
        device = next(trainable.student.parameters()).device
        inputs = model_inputs(teacher, enc.to(device))
        with torch.no_grad():
            targets = teacher(**inputs, output_hidden_states=True).hidden_states
        outputs = trainable.model(**inputs, output_hidden_states=True).hidden_states
        loss, _ = objective(outputs, targets, inputs["attention_mask"], across_processes=True)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        history["losses"].append(_sum_gradients(params, loss.detach()))
        torch.nn.utils.clip_grad_norm_(params, CLIP_NORM)
        optimizer.step()
        scheduler.step()
        bar.set_postfix(loss=f"{max(history['losses'][-1], 0.0):.4f}")  # 1 - cos rounds a hair below 0 ("-0.0000")
        done = step + 1
        if done < settings.steps and settings.eval_every and done % settings.eval_every == 0:
            evaluate(done)
            history["seconds"] = time.perf_counter() - started
            if state is not None:
                state.save(trainable, optimizer, scheduler, history, done)
    history["seconds"] = time.perf_counter() - started
    return history
