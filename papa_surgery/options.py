"""Options, defined once as frozen dataclasses and turned into click options.

Each field carries its help text and CLI spelling in ``metadata``; :func:`click_options` turns a
dataclass into click decorators and :func:`from_kwargs` builds the dataclass back from what click
parsed. The library's pipeline functions take these dataclasses, so the CLI and Python share one
definition. Importing this module is cheap (no torch): ``--help`` stays fast.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

import click

DTYPE_CHOICES = ("fp32", "fp16", "bf16")
KIND_CHOICES = (
    "average",
    "distilled",
    "identity",
    "toeplitz",
    "zeros",
    "uniform",
    "norm-average",
    "effective-average",
)
METHOD_CHOICES = ("lambda", "reversed-lambda", "variance", "norm", "first-to-last", "last-to-first", "random")


class OptionError(ValueError):
    """A bad option value found by the library: the CLI reports it as a usage error (exit 2) naming ``option``."""

    def __init__(self, option: str, message: str):
        self.option = option
        super().__init__(f"{option}: {message}")
        self.detail = message


def opt(help: str, default: Any = None, *, flag: str | None = None, short: str | None = None, **click_kwargs):
    """A dataclass field that is also a click option (``--name`` from the field name unless ``flag``)."""
    return field(default=default, metadata={"help": help, "flag": flag, "short": short, "click": click_kwargs})


def click_options(cls):
    """Decorator adding one click option per field of the dataclass ``cls`` (in field order)."""

    def decorate(func):
        for f in reversed(dataclasses.fields(cls)):
            if "help" not in f.metadata:
                continue
            meta = f.metadata
            names = [meta["flag"] or "--" + f.name.replace("_", "-")]
            if meta["short"]:
                names.insert(0, meta["short"])
            kwargs = dict(meta["click"])
            if kwargs.get("is_flag"):
                kwargs.setdefault("default", bool(f.default))
            elif f.default is not None:  # click 8.2+ treats an explicit default=None as a value for required options
                kwargs.setdefault("default", f.default)
                kwargs.setdefault("show_default", True)
            func = click.option(*names, f.name, help=meta["help"], **kwargs)(func)
        return func

    return decorate


def from_kwargs(cls, kwargs: dict):
    """Build ``cls`` from parsed click values, ignoring keys that belong to other option groups."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in kwargs.items() if k in names})


@dataclass(frozen=True)
class RunOptions:
    """Where and how models run."""

    device: str | None = opt("Device to run on (cpu, cuda, cuda:1...). Default: cuda when available, else cpu.")
    model_dtype: str = opt("Dtype the model runs in.", "fp32", type=click.Choice(("fp32", "bf16", "fp16")))
    batch_size: int = opt("Examples per forward pass.", 32, type=click.IntRange(min=1))
    seed: int = opt("Random seed.", 0, type=int)


@dataclass(frozen=True)
class CalibrationOptions:
    """How constants are calibrated (paper 3.1)."""

    corpus: str | None = opt(
        "Calibration corpus: a text file (one example per line, TAB between a pair), a datasets folder/file, "
        "or a Hub spec name[:config]:split:column. Default: WikiText-103 train, or offline the bundled excerpt."
    )
    max_length: int = opt(
        "Slots L of each constant matrix (longest input the model accepts).", 128, type=click.IntRange(min=4)
    )
    pairs: bool = opt("The corpus holds sentence pairs (middle separator at slot L/2).", False, is_flag=True)
    max_examples: int | None = opt("Use at most this many corpus examples.", None, type=click.IntRange(min=1))


@dataclass(frozen=True)
class DistillOptions:
    """How ``distilled`` constants are trained (label-free: the source's hidden states are the targets)."""

    distill_steps: int = opt(
        "Optimisation steps for --kind distilled (the step budget).", 200, type=click.IntRange(min=1)
    )
    distill_objective: str = opt(
        "What --kind distilled matches: every layer's hidden states, or the last layer's only.",
        "layers",
        type=click.Choice(("layers", "last")),
    )
    distill_lr: float = opt("Learning rate (Adam, on log C) for --kind distilled.", 0.01, type=float)

    def kwargs(self) -> dict:
        """Keyword arguments for :func:`papa_surgery.distill.distill`."""
        return {"steps": self.distill_steps, "objective": self.distill_objective, "lr": self.distill_lr}


@dataclass(frozen=True)
class RankOptions:
    """How heads are ordered for replacement (paper 3.2, 5.4)."""

    method: str | None = opt("Head ranking method.", None, type=click.Choice(METHOD_CHOICES))
    ranking: str | None = opt("A ranking JSON file from `papa-surgery rank` (instead of --method).")
    task: str | None = opt("Labelled task for the lambda ranking (sst2, cola, mrpc, mnli, ner, pos...).")
    data_dir: str | None = opt("Read the task from local files in their standard formats (e.g. ../shared/data).")
    steps: int | None = opt("Training steps for the lambda ranking.", None, type=click.IntRange(min=1))
    max_train_examples: int | None = opt(
        "Use at most this many labelled training examples.", None, type=click.IntRange(min=1)
    )


@dataclass(frozen=True)
class ConvertOptions:
    """What the converted checkpoint holds."""

    fraction: float = opt(
        "Share of heads made constant: 0 is the source model, 1 is attention-free.", None, required=True, type=float
    )
    constants: str | None = opt("A constants file from `papa-surgery calibrate` (instead of calibrating).")
    kind: str = opt("Constant matrices to use.", "average", type=click.Choice(KIND_CHOICES))
    dtype: str = opt("Storage dtype of the constants.", "fp32", type=click.Choice(DTYPE_CHOICES))
    storage: str = opt(
        "How constants are stored: dense L x L matrices, or compact (band, special slots, relative-offset profile "
        "and a rank-16 residual; what the model computes with, exactly). auto: dense up to L=128, compact above.",
        "auto",
        type=click.Choice(("auto", "dense", "compact")),
    )
    trainable_constants: bool = opt(
        "Let fine-tuning update the constants (the paper's labeled matrices).", False, is_flag=True
    )
    out: str | None = opt("Output folder. Default: <model-name>-papa-<fraction> in the current folder.")
    overwrite: bool = opt(
        "Replace an earlier PAPA checkpoint (never another folder or your own files).", False, is_flag=True
    )
    results: str | None = opt(
        "Probe results (JSONL from `papa-surgery probe`) to show in the model card.",
        type=click.Path(exists=True, dir_okay=False),
    )


@dataclass(frozen=True)
class PushOptions:
    """Publishing to the Hugging Face Hub."""

    repo_id: str | None = opt(
        "Hub repository id, e.g. user/minilm-papa-0.5. Default: <your token's namespace>/<output folder name>."
    )
    private: bool = opt("Create the repository as private.", False, is_flag=True)
    revision: str | None = opt("Branch to push to.")
    create_pr: bool = opt("Open a pull request instead of committing to the branch.", False, is_flag=True)
