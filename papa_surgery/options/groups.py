"""The option groups: one frozen dataclass per concern, each field a click option (:mod:`.checks`)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import click

from .. import registry
from ..failures import ArgumentError
from .checks import FRACTION, POSITIVE_FLOAT, POSITIVE_INT, SLOTS, Checked, DeviceType, FractionListType, opt

DEFAULT_CORPUS_HELP = (
    "Calibration corpus: a text file (one example per line, TAB between a pair), a datasets folder/file, or a "
    "Hub spec name[:config]:split:column; documents:SRC joins SRC's lines into whole articles (at WikiText's "
    "' = Title = ' headings; documents: alone: the bundled excerpt) for long inputs. Default: WikiText-103 train "
    "from the Hub, or offline the bundled excerpt."
)


@dataclass(frozen=True)
class RunOptions(Checked):
    """Where and how models run."""

    device: str | None = opt(
        "Device to run on (cpu, cuda, cuda:1...). Default: cuda when available, else cpu.", type=DeviceType()
    )
    model_dtype: str = opt("Dtype the model runs in.", "fp32", type=click.Choice(registry.DTYPES))
    batch_size: int = opt("Examples per forward pass.", 32, type=POSITIVE_INT)
    seed: int = opt("Random seed.", 0, type=click.IntRange(min=0))
    trust_remote_code: bool = opt(
        "Run the model code a checkpoint or model ships (its .py files) instead of papa-surgery's own classes. Only "
        "for code you have read: without it no file of the model runs.",
        False,
        is_flag=True,
    )


@dataclass(frozen=True)
class CalibrationOptions(Checked):
    """How constants are calibrated (paper 3.1)."""

    corpus: str | None = opt(DEFAULT_CORPUS_HELP)
    max_length: int | None = opt(
        "Slots L of each constant matrix: the longest input the converted model accepts. Default: the source's own "
        "length (its sentence-transformers max_seq_length, else its tokenizer's model_max_length, within its "
        "position embeddings; all-MiniLM-L6-v2: 256).",
        type=SLOTS,
    )
    pairs: bool = opt("The corpus holds sentence pairs (middle separator at slot L/2).", False, is_flag=True)
    max_examples: int | None = opt("Use at most this many examples of each corpus read.", None, type=POSITIVE_INT)


@dataclass(frozen=True)
class DistillOptions(Checked):
    """How ``distilled`` constants are trained (label-free: the source's hidden states are the targets)."""

    distill_steps: int = opt("Optimisation steps for --kind distilled (the step budget).", 200, type=POSITIVE_INT)
    distill_objective: str = opt(
        "What --kind distilled matches: every layer's hidden states, or the last layer's only.",
        "layers",
        type=click.Choice(("layers", "last")),
    )
    distill_lr: float = opt("Learning rate (Adam, on log C) for --kind distilled.", 0.01, type=POSITIVE_FLOAT)
    sharpen_search: str = opt(
        "How --kind sharpened fits its exponents: per-head (one per head, by gradient: 64 steps of at most "
        f"{registry.SHARPEN_STEP_EXAMPLES} examples and {registry.SHARPEN_STEP_TOKENS:,} tokens each), walk (one per "
        "layer, out from 1 while it helps), grid (one per layer, every value tried). per-head measured at least as "
        "close to the source as the others.",
        registry.DEFAULT_SHARPEN_SEARCH,
        type=click.Choice(registry.SHARPEN_SEARCHES),
    )

    def kwargs(self) -> dict:
        """Keyword arguments for :func:`papa_surgery.healing.distill`."""
        return {"steps": self.distill_steps, "objective": self.distill_objective, "lr": self.distill_lr}


@dataclass(frozen=True)
class HealOptions(Checked):
    """How a converted model heals: label-free distillation toward its source (``papa-surgery heal``).

    ``convert``, ``probe`` and ``finetune`` take the same options as ``--heal-<name>`` (``--heal-steps N`` heals
    what they convert); ``lr=None`` is the training mode's default (``registry.TRAIN_MODES``).
    """

    # 800: about 10 minutes for all-MiniLM-L6-v2 at L=128 on 2 CPU cores (full training); its SST-2 sentence cosine
    # to the source still rose from 150 to 600 steps (0.817 -> 0.829 with LoRA), its held-out one more (0.873 -> 0.897).
    steps: int = opt("Optimisation steps (the step budget), one batch of examples each.", 800, type=POSITIVE_INT)
    train: str = opt(
        "What trains: " + "; ".join(f"{m.name}: {m.summary}" for m in registry.TRAIN_MODES.values()) + ".",
        registry.DEFAULT_TRAIN,
        type=click.Choice(tuple(registry.TRAIN_MODES)),
    )
    lr: float | None = opt(
        "Peak learning rate of the trained weights (default: "
        + ", ".join(f"{m.name} {m.lr:g}" for m in registry.TRAIN_MODES.values() if m.lr)
        + "); warm-up then cosine decay.",
        type=POSITIVE_FLOAT,
    )
    constants_lr: float = opt("Peak learning rate of the constants (Adam on log C).", 0.01, type=POSITIVE_FLOAT)
    freeze_constants: bool = opt(
        "Keep the constants as they are (train lora or full): they stay in the checkpoint's storage, so a "
        "long-input checkpoint heals without its constants as dense (L, L) matrices.",
        False,
        is_flag=True,
    )
    objective: str = opt(
        "What the healed model matches: every layer's hidden states (variance-normalised) or the last's, and/or the "
        "sentence-transformers embedding; auto: layers+embedding for a sentence-transformers source, else layers.",
        "auto",
        type=click.Choice(registry.HEAL_OBJECTIVES),
    )
    embedding_weight: float = opt("Weight of the sentence-embedding term (1 - cos).", 1.0,
                                  type=click.FloatRange(min=0))  # fmt: skip
    warmup: float = opt("Share of the steps spent warming the learning rate up.", 0.06,
                        type=click.FloatRange(0, 1, max_open=True))  # fmt: skip
    heldout: int = opt("Corpus examples held out to measure the agreement with the source.", 200, type=POSITIVE_INT)
    eval_every: int | None = opt(
        "Measure the held-out agreement (and save the resume state) every this many steps (default: a fifth of the "
        "steps).",
        type=POSITIVE_INT,
    )
    lora_rank: int = opt("Rank of the LoRA adapters (training lora).", 16, type=POSITIVE_INT)
    teacher: str | None = opt(
        "The source model to heal toward (a Hub id, a folder, or minilm). Default: the source named in the "
        "checkpoint's papa_recipe.json."
    )

    def __post_init__(self):
        super().__post_init__()
        if self.freeze_constants and self.train == "constants":
            raise ArgumentError(
                "freeze_constants",
                "leaves nothing to train: the constants mode trains the constants only (train lora or full)",
            )

    def learning_rate(self) -> float:
        """The trained weights' peak learning rate: the given one or the mode's default."""
        mode = registry.train_mode(self.train)
        return self.lr if self.lr is not None else (mode.lr or self.constants_lr)

    def evaluation_interval(self) -> int:
        return self.eval_every if self.eval_every is not None else max(1, self.steps // 5)

    def kwargs(self) -> dict:
        """The options a run converting its own model records (no teacher: the source teaches)."""
        return {k: v for k, v in dataclasses.asdict(self).items() if k != "teacher"}


# ``convert``, ``probe`` and ``finetune`` heal what they convert, so their source is the teacher: no --heal-teacher.
HEAL_WITH_SOURCE = tuple(f.name for f in dataclasses.fields(HealOptions) if f.name != "teacher")


@dataclass(frozen=True)
class RankOptions(Checked):
    """How heads are ordered for replacement (paper 3.2, 5.4)."""

    method: str | None = opt(
        "Head ranking method (rank needs one). convert's default: lambda with --task; else sensitivity (each head "
        "made constant alone on the corpus, those that move the sentence embeddings least first) up to L=512 for "
        "single sentences, variance above and for pairs.",
        None,
        type=click.Choice(registry.METHODS),
    )
    ranking: str | None = opt(
        "A ranking JSON file from `papa-surgery rank` (instead of --method).",
        type=click.Path(exists=True, dir_okay=False),
    )
    task: str | None = opt("Labelled task for the lambda ranking (sst2, cola, mrpc, mnli, ner, pos...).")
    data_dir: str | None = opt(
        "Read the task from local files in their standard formats (e.g. ../shared/data).",
        type=click.Path(exists=True, file_okay=False),
    )
    steps: int | None = opt(
        "Training steps of the lambda ranking, per seed. Default 100: with 2 seeds, 200 forward and backward passes "
        "of the model over a batch of the task (SST-2: 32 sentences), a few minutes for all-MiniLM-L6-v2 on a CPU "
        "(measured 2.6-4.2 s a step on 2 busy cores); the bar shows the time left.",
        None,
        type=POSITIVE_INT,
    )
    lambda_lr: float | None = opt(
        "Learning rate of the lambdas (default 1e-2: they move measurably in 100 steps; the paper's 1e-4 leaves them "
        "at 0.5 +- 0.01 in a CPU's budget).",
        None,
        type=POSITIVE_FLOAT,
    )
    lambda_seeds: int | None = opt(
        "Times the lambdas are trained, with seeds --seed, --seed + 1...: heads are ordered by the mean lambda, "
        "and the seeds' agreement says how much of the order is noise (a warning when they mostly disagree). "
        "Default 2.",
        None,
        type=POSITIVE_INT,
    )
    max_train_examples: int | None = opt("Use at most this many labelled training examples.", None, type=POSITIVE_INT)

    def lambda_options(self) -> dict:
        """The lambda training's keyword arguments these options set (unset ones keep their defaults)."""
        given = {"steps": self.steps, "lambda_lr": self.lambda_lr, "seeds": self.lambda_seeds}
        return {k: v for k, v in given.items() if v is not None}

    @property
    def resolved_method(self) -> str:
        """The method this request runs: the given one, or the registry's default for the task."""
        return self.method or registry.default_method(self.task)

    def convert_method(self, max_length: int | None = None, pairs: bool = False) -> str:
        """The method ``convert`` runs: the given one, or the registry's default for converting at ``max_length``
        slots (``None``: not known yet) with constants of pairs or not."""
        return self.method or registry.default_convert_method(self.task, max_length, pairs)


@dataclass(frozen=True)
class ConvertOptions(Checked):
    """What the converted checkpoint holds."""

    fraction: float = opt(
        "Share of heads made constant: 0 is the source model, 1 is attention-free (a decimal or a fraction: 7/8).",
        None,
        required=True,
        type=FRACTION,
    )
    constants: str | None = opt(
        "A constants file from `papa-surgery calibrate` (instead of calibrating).",
        type=click.Path(exists=True, dir_okay=False),
    )
    kind: str | None = opt(
        f"Constant matrices to use. Default for convert: {registry.DEFAULT_CONVERT_KIND} (measured closest to the "
        f"source) up to L={registry.DEFAULT_KIND_UP_TO}, average above and at --fraction 0; for calibrate: average; "
        "with --constants: the file's own kind (--kind may name a trained kind to fit from the file's average).",
        type=click.Choice(registry.CONSTANT_KINDS),
    )
    dtype: str = opt("Storage dtype of the constants.", "fp32", type=click.Choice(registry.DTYPES))
    storage: str = opt(
        "How constants are stored: dense L x L matrices, or compact (band, special slots, relative-offset profile "
        "and a low-rank residual; what the model computes with, exactly). auto: dense up to L=128 (and for "
        "distilled constants), compact above. Calibration streams straight into the compact form (no "
        "L x L sums per head) with compact, and with auto above L=512.",
        "auto",
        type=click.Choice(tuple(registry.STORAGES)),
    )
    compact_band: int | None = opt(
        "Compact storage: the diagonals -w..w stored exactly (default 16; 0 above L=2048).", type=click.IntRange(min=0)
    )
    compact_rank: int | None = opt(
        "Compact storage: the rank of the residual off the band (default 16; 0 above L=2048). Calibration into the "
        "structure finds it in one more pass over the corpus.",
        type=click.IntRange(min=0),
    )

    def storage_kwargs(self) -> dict:
        """``storage``, ``compact_band``, ``compact_rank``: what calibration and conversion both read."""
        return {"storage": self.storage, "compact_band": self.compact_band, "compact_rank": self.compact_rank}

    trainable_constants: bool = opt(
        "Let fine-tuning update the constants (the paper's labeled matrices).", False, is_flag=True
    )
    out: str | None = opt("Output folder. Default: <model-name>-papa-<fraction> in the current folder.")
    overwrite: bool = opt("Replace an earlier checkpoint papa-surgery wrote there.", False, is_flag=True)
    results: str | None = opt(
        "Probe results (JSONL from `papa-surgery probe`) to show in the model card.",
        type=click.Path(exists=True, dir_okay=False),
    )


@dataclass(frozen=True)
class FileOutputOptions(Checked):
    """A command's output file (constants, a ranking)."""

    out: str = opt("Output file.", None, required=True, type=click.Path(dir_okay=False))
    overwrite: bool = opt(
        "Replace an earlier file of the same kind that papa-surgery wrote there.", False, is_flag=True
    )


@dataclass(frozen=True)
class PushOptions(Checked):
    """Publishing to the Hugging Face Hub."""

    repo_id: str | None = opt(
        "Hub repository id, e.g. user/minilm-papa-0.5. Default: <your token's namespace>/<output folder name>."
    )
    private: bool = opt("Create the repository as private.", False, is_flag=True)
    revision: str | None = opt("Branch to push to.")
    create_pr: bool = opt("Open a pull request instead of committing to the branch.", False, is_flag=True)


@dataclass(frozen=True)
class SweepOptions(Checked):
    """What a probe or fine-tuning sweep covers (tasks x corpora x kinds x methods x fractions x seeds)."""

    tasks: tuple[str, ...] = opt(
        "Task(s): sst2, cola, mrpc, mnli, ner, pos, pos-ud (repeat for several).",
        (),
        flag="--task",
        multiple=True,
        required=True,
    )
    data_dir: str | None = opt(
        "Read tasks from local files (e.g. ../shared/data) instead of the Hub.",
        type=click.Path(exists=True, file_okay=False),
    )
    fractions: tuple[float, ...] = opt(
        "Comma-separated shares of heads made constant (decimals or fractions such as 7/8).",
        "0,1/2,7/8,15/16,1",
        type=FractionListType(),
    )
    seeds: int = opt("Seeds per cell (0, 1, ... N-1).", 3, type=POSITIVE_INT)
    kinds: tuple[str, ...] = opt(
        "Constant kind(s) (default average; repeat for several).",
        (),
        flag="--kind",
        multiple=True,
        type=click.Choice(registry.SWEEP_KINDS),
    )
    methods: tuple[str, ...] = opt(
        "Ranking method(s) (default variance; repeat for several).",
        (),
        flag="--method",
        multiple=True,
        type=click.Choice(registry.METHODS),
    )
    corpus: str | None = opt(
        "Calibration corpus: the task's own unlabelled training text (the paper's, default), 'default' (the "
        "workflow's default corpus; healing: its own), task:NAME (another task's), or anything calibrate reads."
    )
    max_length: int | None = opt("Slots L (default: the task's App. B length).", type=SLOTS)
    max_train_examples: int | None = opt("Cap training examples per task.", type=POSITIVE_INT)
    max_eval_examples: int | None = opt("Cap evaluation examples per task.", type=POSITIVE_INT)
    max_calibration_examples: int | None = opt("Cap calibration examples.", type=POSITIVE_INT)
    epochs: int | None = opt(
        "Override the task's epochs (probe: App. B; fine-tuning: 3, or 5 for CoLA/MRPC).", type=POSITIVE_INT
    )
    lr: float | None = opt("Override the task's learning rate (a positive number).", type=POSITIVE_FLOAT)
    batch_size: int | None = opt("Override the task's batch size.", type=POSITIVE_INT)
    device: str | None = opt("Device (cpu, cuda, cuda:1...).", type=DeviceType())
    distill_steps: int | None = opt("Step budget of the distilled kind (default 200).", type=POSITIVE_INT)
    out: str = opt("Results file (JSONL, appended).", None, required=True, type=click.Path(dir_okay=False))


_FINETUNE_TASK_DEFAULTS: dict[str, dict] = {"cola": {"epochs": 5}, "mrpc": {"epochs": 5}}


@dataclass(frozen=True)
class FinetuneOptions(Checked):
    """How each fine-tuning cell trains the whole model end to end; ``None`` = the task's default.

    The defaults follow common BERT-family practice (Devlin et al. 2019; Liu et al. 2019): AdamW with linear
    decay and 6% warmup, weight decay 0.01, 3 epochs (5 for the small CoLA and MRPC, whose dev scores are
    noisy after 3), batch 16 and learning rate 5e-5, the top of Devlin et al.'s grid: the runs this command
    is for (a few thousand examples, small encoders) take few steps, and at 2e-5 with batch 32
    all-MiniLM-L6-v2 stays at SST-2's majority baseline after one epoch on 1,000 examples (0.509; 5e-5 with
    batch 16: 0.712). The probe's App. B values are for a frozen backbone and do not carry over.

    Attributes:
        epochs, lr, batch_size: training length, peak learning rate, examples per step.
        weight_decay: AdamW weight decay (not applied to biases and LayerNorms, as transformers' Trainer does).
        warmup_ratio: share of the steps spent warming the learning rate up linearly.
        eval_batch_size: examples per evaluation step (also the batch of the inference-speed measurement).
        early_stopping_patience: stop after this many epochs without a better dev score; ``None`` (the
            default) trains every epoch and scores the last model.
        trainable_constants: the constant heads' matrices get gradients too (frozen by default).
        max_length: slots L of a source model (default: the task's App. B length, as the probe uses); a PAPA
            model always uses its own L.
    """

    epochs: int | None = opt("", cli=False, type=POSITIVE_INT)
    lr: float | None = opt("", cli=False, type=POSITIVE_FLOAT)
    batch_size: int | None = opt("", cli=False, type=POSITIVE_INT)
    weight_decay: float = opt("AdamW weight decay.", 0.01, type=click.FloatRange(min=0))
    warmup_ratio: float = opt("Share of the steps spent warming up.", 0.06, type=click.FloatRange(0, 1, max_open=True))
    eval_batch_size: int = opt("Examples per evaluation step.", 64, type=POSITIVE_INT)
    early_stopping_patience: int | None = opt(
        "Stop after this many epochs without a better dev score (default: off, every epoch runs).", type=POSITIVE_INT
    )
    trainable_constants: bool = opt("Give the constant heads' matrices gradients too.", False, is_flag=True)
    max_length: int | None = opt("", cli=False, type=SLOTS)

    # epochs, lr, batch_size and max_length are SweepOptions' flags on the command line (one flag each)

    def for_task(self, task) -> FinetuneOptions:
        """These options with every ``None`` filled from ``task``'s defaults."""
        defaults = {"epochs": 3, "lr": 5e-5, "batch_size": 16, **_FINETUNE_TASK_DEFAULTS.get(task.name, {})}
        return dataclasses.replace(self, **{k: v for k, v in defaults.items() if getattr(self, k) is None})

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class AnalyzeOptions(Checked):
    """An analysis pass over a corpus (norm-based or effective attention)."""

    corpus: str | None = opt("Corpus to analyse (as for calibrate). Default: the workflow's default corpus.")
    max_length: int = opt("Slots L.", 128, type=SLOTS)
    max_examples: int = opt("Examples to use.", 1000, type=POSITIVE_INT)
    batch_size: int = opt("Examples per batch.", 32, type=POSITIVE_INT)
    device: str | None = opt("Device (cpu, cuda...).", type=DeviceType())
