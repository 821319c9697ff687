"""The learned lambda ranking (paper section 3.2).

Every head h of every layer gets ``lambda_h = sigmoid(p_h)`` with ``p_h = 0`` (lambda = 0.5) and attends
with ``B = lambda_h * A + (1 - lambda_h) * rownorm(C * mask)``. The lambdas are trained jointly with the
task's probe (``papa_surgery.probe``) while the backbone stays frozen; heads are then ranked globally by
ascending lambda: the least input-dependent head is made constant first.

The mixing is the PAPA attention of ``hub_code`` with every head in both sets (kept *and* constant,
``papa_lambda_mixing``): the attention function mixes the two contexts per head, which equals attending
with ``B`` because both are linear in the attention matrix. The mixed model is built like any PAPA model
(``convert.build_papa_model``): there is no second implementation of the attention swap.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from .. import __version__
from ..calibration.constants import Constants
from ..conversion.surgery import build_papa_model, papa_config, separator_id
from ..failures import spell
from ..hub_code.modeling_papa import attention_modules
from ..models.families import num_heads_layers
from ..models.loading import public_name
from ..probing.features import encode_split, pad_batch, token_ids
from ..probing.heads import build_head
from ..probing.train import fit
from ..tasks.data import load_split
from ..tasks.registry import MLM, Task, get_task
from .order import Ranking, order_by_scores


def lambda_model(model: nn.Module, constants: Constants, tokenizer=None) -> nn.Module:
    """A frozen copy of ``model``'s encoder whose every head mixes its attention with its constant matrix.

    Args:
        model: a source model of a supported family, any head (its ``base_model`` is copied; the source is
            never changed).
        constants: ``Constants`` for every layer and head of this model (``values`` (layers, heads, L, L)).
        tokenizer: the source tokenizer; its separator id lets the slot layout find a pair's middle.

    Returns:
        The mixed encoder, in eval mode. Every backbone parameter has ``requires_grad=False``; each PAPA
        attention module holds ``papa_lambda_logits`` (H,) zeros (lambda = 0.5, the only trainable
        parameters) and ``papa_constants`` (H, L, L), a frozen buffer.
    """
    num_heads, num_layers = num_heads_layers(model.config)
    constants.check_compatible(model.config)
    source = getattr(model, "base_model", model)
    every = [[layer, head] for layer in range(num_layers) for head in range(num_heads)]
    config = papa_config(
        source.config,
        papa_max_length=int(constants.max_length),
        papa_constant_heads=every,
        papa_lambda_mixing=True,
        papa_sep_token_id=separator_id(tokenizer, source.config),
        papa_kind=constants.kind,
        papa_method="lambda",
        papa_calibrated_on="pairs" if constants.pairs else "single",
        papa_surgery_version=__version__,
    )
    values = {layer: constants.values[layer].float() for layer in range(num_layers)}  # (H, L, L) each
    mixed = build_papa_model(source, config, values, unused=("pooler.",))  # the probe reads hidden states only
    for name, param in mixed.named_parameters():
        param.requires_grad_(name.endswith("papa_lambda_logits"))
    return mixed.eval()


def lambda_parameters(mixed: nn.Module) -> list[nn.Parameter]:
    """The lambda logits of every layer, in layer order."""
    params = [m.papa_lambda_logits for m in attention_modules(mixed)]
    if any(p is None for p in params):
        raise ValueError("not a lambda model: build it with papa_surgery.lambda_rank.lambda_model")
    return params


def lambda_values(mixed: nn.Module) -> torch.Tensor:
    """(layers, heads) lambda = sigmoid(logits), float32 on the CPU."""
    return torch.stack([torch.sigmoid(p.detach().float().cpu()) for p in lambda_parameters(mixed)])


def set_lambda_logits(mixed: nn.Module, value: float | torch.Tensor) -> None:
    """Set every lambda logit (a number, or a (layers, heads) tensor)."""
    with torch.no_grad():
        for layer, param in enumerate(lambda_parameters(mixed)):
            param.copy_(value[layer] if isinstance(value, torch.Tensor) else torch.full_like(param, float(value)))


@dataclass(frozen=True)
class LambdaOptions:
    """How the lambdas are trained (:func:`fit_lambdas`, :func:`train_lambdas`); ``None`` means the task's default.

    Attributes:
        steps: stop after this many optimiser steps (default: ``epochs`` full epochs).
        epochs: passes over the train split (default: the task's App. B epochs); ignored when ``steps`` is set.
        lr: the probe's learning rate (default: the task's).
        lambda_lr: the lambdas' learning rate (default: ``lr``, as the paper trains both together).
        batch_size: examples per step (default: the task's).
        seed: seeds the probe's initialisation, dropout and batch order (global RNG state is left untouched).
        max_train_examples: keep only the first examples of the train split.
        device: where to train (default: where the model is).
        progress: a tqdm bar over training steps.
    """

    steps: int | None = None
    epochs: int | None = None
    lr: float | None = None
    lambda_lr: float | None = None
    batch_size: int | None = None
    seed: int = 0
    max_train_examples: int | None = None
    device: str | torch.device | None = None
    progress: bool = True

    @classmethod
    def of(cls, options: LambdaOptions | None = None, **overrides) -> LambdaOptions:
        """``options`` (default: all defaults) with ``overrides`` replaced; TypeError on an unknown name."""
        return replace(options or cls(), **overrides)

    def resolved(self, task: Task) -> LambdaOptions:
        """The task's App. B defaults filled in for ``lr``, ``lambda_lr`` and ``batch_size``."""
        lr = self.lr or task.lr
        return replace(self, lr=lr, lambda_lr=self.lambda_lr or lr, batch_size=self.batch_size or task.batch_size)


@dataclass
class LambdaFit:
    """What :func:`fit_lambdas` did: the trained probe head and the run's facts."""

    head: nn.Module
    steps: int
    epochs: float
    examples: int
    data: str
    loss: float | None


def _features(mixed: nn.Module, batch: dict[str, torch.Tensor], device) -> torch.Tensor:
    """(B, N, Ly, H) hidden states of every layer, with gradients flowing to the lambdas."""
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    out = mixed(**inputs, output_hidden_states=True, return_dict=True)
    return torch.stack(out.hidden_states, dim=2).float()  # (B, N, Ly, H)


def fit_lambdas(
    mixed: nn.Module,
    tokenizer,
    task: str | Task,
    data_dir: str | Path | None = None,
    options: LambdaOptions | None = None,
    on_step=None,
    **overrides,
) -> LambdaFit:
    """Train ``mixed``'s lambdas (in place) jointly with a fresh probe on the task's train split.

    Only the lambda logits and the probe get gradients: the backbone runs in eval mode with
    ``requires_grad=False`` (no dropout), the constants are buffers. The backbone runs every step (lambda
    changes the attention, so no feature cache); the loop is the probe's (:func:`papa_surgery.probe.train.fit`).

    Args:
        mixed: a model from :func:`lambda_model`.
        tokenizer: the source tokenizer.
        task: a registered probe task (sentence or token kind) or a :class:`Task`.
        data_dir: a local folder laid out like ``../shared/data``; ``None`` reads the Hub dataset.
        options: a :class:`LambdaOptions`; ``overrides`` replace single fields (``steps=10``).
        on_step: called with the number of steps done after each step (e.g. to record the lambdas' path).
    """
    task = get_task(task)
    if task.kind == MLM:
        raise ValueError("the lambda ranking needs a labelled task (sentence or token kind), not 'mlm'")
    opts = LambdaOptions.of(options, **overrides).resolved(task)
    params = lambda_parameters(mixed)
    length = int(mixed.config.papa_max_length)
    if opts.device is not None:
        mixed.to(opts.device)
    device = params[0].device
    split = load_split(task, "train", data_dir, opts.max_train_examples)
    calibrated_pairs = mixed.config.papa_calibrated_on == "pairs"
    if task.kind != "token" and calibrated_pairs != task.pairs:
        warnings.warn(
            f"task {task.name!r} has {'pairs' if task.pairs else 'single sentences'} but the constants were "
            f"calibrated on {'pairs' if calibrated_pairs else 'single sentences'}; calibrate with"
            f"{'' if task.pairs else 'out'} {spell('pairs', True)} for a faithful ranking",
            stacklevel=2,
        )
    sep_id, pad_id = token_ids(mixed, tokenizer)
    enc = encode_split(tokenizer, split.texts, split.labels, task.kind, task.pairs, length, sep_id)
    per_epoch = math.ceil(len(enc) / opts.batch_size)
    steps = per_epoch * (task.epochs if opts.epochs is None else opts.epochs) if opts.steps is None else opts.steps

    mixed.eval()  # frozen backbone: no dropout; only the probe head trains
    for param in mixed.parameters():
        param.requires_grad_(False)
    for param in params:
        param.requires_grad_(True)
    cfg = mixed.config
    layers, hidden = cfg.num_hidden_layers + 1, cfg.hidden_size

    def features(index: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        batch = pad_batch(enc, index, pad_id)
        return _features(mixed, batch, device), batch["slots"].to(device)  # (B, N, Ly, H), (B, N)

    try:
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            torch.manual_seed(opts.seed)
            head = build_head(task.kind, layers, hidden, length, task.num_labels).to(device)
            optimizer = torch.optim.AdamW(
                [{"params": head.parameters()}, {"params": params, "lr": opts.lambda_lr, "weight_decay": 0.0}],
                lr=opts.lr,
            )
            done, loss_value = fit(
                head, features, enc.lengths, enc.labels, task.kind, optimizer,
                batch_size=opts.batch_size, steps=steps, seed=opts.seed, progress=opts.progress,
                desc=f"lambda ({task.name})", on_step=on_step,
            )  # fmt: skip
    finally:
        for param in params:
            param.requires_grad_(False)
    return LambdaFit(head, done, round(done / max(per_epoch, 1), 4), len(enc), split.source, loss_value)


def train_lambdas(
    model: nn.Module,
    tokenizer,
    constants: Constants,
    task: str | Task,
    data_dir: str | Path | None = None,
    options: LambdaOptions | None = None,
    *,
    source_name: str | None = None,
    **overrides,
) -> Ranking:
    """The ``lambda`` ranking of ``model`` on ``task`` (paper section 3.2); the source is not changed.

    Trains lambdas with a probe (:func:`fit_lambdas`; ``options`` / ``overrides`` as there) and orders every
    head by ascending lambda (least input-dependent first), ties broken by (layer, head). ``Ranking.scores``
    holds the lambda of each head in that order; the provenance records task, data, seed, steps and the source.
    """
    task = get_task(task)
    opts = LambdaOptions.of(options, **overrides).resolved(task)
    mixed = lambda_model(model, constants, tokenizer)
    fit_result = fit_lambdas(mixed, tokenizer, task, data_dir, opts)
    lambdas = lambda_values(mixed)  # (layers, heads)
    order, scores = order_by_scores(lambdas.tolist(), ascending=True)
    num_heads, num_layers = num_heads_layers(model.config)
    provenance = {
        "task": task.name,
        "data": fit_result.data,
        "examples": fit_result.examples,
        "seed": opts.seed,
        "steps": fit_result.steps,
        "epochs": fit_result.epochs,
        "lr": opts.lr,
        "lambda_lr": opts.lambda_lr,
        "batch_size": opts.batch_size,
        "final_loss": fit_result.loss,
        "source_model": public_name(source_name or getattr(model.config, "_name_or_path", None)),
        "constants": {
            "kind": constants.kind,
            "max_length": constants.max_length,
            "pairs": constants.pairs,
            "corpus": constants.metadata.get("corpus"),
        },
        "papa_surgery_version": __version__,
    }
    return Ranking("lambda", order, num_layers, num_heads, scores, provenance)
