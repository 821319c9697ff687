"""What papa-surgery can make and what each choice needs: kinds of constants, ranking methods, storages.

The one table of these facts. The CLI's choices and help, the Python API's checks, the workflow's steps and
the sweeps all read it, so "the norm ranking reads norm-average constants" or "lambda needs a task" is
written once, here. Torch-free (``papa-surgery --help`` imports it).

    >>> from papa_surgery import registry
    >>> registry.method("norm").constants
    'norm-average'
    >>> registry.default_method(task=None)
    'variance'
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

# How a kind's matrices are made.
CALIBRATED = "calibrated"  # averaged over an unlabelled corpus (paper 3.1)
ANALYSIS = "analysis"  # averaged over a corpus in an analysis pass (norm-based, effective attention)
DATA_FREE = "data-free"  # a fixed matrix, no data (paper 5.2)
TRAINED = "trained"  # trained label-free toward the source (healing)
LABELED = "labeled"  # trained with the probe on a labelled task (paper Table 1 rows 4-5; sweeps only)


@dataclass(frozen=True)
class Kind:
    """A kind of constant matrices.

    Attributes:
        name: as the CLI and files spell it.
        summary: one line of help.
        made: how the matrices are made (``CALIBRATED``, ``ANALYSIS``, ``DATA_FREE``, ``TRAINED``, ``LABELED``).
        starts_from: the kind a trained or labelled kind starts from (``None``: made from scratch).
        fitted_by: the ``papa_surgery`` function that fits a trained kind (``None``: made by ``calibrate``).
    """

    name: str
    summary: str
    made: str
    starts_from: str | None = None
    fitted_by: str | None = None

    @property
    def needs_corpus(self) -> bool:
        """Whether making these constants reads an unlabelled corpus (itself or the kind it starts from)."""
        if self.made in (CALIBRATED, ANALYSIS, TRAINED):
            return True
        return self.starts_from is not None and kind(self.starts_from).needs_corpus

    @property
    def sweeps_only(self) -> bool:
        """Trained with a sweep cell's probe: not something ``calibrate`` or ``convert`` can make alone."""
        return self.made == LABELED


_KINDS = (
    Kind("average", "the paper's: each head's attention averaged over an unlabelled corpus (3.1)", CALIBRATED),
    Kind(
        "distilled",
        "the average, trained to match the source's hidden states (label-free)",
        TRAINED,
        "average",
        "distill",
    ),
    Kind(
        "sharpened",
        "the average, each head's (or layer's) rows raised to a power fitted to the source's hidden states "
        "(label-free)",
        TRAINED,
        "average",
        "sharpen",
    ),
    Kind("identity", "each token attends to itself", DATA_FREE),
    Kind("toeplitz", "harmonic: weight 1 / (1 + |i - j|)", DATA_FREE),
    Kind("zeros", "the head contributes nothing", DATA_FREE),
    Kind("uniform", "every real token alike", DATA_FREE),
    Kind("norm-average", "norm-weighted attention alpha ||f(x)|| averaged over a corpus (Kobayashi 2020)", ANALYSIS),
    Kind("effective-average", "effective attention A U U^T averaged over a corpus (Brunner 2020)", ANALYSIS),
    Kind("labeled-average", "the average, trained with the probe on the task (paper Table 1)", LABELED, "average"),
    Kind("labeled-toeplitz", "the Toeplitz matrix, trained with the probe on the task", LABELED, "toeplitz"),
)
KINDS: dict[str, Kind] = {k.name: k for k in _KINDS}
# What ``convert`` makes when no --kind is given (and no --constants file says its own): sharpened constants (the
# average with an exponent per head fitted to the source) measured closest to the source of every kind (issue 32,
# docs/kinds-ranking.md); they are fitted as dense (L, L) matrices, so above DEFAULT_KIND_UP_TO slots, where the
# average calibrates straight into the compact structure, the default is the average.
DEFAULT_CONVERT_KIND = "sharpened"
# The kinds a converted checkpoint or constants file can hold (the labelled ones exist only inside sweeps).
CONSTANT_KINDS = tuple(k.name for k in _KINDS if not k.sweeps_only)
SWEEP_KINDS = tuple(KINDS)
DATA_FREE_KINDS = tuple(k.name for k in _KINDS if k.made == DATA_FREE)
ANALYSIS_KINDS = tuple(k.name for k in _KINDS if k.made == ANALYSIS)
CORPUS_AVERAGE_KINDS = tuple(k.name for k in _KINDS if k.made in (CALIBRATED, ANALYSIS))
TRAINED_KINDS = tuple(k.name for k in _KINDS if k.made == TRAINED)
LABELED_KINDS = tuple(k.name for k in _KINDS if k.made == LABELED)


@dataclass(frozen=True)
class Method:
    """A way to order the heads, first to make constant first (paper 3.2, 5.4).

    Attributes:
        name: as the CLI and files spell it.
        summary: one line of help.
        task: learned on a labelled task (needs ``task``, the model and its tokenizer).
        constants: the kind of calibrated constants it reads (``None``: none).
        seeded: the order depends on the seed.
        reverses: the method whose order this one reads backwards.
        corpus: measured by running the model over an unlabelled corpus (needs the model, tokenizer and corpus).
    """

    name: str
    summary: str
    task: bool = False
    constants: str | None = None
    seeded: bool = False
    reverses: str | None = None
    corpus: bool = False


_METHODS = (
    Method("lambda", "learned mixing weights lambda per head, smallest first (paper 3.2)", True, "average", True),
    Method("reversed-lambda", "the lambda ranking read backwards", True, "average", True, "lambda"),
    Method("variance", "least input-dependent first: variance of A around its average (label-free)", False, "average"),
    Method("norm", "smallest mean contribution ||alpha f(x)|| first (Kobayashi 2020)", False, "norm-average"),
    Method(
        "sensitivity",
        "each head made constant alone on the corpus: the ones that move the sentence embeddings least first "
        "(label-free)",
        constants="average",
        corpus=True,
    ),
    Method("first-to-last", "layer order, first layer first"),
    Method("last-to-first", "layer order, last layer first"),
    Method("random", "a seeded random order", seeded=True),
)
METHODS: dict[str, Method] = {m.name: m for m in _METHODS}
LABEL_FREE_METHODS = tuple(m.name for m in _METHODS if not m.task)
LEARNED_METHODS = tuple(m.name for m in _METHODS if m.task)


@dataclass(frozen=True)
class TrainMode:
    """What trains while a converted model heals toward its source (``papa-surgery heal --train``).

    Attributes:
        name: as the CLI and recipes spell it.
        summary: one line of help.
        lr: the default peak learning rate of its trained weights (``None``: it trains only the constants).
    """

    name: str
    summary: str
    lr: float | None = None


# LoRA's 3e-3: all-MiniLM-L6-v2 at fraction 1 healed 150 steps on the bundled excerpt reached a sentence cosine of
# 0.817 to the source on SST-2 dev at 3e-3, 0.810 at 1e-3 and 0.802 at 1e-2 (benchmarks/bench_heal.py's setting).
_TRAIN_MODES = (
    TrainMode("lora", "LoRA on the value, attention-output and feed-forward Linears, plus the constants; merged", 3e-3),
    TrainMode("full", "every weight of the transformer layers (not the embeddings), plus the constants", 1e-4),
    TrainMode("constants", "the constant matrices only (the distilled kind); every other weight unchanged"),
)
TRAIN_MODES: dict[str, TrainMode] = {m.name: m for m in _TRAIN_MODES}
# A sweep with healing scores each kind's converted model twice: as converted (``average``) and healed
# (``average+healed``); results rows and reports carry that label as the row's kind.
HEALED = "+healed"


def healed_label(kind_name: str) -> str:
    """The results label of ``kind_name``'s healed twin in a sweep (``average`` -> ``average+healed``)."""
    return kind_name + HEALED


def split_healed(label: str) -> tuple[str, bool]:
    """``(kind, healed)`` of a results label (``average+healed`` -> ``("average", True)``)."""
    return (label[: -len(HEALED)], True) if label.endswith(HEALED) else (label, False)


# full, not lora: on all-MiniLM-L6-v2 at L=128 (800 steps, benchmarks/bench_heal.py) full training agrees with the
# source more at both fractions (SST-2 sentence cosine 0.835 vs 0.830 at fraction 1, 0.943 vs 0.938 at 0.5; token,
# MRPC and the probe too) for 20% more time; an encoder's weights and Adam state fit where its activations do.
DEFAULT_TRAIN = "full"
# What healing matches (papa_surgery.healing.objective): hidden states of every layer or the last, and/or the
# sentence-transformers embedding; ``auto`` = layers+embedding for a sentence-transformers source, else layers.
HEAL_OBJECTIVES = ("auto", "layers", "last", "embedding", "layers+embedding", "last+embedding")
# How the sharpened kind fits its exponents (papa_surgery.healing.sharpness): one per head by gradient (the
# default: papa_surgery.healing.head_sharpness), or one per layer, walking out from 1 or trying every grid value.
SHARPEN_SEARCHES = ("per-head", "walk", "grid")
DEFAULT_SHARPEN_SEARCH = "per-head"  # sharpen(), --sharpen-search and sweeps: measured at least the walk's equal
# One per-head step's batch at most: tokens (examples x padded length; its activations follow them: 2,048 is what
# documents were measured with, 4 at L=512) and examples, whatever --batch-size (16: sharpen's default, what sentences
# were measured with: steps of 32 fitted no closer at 1.8x the time; bench_kinds-mpnet-sharpen-batch.txt).
SHARPEN_STEP_TOKENS = 2048
SHARPEN_STEP_EXAMPLES = 16

# Kinds ``auto`` storage keeps dense at every L. Distilled matrices are trained cell by cell, and no compaction of
# them was measured. Sharpened ones compact as the average does (the compact rows that would lose their mass drop
# their residual: calibration.compaction.short_rows): sentence cosine to the source compact / dense, fraction 1,
# all-mpnet-base-v2 0.422 / 0.415 on long documents at L=512 and 0.711 / 0.712 on sentences at L=384,
# all-MiniLM-L6-v2 0.756 / 0.756 at L=256; fitted per layer (walk), MPNet documents 0.399 / 0.399
# (benchmarks/results/sharpened_compaction.txt).
DENSE_KINDS = ("distilled",)

STORAGES = {
    "auto": "dense up to L=128 (and for distilled constants), compact above",
    "dense": "an L x L matrix per constant head",
    "compact": "band, special slots, relative-offset profile and a low-rank residual (what the model computes with)",
}
DENSE_UP_TO = 128  # ``auto`` storage: dense up to this many slots, compact above
# ``auto`` storage calibrates with dense fp64 sums (layers x heads x L^2 x 16 bytes: 0.6 GB for BERT-base at 512,
# 2.4 GB at 1,024, 155 GB at 8,192) up to this many slots, straight into the compact structure above.
DENSE_CALIBRATION_UP_TO = 512
DEFAULT_KIND_UP_TO = DENSE_CALIBRATION_UP_TO  # convert's default kind: DEFAULT_CONVERT_KIND up to here, average above
DTYPES = ("fp32", "fp16", "bf16")


def _unknown(what: str, name, choices) -> ValueError:
    close = difflib.get_close_matches(str(name), list(choices), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return ValueError(f"unknown {what} {name!r}; choose one of {', '.join(choices)}.{hint}")


def kind(name: str, *, sweeps: bool = False) -> Kind:
    """The kind called ``name`` (ValueError with a suggestion); ``sweeps`` admits the labelled kinds."""
    choices = SWEEP_KINDS if sweeps else CONSTANT_KINDS
    if name not in choices:
        from .failures import spell

        if name in KINDS:  # a labelled kind outside a sweep
            raise ValueError(
                f"the {name!r} kind is trained with the probe of a sweep cell: use it with papa-surgery probe "
                f"({spell('kind', name)}); for a checkpoint choose one of {', '.join(CONSTANT_KINDS)}"
            )
        raise _unknown("constant kind", name, choices)
    return KINDS[name]


def method(name: str) -> Method:
    """The ranking method called ``name`` (ValueError with a suggestion)."""
    if name not in METHODS:
        raise _unknown("ranking method", name, METHODS)
    return METHODS[name]


def check_method(name: str, task=None) -> Method:
    """The method called ``name``, refused (naming the fix) when it is learned and no ``task`` is given."""
    from .failures import ArgumentError, spell

    chosen = method(name)
    if chosen.task and task is None:
        raise ArgumentError(
            "task",
            f"the {chosen.name!r} ranking is learned on a labelled task: pass {spell('task')} (e.g. "
            f"{spell('task', 'sst2')}), or use a label-free method ({', '.join(LABEL_FREE_METHODS)})",
        )
    return chosen


def default_method(task: str | None) -> str:
    """The method used when none is given: the paper's learned ``lambda`` with a task, else ``variance``."""
    return "lambda" if task else "variance"


# What ``convert`` ranks by when no --method, --ranking or --task is given: the heads whose replacement alone moves
# the sentence embeddings least go first, measured on the calibration corpus. Of the label-free methods it leaves a
# converted model closest to its source (issue 32, docs/kinds-ranking.md: all-MiniLM-L6-v2 at fraction 0.5, 0.96
# against variance's 0.92; all-mpnet-base-v2 0.91 against 0.85). It mixes every head with a dense (L, L) matrix, so
# above DEFAULT_KIND_UP_TO slots (and for constants of sentence pairs, which it would need a corpus of pairs for) the
# default is ``variance``, as it is for the sweeps.
DEFAULT_CONVERT_METHOD = "sensitivity"


def default_convert_method(task: str | None, max_length: int | None = None, pairs: bool = False) -> str:
    """The method ``convert`` uses when none is given: ``lambda`` with a task, else ``DEFAULT_CONVERT_METHOD`` up to
    ``DEFAULT_KIND_UP_TO`` slots for single sentences (``max_length`` ``None``: not known yet), ``variance`` beyond."""
    if task:
        return "lambda"
    if pairs or (max_length is not None and max_length > DEFAULT_KIND_UP_TO):
        return "variance"
    return DEFAULT_CONVERT_METHOD


def default_convert_kind(max_length: int | None, fraction: float | None = None) -> str:
    """The kind ``convert`` makes at ``max_length`` slots when none is asked for (``None``: not known yet, the
    source's own length): ``DEFAULT_CONVERT_KIND`` up to ``DEFAULT_KIND_UP_TO`` slots, the average above, and at
    ``fraction`` 0, where no head is constant so nothing is fitted (the paper's kind, as a sweep's fraction 0)."""
    short = max_length is None or max_length <= DEFAULT_KIND_UP_TO
    return DEFAULT_CONVERT_KIND if short and fraction != 0 else "average"


def convert_kind(
    asked: str | None, file_kind: str | None, path=None, max_length=None, fraction=None
) -> tuple[Kind, bool]:
    """``(kind, fit)``: the kind a checkpoint converted with ``--kind asked`` (``None``: not given) from constants of
    ``file_kind`` (a ``--constants`` file at ``path``; ``None``: none, so calibrated at ``max_length`` slots) holds
    at ``fraction``, and whether its matrices are still to be fitted (a trained kind).

    A file keeps its own kind: ``--kind`` may only repeat it, or name a trained kind fitted from it (``sharpened``
    from an ``average`` file); anything else is refused (the checkpoint would record a kind its matrices are not).
    """
    if file_kind is None:
        chosen = kind(asked or default_convert_kind(max_length, fraction))
        return chosen, chosen.made == TRAINED
    if asked is None or asked == file_kind:
        return kind(file_kind, sweeps=True), False
    chosen = kind(asked)
    if chosen.made == TRAINED and chosen.starts_from == file_kind:
        return chosen, True
    from .failures import ArgumentError, spell

    fix = f"drop {spell('kind')} (the file's kind is used)"
    if chosen.made == TRAINED:
        fix += f", or pass a {spell('constants')} file of kind {chosen.starts_from} to fit {asked} constants from"
    raise ArgumentError("kind", f"the constants file {path or ''} holds {file_kind} constants, not {asked}: {fix}")


def check_reads(method_name: str, kind_name: str) -> None:
    """ValueError unless constants of ``kind_name`` carry what ``method_name`` reads (``Method.constants``): that kind,
    or a kind made from it that keeps its scores (``distilled`` keeps the average's variance)."""
    chosen = method(method_name)
    wanted = chosen.constants
    if wanted is None:
        return
    made = KINDS.get(kind_name)
    chain = []
    while made is not None:
        chain.append(made.name)
        made = KINDS.get(made.starts_from) if made.starts_from else None
    if wanted in chain:
        return
    from .failures import on_command_line

    if on_command_line():
        how = "--constants with a file that papa-surgery calibrate" + (
            "" if wanted == "average" else f" --kind {wanted}"
        )
        how += " wrote"
    else:
        how = "constants=papa_surgery.calibrate(model, tokenizer" + (
            "" if wanted == "average" else f", kind={wanted!r}"
        )
        how += f"), or a constants file of kind {wanted}"
    raise ValueError(
        f"the {method_name!r} ranking reads {wanted} constants ({METHODS[method_name].summary}), not "
        f"{kind_name} constants: pass {how}"
    )


def check_calibration_storage(kind_name: str, storage: str, band=None, rank=None) -> None:
    """ArgumentError when a compact storage is asked of ``calibrate`` for a kind that is not made in one: the
    analyses' and trained kinds are dense (L, L) matrices (``convert`` can still store them compact)."""
    made = KINDS[kind_name].made
    if made in (CALIBRATED, DATA_FREE):
        return
    from .failures import ArgumentError, spell

    for name, given in (("storage", storage == "compact"), ("compact_band", band is not None),
                        ("compact_rank", rank is not None)):  # fmt: skip
        if given:
            raise ArgumentError(
                name,
                f"{kind_name} constants are made as dense (L, L) matrices, not in the compact structure (only the "
                f"average and the data-free kinds are): drop {spell(name)} here, and pass it to convert to store them "
                f"compact in the checkpoint",
            )


def train_mode(name: str) -> TrainMode:
    """The healing training mode called ``name`` (ValueError with a suggestion)."""
    if name not in TRAIN_MODES:
        raise _unknown("training mode", name, TRAIN_MODES)
    return TRAIN_MODES[name]


def storage(name: str) -> str:
    """``name`` if it is a storage (ValueError with a suggestion)."""
    if name not in STORAGES:
        raise _unknown("storage", name, STORAGES)
    return name
