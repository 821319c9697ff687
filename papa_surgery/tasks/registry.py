"""Probing tasks as data: one registry entry per task (paper sec. 4.1, App. B).

A :class:`Task` says where its data lives (a Hub dataset for the default path, local files for
``--data-dir``), which fields hold the text and labels, the label set, the metric (paper footnote 10)
and the probe's hyperparameters from the paper's Table 3. Nothing here does I/O: see ``data.py``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field

SENTENCE, TOKEN, MLM = "sentence", "token", "mlm"

CONLL_NER_LABELS = ("O", "B-PER", "I-PER", "B-ORG", "I-ORG", "B-LOC", "I-LOC", "B-MISC", "I-MISC")
# The Penn Treebank tag set of CoNLL-2003 in the Hub dataset's ClassLabel order.
CONLL_POS_LABELS = (
    '"', "''", "#", "$", "(", ")", ",", ".", ":", "``", "CC", "CD", "DT", "EX", "FW", "IN", "JJ", "JJR", "JJS",
    "LS", "MD", "NN", "NNP", "NNPS", "NNS", "NN|SYM", "PDT", "POS", "PRP", "PRP$", "RB", "RBR", "RBS", "RP", "SYM",
    "TO", "UH", "VB", "VBD", "VBG", "VBN", "VBP", "VBZ", "WDT", "WP", "WP$", "WRB",
)  # fmt: skip
UPOS_LABELS = (
    "ADJ", "ADP", "ADV", "AUX", "CCONJ", "DET", "INTJ", "NOUN", "NUM", "PART", "PRON", "PROPN", "PUNCT", "SCONJ",
    "SYM", "VERB", "X",
)  # fmt: skip


@dataclass(frozen=True)
class HubSource:
    """Where the default (Hub) data is: ``datasets.load_dataset(path, config, split=...)``."""

    path: str
    config: str | None
    splits: dict[str, str]  # our split name ("train", "eval") -> the dataset's split name
    text_fields: tuple[str, ...]  # one field (a sentence or a word list) or two (a pair)
    label_field: str | None


@dataclass(frozen=True)
class LocalSource:
    """How ``--data-dir`` files are read: a reader name (see ``data.READERS``) and paths under the folder."""

    reader: str  # glue_tsv | mnli_csv | conll | conllu | wikitext
    files: dict[str, str]  # split -> path relative to --data-dir
    options: dict = field(default_factory=dict)  # reader options (columns, header, ...)


@dataclass(frozen=True)
class Task:
    """One probing task: data, labels, metric and the probe's App. B hyperparameters."""

    name: str
    kind: str  # sentence | token | mlm
    hub: HubSource
    local: LocalSource
    metric: str  # accuracy | f1 | mcc | seqeval_f1 | token_f1 | neg_log_perplexity
    label_names: tuple[str, ...] = ()
    lr: float = 1e-4
    batch_size: int = 32
    epochs: int = 4
    max_length: int = 128
    description: str = ""
    note: str = ""

    @property
    def pairs(self) -> bool:
        """Whether examples are sentence pairs."""
        return len(self.hub.text_fields) == 2

    @property
    def num_labels(self) -> int:
        return len(self.label_names)


def _glue(config: str, fields: tuple[str, ...], eval_split: str = "validation") -> HubSource:
    return HubSource("nyu-mll/glue", config, {"train": "train", "eval": eval_split}, fields, "label")


TASKS: dict[str, Task] = {
    t.name: t
    for t in [
        Task(
            "sst2", SENTENCE, _glue("sst2", ("sentence",)),
            LocalSource("glue_tsv", {"train": "glue/sst2/train.tsv", "eval": "glue/sst2/dev.tsv"},
                        {"header": True, "text": ("sentence",), "label": "label"}),
            "accuracy", ("negative", "positive"), lr=1e-4, batch_size=32, epochs=4, max_length=64,
            description="SST-2 binary sentiment (GLUE)",
        ),
        Task(
            "cola", SENTENCE, _glue("cola", ("sentence",)),
            LocalSource("glue_tsv", {"train": "glue/cola/train.tsv", "eval": "glue/cola/dev.tsv"},
                        {"header": False, "text": (3,), "label": 1}),
            "mcc", ("unacceptable", "acceptable"), lr=2e-5, batch_size=16, epochs=15, max_length=64,
            description="CoLA linguistic acceptability (GLUE), Matthews correlation",
        ),
        Task(
            "mrpc", SENTENCE, _glue("mrpc", ("sentence1", "sentence2")),
            LocalSource("glue_tsv", {"train": "glue/mrpc/train.tsv", "eval": "glue/mrpc/dev.tsv"},
                        {"header": True, "text": ("#1 String", "#2 String"), "label": "Quality"}),
            "f1", ("not_equivalent", "equivalent"), lr=2e-5, batch_size=16, epochs=15, max_length=128,
            description="MRPC paraphrase (GLUE), F1 of the 'equivalent' class",
        ),
        Task(
            "mnli", SENTENCE, _glue("mnli", ("premise", "hypothesis"), eval_split="validation_mismatched"),
            LocalSource("mnli_csv", {"train": "glue/mnli/multinli_1.0_dev_matched.csv",
                                     "eval": "glue/mnli/multinli_1.0_dev_mismatched.csv"},
                        {"text": ("sentence1", "sentence2"), "label": "label", "skip_labels": ("-",)}),
            "accuracy", ("entailment", "neutral", "contradiction"), lr=2e-4, batch_size=8, epochs=4, max_length=256,
            description="MultiNLI, evaluated on dev-mismatched (paper footnote 11)",
            note="local files hold no MNLI train split: with --data-dir the probe trains on dev-matched and "
            "evaluates on dev-mismatched (the Hub path trains on train)",
        ),
        Task(
            "ner", TOKEN,
            HubSource("eriktks/conll2003", None, {"train": "train", "eval": "validation"}, ("tokens",), "ner_tags"),
            LocalSource("conll", {"train": "conll2003/train.txt", "eval": "conll2003/valid.txt"}, {"column": 3}),
            "seqeval_f1", CONLL_NER_LABELS, lr=1e-4, batch_size=8, epochs=4, max_length=128,
            description="CoNLL-2003 named entities (IOB2), entity-level F1 (seqeval)",
        ),
        Task(
            "pos", TOKEN,
            HubSource("eriktks/conll2003", None, {"train": "train", "eval": "validation"}, ("tokens",), "pos_tags"),
            LocalSource("conll", {"train": "conll2003/train.txt", "eval": "conll2003/valid.txt"}, {"column": 1}),
            "token_f1", CONLL_POS_LABELS, lr=5e-4, batch_size=8, epochs=4, max_length=128,
            description="CoNLL-2003 part-of-speech tags, micro F1 over words",
        ),
        Task(
            "pos-ud", TOKEN,
            HubSource("universal_dependencies", "en_ewt", {"train": "train", "eval": "validation"},
                      ("tokens",), "upos"),
            LocalSource("conllu", {"train": "ud_ewt/en_ewt-ud-train.conllu", "eval": "ud_ewt/en_ewt-ud-dev.conllu"},
                        {"column": 3}),
            "token_f1", UPOS_LABELS, lr=5e-4, batch_size=8, epochs=4, max_length=128,
            description="UD English EWT universal POS tags, micro F1 over words",
        ),
        Task(
            "mlm", MLM,
            HubSource("Salesforce/wikitext", "wikitext-103-v1", {"eval": "validation"}, ("text",), None),
            LocalSource("wikitext", {"eval": "wikitext/wikitext-2/wiki.valid.tokens"}),
            "neg_log_perplexity", lr=5e-4, batch_size=8, epochs=0, max_length=128,
            description="masked-LM negative log (pseudo-)perplexity on WikiText validation (paper sec. 5.5)",
            note="pseudo-perplexity (each token masked on its own) with the model's own MLM head, no probe "
            "training; local data is WikiText-2 validation, which holds the same articles as WikiText-103 validation",
        ),
    ]
}  # fmt: skip


DATASET_TASKS = {"conll": ["ner", "pos"], "conll03": ["ner", "pos"], "ud": ["pos-ud"], "udpos": ["pos-ud"]}


def get_task(name: str | Task) -> Task:
    """The registered task called ``name``.

    Raises:
        ValueError: unknown name, with the closest registered names as a suggestion.
    """
    from ..failures import ArgumentError, ArgumentTypeError  # bad usage of --task (exit 2), a ValueError in Python

    if isinstance(name, Task):
        return name
    if not isinstance(name, str):
        raise ArgumentTypeError("task", f"must be a task name (str) or a Task, got the {type(name).__name__} {name!r}")
    key = name.strip().lower().replace("_", "-")
    key = {"sst-2": "sst2", "pos_ud": "pos-ud", "conll2003": "ner"}.get(key, key)
    if key in TASKS:
        return TASKS[key]
    # a dataset's name holding several tasks: its tasks first (CoNLL-2003 is ner and pos, UD English pos-ud)
    close = DATASET_TASKS.get(key.replace("-", "")) or difflib.get_close_matches(key, list(TASKS), n=3, cutoff=0.5)
    hint = f"; did you mean {' or '.join(repr(c) for c in close)}?" if close else ""

    raise ArgumentError("task", f"unknown task {name!r}{hint} (known tasks: {', '.join(TASKS)})")
