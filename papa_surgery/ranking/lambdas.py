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
        constants: ``Constants`` or ``StructuredConstants`` for every layer and head of this model (mixed as dense
            (L, L) matrices: ``to_dense``).
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
    dense = constants.to_dense()  # lambda mixing trains with dense (L, L) matrices
    values = {layer: dense.values[layer].float() for layer in range(num_layers)}  # (H, L, L) each
    mixed = build_papa_model(source, config, values, unused=("pooler.",))  # the probe reads hidden states only
    for name, param in mixed.named_parameters():
        param.requires_grad_(name.endswith("papa_lambda_logits"))
    return mixed.eval()


def lambda_parameters(mixed: nn.Module) -> list[nn.Parameter]:
    """The lambda logits of every layer, in layer order."""
    params = [m.papa_lambda_logits for m in attention_modules(mixed)]
    if any(p is None for p in params):
        raise ValueError("not a lambda model: build it with papa_surgery.ranking.lambdas.lambda_model")
    return params


def lambda_values(mixed: nn.Module) -> torch.Tensor:
    """(layers, heads) lambda = sigmoid(logits), float32 on the CPU."""
    return torch.stack([torch.sigmoid(p.detach().float().cpu()) for p in lambda_parameters(mixed)])


def set_lambda_logits(mixed: nn.Module, value: float | torch.Tensor) -> None:
    """Set every lambda logit (a number, or a (layers, heads) tensor)."""
    with torch.no_grad():
        for layer, param in enumerate(lambda_parameters(mixed)):
            param.copy_(value[layer] if isinstance(value, torch.Tensor) else torch.full_like(param, float(value)))


# Defaults measured on all-MiniLM-L6-v2 and SST-2 (benchmarks/bench_lambda.py, README "The lambda ranking"): the
# paper trains the lambdas with the probe's App. B values (SST-2: lr 1e-4, 4 epochs of 67,349 sentences, 8,419
# steps); cut to a CPU budget, lr 1e-4 leaves every lambda within 0.5 +- 0.01. Adam moves a logit about lr a step
# whatever the gradient's size, so the order two seeds agree on depends on the steps, not on lr; 1e-2 moves the
# lambdas measurably (0.35-0.72 after 100 steps) without saturating them, and after 100 steps two seeds' orders
# agree (Spearman ~0.8) about as well as after 150.
DEFAULT_STEPS = 100
DEFAULT_LAMBDA_LR = 1e-2
DEFAULT_SEEDS = 2
NOISY_AGREEMENT = 0.5  # below this Spearman correlation between seeds the order is mostly noise


class LambdaNoiseWarning(UserWarning):
    """The learned lambdas' order is within its own noise: the seeds disagree about which heads come first."""


@dataclass(frozen=True)
class LambdaOptions:
    """How the lambdas are trained (:func:`fit_lambdas`, :func:`train_lambdas`); ``None`` means the default.

    Attributes:
        steps: optimiser steps per seed (default ``DEFAULT_STEPS``, 100; or ``epochs`` full epochs when given).
        epochs: passes over the train split instead of ``steps``.
        lr: the probe's learning rate (default: the task's App. B value).
        lambda_lr: the lambdas' learning rate (default ``DEFAULT_LAMBDA_LR``, 1e-2; the paper's is the probe's).
        batch_size: examples per step (default: the task's).
        seed: seeds the probe's initialisation, dropout and batch order (global RNG state is left untouched).
        seeds: how many times the lambdas are trained, with seeds ``seed``, ``seed + 1``...: the ranking orders
            heads by the mean lambda, and two or more measure how much of the order is noise (default 2).
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
    seeds: int = DEFAULT_SEEDS
    max_train_examples: int | None = None
    device: str | torch.device | None = None
    progress: bool = True

    @classmethod
    def of(cls, options: LambdaOptions | None = None, **overrides) -> LambdaOptions:
        """``options`` (default: all defaults) with ``overrides`` replaced; TypeError on an unknown name."""
        return replace(options or cls(), **overrides)

    def resolved(self, task: Task) -> LambdaOptions:
        """The defaults filled in: ``lr`` and ``batch_size`` the task's App. B values, ``lambda_lr`` 1e-2, and
        ``steps`` 100 unless ``epochs`` is given."""
        steps = self.steps if self.steps is not None or self.epochs is not None else DEFAULT_STEPS
        return replace(
            self,
            steps=steps,
            lr=self.lr or task.lr,
            lambda_lr=self.lambda_lr or DEFAULT_LAMBDA_LR,
            batch_size=self.batch_size or task.batch_size,
        )


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
    desc: str | None = None,
    **overrides,
) -> LambdaFit:
    """Train ``mixed``'s lambdas (in place) jointly with a fresh probe on the task's train split.

    Only the lambda logits and the probe get gradients: the backbone runs in eval mode with
    ``requires_grad=False`` (no dropout), the constants are buffers. The backbone runs every step (lambda
    changes the attention, so no feature cache); the loop is the probe's (:func:`papa_surgery.probing.train.fit`).

    Args:
        mixed: a model from :func:`lambda_model`.
        tokenizer: the source tokenizer.
        task: a registered probe task (sentence or token kind) or a :class:`Task`.
        data_dir: a local folder laid out like ``../shared/data``; ``None`` reads the Hub dataset.
        options: a :class:`LambdaOptions`; ``overrides`` replace single fields (``steps=10``).
        on_step: called with the number of steps done after each step (e.g. to record the lambdas' path).
        desc: the progress bar's label.
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
    steps = per_epoch * opts.epochs if opts.steps is None else opts.steps

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
                desc=desc or f"lambda ({task.name})", on_step=on_step,
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

    Trains lambdas with a probe (:func:`fit_lambdas`; ``options`` / ``overrides`` as there) once per seed
    (``seeds``: ``seed``, ``seed + 1``, ...) and orders every head by ascending mean lambda (least
    input-dependent first), ties broken by (layer, head). ``Ranking.scores`` holds the mean lambda of each head
    in that order; the provenance records task, data, seeds, steps, the source, each seed's lambdas and how well
    the seeds agree (``seed_agreement``: Spearman's correlation; ``spread``: the mean lambdas' standard
    deviation across heads; ``noise``: a head's lambda's standard deviation between seeds, averaged). A
    :class:`LambdaNoiseWarning` says when the seeds' orders mostly disagree.
    """
    task = get_task(task)
    opts = LambdaOptions.of(options, **overrides).resolved(task)
    if opts.seeds < 1:
        raise ValueError(f"{spell('seeds', opts.seeds)}: train the lambdas at least once")
    mixed = lambda_model(model, constants, tokenizer)
    per_seed, fits = [], []
    for i in range(opts.seeds):
        set_lambda_logits(mixed, 0.0)  # every seed starts at lambda = 0.5
        desc = f"lambda ({task.name})" + (f" seed {i + 1} of {opts.seeds}," if opts.seeds > 1 else "")
        desc += f" lambda lr {opts.lambda_lr:g}"
        fits.append(fit_lambdas(mixed, tokenizer, task, data_dir, replace(opts, seed=opts.seed + i), desc=desc))
        per_seed.append(lambda_values(mixed))  # (layers, heads)
    lambdas = torch.stack(per_seed).mean(0)  # (layers, heads)
    order, scores = order_by_scores(lambdas.tolist(), ascending=True)
    num_heads, num_layers = num_heads_layers(model.config)
    fit_result = fits[0]
    agreement = seed_agreement(per_seed)
    provenance = {
        "task": task.name,
        "data": fit_result.data,
        "examples": fit_result.examples,
        "seed": opts.seed,
        "seeds": [opts.seed + i for i in range(opts.seeds)],
        "steps": fit_result.steps,
        "epochs": fit_result.epochs,
        "lr": opts.lr,
        "lambda_lr": opts.lambda_lr,
        "batch_size": opts.batch_size,
        "final_loss": fit_result.loss,
        **agreement,
        "lambdas_per_seed": [[round(x, 6) for x in lam.flatten().tolist()] for lam in per_seed],
        "source_model": public_name(source_name or getattr(model.config, "_name_or_path", None)),
        "constants": {
            "kind": constants.kind,
            "max_length": constants.max_length,
            "pairs": constants.pairs,
            "corpus": constants.metadata.get("corpus"),
        },
        "papa_surgery_version": __version__,
    }
    if agreement["seed_agreement"] is not None and agreement["seed_agreement"] < NOISY_AGREEMENT:
        warnings.warn(
            f"the lambda order is mostly noise: {opts.seeds} seeds agree only {agreement['seed_agreement']:.2f} "
            f"(Spearman; 1 is the same order), lambdas spread {agreement['spread']:.4f} across heads against "
            f"{agreement['noise']:.4f} between seeds. Train longer ({spell('steps')}, now {fit_result.steps} a "
            f"seed) or on more examples, or rank with {spell('method', 'variance')}",
            LambdaNoiseWarning,
            stacklevel=2,
        )
    return Ranking("lambda", order, num_layers, num_heads, scores, provenance)


def seed_agreement(per_seed: list[torch.Tensor]) -> dict:
    """How much of a lambda order is signal: ``seed_agreement`` (the mean Spearman correlation between seeds'
    lambdas; ``None`` with one seed), ``spread`` (standard deviation across heads of the mean lambda) and
    ``noise`` (standard deviation between seeds of a head's lambda, averaged over heads; ``None`` with one seed)."""
    flat = torch.stack([lam.flatten().double() for lam in per_seed])  # (seeds, heads)
    spread = float(flat.mean(0).std()) if flat.shape[1] > 1 else 0.0
    if len(per_seed) < 2:
        return {"seed_agreement": None, "spread": round(spread, 6), "noise": None}
    ranks = flat.argsort(1).argsort(1).double()  # (seeds, heads): Spearman is Pearson on ranks
    ranks = ranks - ranks.mean(1, keepdim=True)
    ranks = ranks / ranks.norm(dim=1, keepdim=True).clamp_min(1e-12)
    corr = ranks @ ranks.T
    pairs = [float(corr[i, j]) for i in range(len(per_seed)) for j in range(i + 1, len(per_seed))]
    return {
        "seed_agreement": round(sum(pairs) / len(pairs), 4),
        "spread": round(spread, 6),
        "noise": round(float(flat.std(0).mean()), 6),
    }
