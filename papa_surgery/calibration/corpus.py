"""Unlabelled calibration corpora: text files, ``datasets`` objects and folders, Hub specs, lists.

A ``Corpus`` is a re-iterable stream of examples (a string, or a ``(first, second)`` tuple for pairs)
that never holds the whole corpus in memory unless it was given as a list.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import logging
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from ..failures import ArgumentError, ArgumentTypeError, one_line, spell
from .columns import is_table, text_columns
from .file_identity import file_identity

DATA_FILE_TYPES = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet", ".arrow": "arrow"}
DEFAULT_CORPUS_FILE = "wikitext2_valid_excerpt.txt"
HEALING_CORPUS_FILE = "ud_ewt_train_sentences.txt"  # scripts/bundle_healing_corpus.py wrote it
DEFAULT_HUB_CORPUS = "Salesforce/wikitext:wikitext-103-raw-v1:train:text"
DEFAULT_HUB_EXAMPLES = 2000  # lines of DEFAULT_HUB_CORPUS the default corpus reads
DOCUMENTS = "documents:"  # corpus spec prefix: lines joined into whole articles (long-input calibration)
DOCUMENT_WORDS = 8000  # a source with no WikiText headings is cut into documents of about this many words
logger = logging.getLogger("papa_surgery")


@dataclass
class Corpus:
    """A re-iterable stream of calibration examples with a description for provenance."""

    source: Any
    pairs: bool
    description: str
    max_examples: int | None = None
    length: int | None = None
    # Which examples these are, where the description names only a file's name or a list's size (two train.txt in
    # two folders; a file edited since): a hash of a file's or a list's content, a dataset's fingerprint. The same
    # on every process and machine that reads the same text. ``None``: the description says all that is known (a
    # Hub spec, a streamed dataset).
    identity: str | None = None

    def key(self) -> tuple:
        """What identifies these examples across runs and processes: description, identity, pairs and cap."""
        return (self.description, self.identity, self.pairs, self.max_examples)

    def __iter__(self) -> Iterator[str | tuple[str, str]]:
        examples = _iterate(self.source, self.pairs)
        if self.max_examples is not None:
            examples = itertools.islice(examples, self.max_examples)
        return examples

    def __len__(self) -> int:
        length = self.length
        if length is None and isinstance(self.source, Path):
            length = self.length = _count_examples(self.source, self.pairs)  # one quick pass: a bar with an ETA
        if length is None:
            raise TypeError("this corpus is a stream of unknown length")
        return length if self.max_examples is None else min(length, self.max_examples)


def _clean(example, pairs: bool):
    if example is None:  # a missing value in a dataset's column: skipped (and counted) like an empty line
        return None
    if pairs:
        if isinstance(example, str):
            parts = example.split("\t")
            if len(parts) != 2:
                return None
            example = parts
        if any(x is None for x in example):
            return None
        a, b = (str(x).strip() for x in example)
        return (a, b) if a and b else None
    text = str(example).strip()
    return text or None


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    """(line number, text) of a UTF-8 text file; ValueError naming the file and line of invalid bytes."""
    with path.open("rb") as f:
        for number, raw in enumerate(f, start=1):
            try:
                yield number, raw.decode("utf-8").rstrip("\r\n")
            except UnicodeDecodeError as err:
                raise ValueError(
                    f"corpus {path}: line {number} is not valid UTF-8 (byte {err.start + 1}); re-encode the file "
                    f"as UTF-8 (e.g. iconv -t utf-8) or remove the line"
                ) from None


def _count_examples(path: Path, pairs: bool) -> int:
    return sum(1 for _, line in _lines(path) if _clean(line, pairs) is not None)


def _iterate(source, pairs: bool) -> Iterator:
    skipped: list = []  # pairs with no TAB, several TABs or an empty side: counted and reported, never silent
    try:
        if isinstance(source, Path):
            for number, line in _lines(source):
                ex = _clean(line, pairs)
                if ex is not None:
                    yield ex
                elif pairs and line.strip():
                    skipped.append(number)
            return
        for number, raw in enumerate(source, start=1):
            ex = _clean(raw, pairs)
            if ex is not None:
                yield ex
            elif pairs or raw is None:
                skipped.append(number)
    finally:
        if skipped:
            where = f"{source.name} lines" if isinstance(source, Path) else "examples"
            shown = ", ".join(map(str, skipped[:5])) + (", ..." if len(skipped) > 5 else "")
            what = (
                "sentence pair(s) with an empty or missing side or not exactly one TAB"
                if pairs
                else "example(s) with a missing text"
            )
            logger.warning("corpus: skipped %d %s (%s %s)", len(skipped), what, where, shown)


def _from_dataset(ds, pairs: bool, columns, description: str, max_examples, identity: str | None = None) -> Corpus:
    cols = text_columns(ds.column_names or [], pairs, columns)

    class _Rows:
        def __iter__(self):
            for row in ds:
                yield tuple(row[c] for c in cols) if pairs else row[cols[0]]

    length = len(ds) if hasattr(ds, "__len__") else None
    identity = identity or getattr(ds, "_fingerprint", None)  # a streamed dataset has none: its description
    return Corpus(_Rows(), pairs, f"{description} [{', '.join(cols)}]", max_examples, length, identity)


def load_corpus(src, pairs: bool = False, max_examples: int | None = None, columns=None) -> Corpus:
    """Open a calibration corpus.

    Args:
        src: a list of strings (or of ``(first, second)`` pairs); a ``datasets.Dataset`` /
            ``IterableDataset``; a text file (one example per line, a TAB separates a pair); a local
            ``datasets`` folder (``save_to_disk``) or data file (.json/.jsonl/.csv/.tsv/.parquet/.arrow);
            or a Hub dataset spec ``name[:config]:split:column`` (``column1,column2`` for pairs).
        pairs: examples are sentence pairs.
        max_examples: stop after this many examples.
        columns: text column(s) of a dataset, when they are not the usual names.

    Raises:
        ValueError: an unknown source, missing columns, or an empty corpus.
    """
    if isinstance(src, Corpus):
        if max_examples is None:
            return src
        limit = max_examples if src.max_examples is None else min(max_examples, src.max_examples)
        return dataclasses.replace(src, max_examples=limit)
    if isinstance(src, str) and src.startswith(DOCUMENTS):
        corpus = _documents(src[len(DOCUMENTS) :], pairs, max_examples, columns)
    elif isinstance(src, (list, tuple)):
        _check_examples(src, pairs)
        digest = hashlib.sha256(json.dumps(list(src)).encode()).hexdigest()[:32]
        corpus = Corpus(list(src), pairs, f"in-memory list of {len(src)} examples", max_examples, len(src), digest)
    elif hasattr(src, "column_names") and hasattr(src, "__iter__"):
        corpus = _from_dataset(src, pairs, columns, f"datasets object ({type(src).__name__})", max_examples)
    elif isinstance(src, (str, Path)):
        corpus = _from_path_or_spec(str(src), pairs, max_examples, columns)
    else:
        raise ValueError(f"cannot read a corpus from {type(src).__name__}: pass a file, folder, Hub spec or list")
    if _first(corpus) is None:  # bad input, said as the corpus argument's error (the CLI: bad usage of --corpus)
        fix = f"with {spell('pairs', True)} every line needs exactly one TAB" if pairs else "give one example per line"
        raise ArgumentError("corpus", f"the corpus {corpus.description} has no usable examples: {fix}")
    return corpus


class _Articles:
    """Lines of ``lines`` joined into articles: a WikiText top-level heading (`` = Title = ``, not `` = = Sub = = ``)
    starts a new one; a source with no heading at all is cut into documents of about ``DOCUMENT_WORDS`` words."""

    def __init__(self, lines):
        self.lines = lines

    def __iter__(self):
        article: list[str] = []
        words, headed = 0, False
        for line in self.lines:
            text = line.strip()
            heading = text.startswith("= ") and text.endswith(" =") and not text.startswith("= =")
            headed = headed or heading
            if article and (heading or (not headed and words >= DOCUMENT_WORDS)):
                yield " ".join(article)
                article, words = [], 0
            article.append(text)
            words += len(text.split())
        if article:
            yield " ".join(article)


def _documents(inner: str, pairs: bool, max_examples, columns) -> Corpus:
    """``documents:SRC``: the lines of SRC (any source above; empty: the bundled excerpt) as whole articles, for
    calibrating long inputs (each is cut at L tokens, as any example is)."""
    if pairs:
        raise ValueError(f"{DOCUMENTS}... makes single documents; drop {spell('pairs', True)}")
    lines = load_corpus(inner or default_corpus_path(), columns=columns)
    identity = f"documents of {lines.identity}" if lines.identity else None
    return Corpus(_Articles(lines), False, f"documents of {lines.description}", max_examples, None, identity)


def _check_examples(examples, pairs: bool) -> None:
    """TypeError naming the first example of an in-memory corpus that is not a string (or, with pairs, a pair)."""
    for number, example in enumerate(examples, start=1):
        if pairs:
            ok = isinstance(example, str) or (
                isinstance(example, (list, tuple)) and len(example) == 2 and all(isinstance(x, str) for x in example)
            )
            want = "a string with a TAB between the two sentences, or a (first, second) pair of strings"
        else:
            ok = isinstance(example, str)
            pair_hint = f" (for sentence pairs pass {spell('pairs', True)})" if isinstance(example, tuple) else ""
            want = "a string" + pair_hint
        if not ok:
            shown = "None" if example is None else f"the {type(example).__name__} {example!r}"[:80]
            raise ArgumentTypeError("corpus", f"example {number} is {shown}; every example must be {want}")


def _first(corpus: Corpus):
    """The first example (or None), without the skipped-pairs warning of a partial read."""
    logger.disabled, was = True, logger.disabled
    try:
        examples = iter(corpus)
        first = next(examples, None)
        del examples  # finalise the generator now, while the logger is off
        return first
    finally:
        logger.disabled = was


def _from_path_or_spec(src: str, pairs: bool, max_examples, columns) -> Corpus:
    path = Path(src).expanduser()
    if path.is_dir():
        import datasets

        if not any((path / name).is_file() for name in ("dataset_info.json", "state.json", "dataset_dict.json")):
            raise ArgumentError(  # a folder that is no saved dataset (a damaged one gets datasets' own error)
                "corpus",
                f"{src!r} is a folder but not a dataset saved with `save_to_disk`; pass a text file (one example per "
                "line), a .jsonl/.csv/.parquet file, or such a dataset folder",
            )
        ds = datasets.load_from_disk(str(path))
        if isinstance(ds, datasets.DatasetDict):
            split = "train" if "train" in ds else next(iter(ds))
            ds = ds[split]
        return _from_dataset(ds, pairs, columns, f"local dataset {path.name}", max_examples)  # its fingerprint
    if path.is_file():
        if path.suffix in DATA_FILE_TYPES or is_table(path):
            import datasets

            # a table with a header (GLUE's .tsv files), not one example per line: its text columns are read
            table = {"delimiter": "\t", "quoting": 3} if path.suffix == ".tsv" else {}  # 3: csv.QUOTE_NONE
            kind = DATA_FILE_TYPES.get(path.suffix, "csv")
            ds = datasets.load_dataset(kind, data_files=str(path), split="train", **table)
            return _from_dataset(ds, pairs, columns, f"file {path.name}", max_examples, file_identity(path))
        return Corpus(path, pairs, f"text file {path.name}", max_examples, None, file_identity(path))
    parts = src.split(":")
    if len(parts) in (3, 4) and "/" not in parts[-1]:
        return _from_hub_spec(parts, pairs, max_examples)
    raise ArgumentError(
        "corpus",
        f"{src!r} is not a file, a folder or a Hub spec name[:config]:split:column (e.g. {DEFAULT_HUB_CORPUS}): "
        "check the path",
    )


def _from_hub_spec(parts: list[str], pairs: bool, max_examples) -> Corpus:
    import datasets

    name, config, split, column = parts if len(parts) == 4 else (parts[0], None, parts[1], parts[2])
    cols = column.split(",")
    try:
        ds = datasets.load_dataset(name, config, split=split, streaming=True)
    except Exception as err:  # offline, unknown dataset, bad split: one clear cause
        raise ValueError(
            f"could not open Hub dataset {name!r} ({config or 'default'}, split {split!r}): {err}. "
            f"Offline? pass a local {spell('corpus')} (a text file, one example per line) or use the bundled "
            f"excerpt: {spell('corpus', str(default_corpus_path()))}"
        ) from err
    spec = ":".join(parts)
    return _from_dataset(ds, pairs, cols, f"Hub dataset {spec}", max_examples)


def default_corpus_path() -> Path:
    """The WikiText-2 excerpt shipped with papa-surgery (CC BY-SA 3.0, Merity et al. 2016)."""
    return Path(str(resources.files("papa_surgery") / "data" / DEFAULT_CORPUS_FILE))


def bundled_corpus(max_examples: int | None = None) -> Corpus:
    """The WikiText-2 excerpt shipped with papa-surgery: the default corpus when the Hub cannot be reached."""
    return load_corpus(default_corpus_path(), max_examples=max_examples)


def default_corpus(max_examples: int | None = None) -> Corpus:
    """The one default calibration corpus, wherever a corpus is not given (API, CLI, sweeps' ``default``).

    The first ``DEFAULT_HUB_EXAMPLES`` (2,000) lines of WikiText-103 train (``DEFAULT_HUB_CORPUS``) through
    ``datasets``, streamed, or the first ``max_examples``; offline (``HF_HUB_OFFLINE=1``, or the Hub does not answer
    one quick request, asked once per process) the bundled WikiText-2 excerpt, said in one line, as is a Hub corpus
    that cannot be read. The description (which the recipe and the card record) says which corpus and why.
    """
    limit = DEFAULT_HUB_EXAMPLES if max_examples is None else max_examples
    why = _hub_unavailable()
    if why is None:
        try:
            corpus = load_corpus(DEFAULT_HUB_CORPUS, max_examples=limit)
        except Exception as err:  # the Hub, datasets or the stream failing: said below, and recorded
            why = f"WikiText-103 could not be opened ({one_line(err)[:200]})"
        else:
            cap = "the default corpus's length; max_examples to change" if max_examples is None else "max_examples"
            return dataclasses.replace(corpus, description=f"{corpus.description}, first {limit:,} lines ({cap})")
    corpus = bundled_corpus(max_examples)
    if why not in _SAID:
        _SAID.add(why)
        log = logger.info if why == OFFLINE else logger.warning
        log("%s: calibrating on the bundled WikiText-2 excerpt (%s); pass a corpus to choose", why, corpus.description)
    return dataclasses.replace(corpus, description=f"{corpus.description} (the default corpus's stand-in: {why})")


def healing_corpus_path() -> Path:
    """The UD English-EWT training sentences shipped with papa-surgery (CC BY-SA 4.0; data/NOTICE.md)."""
    return Path(str(resources.files("papa_surgery") / "data" / HEALING_CORPUS_FILE))


def distinct_shuffled(lines: Iterable[str], seed: int = 0) -> list[str]:
    """``lines`` stripped, those of three words or more each once, in a seeded shuffle (sorted first, so the order
    depends on the lines alone): the form of the default healing corpus and of the texts it was chosen against."""
    import random

    examples = sorted({line.strip() for line in lines if len(line.split()) >= 3})
    random.Random(seed).shuffle(examples)
    return examples


def default_healing_corpus(max_examples: int | None = None) -> Corpus:
    """The default healing corpus: both texts shipped with papa-surgery, the UD English-EWT training sentences (web
    text: weblogs, newsgroups, emails, reviews, answers) and the WikiText-2 excerpt, 13,766 distinct lines of three
    words or more, shuffled with seed 0 (the order healing holds out every k-th line from).

    Healing learns the source's outputs on the text it is given and carries them to other text only part of the way:
    all-MiniLM-L6-v2 (fraction 1) healed on the excerpt alone agreed with its source on Wikipedia sentences (0.883)
    but less on reviews (SST-2 0.833) and news (CoNLL-2003 0.823); on these two texts together 0.882, 0.859 and
    0.842 (benchmarks/results/bench_heal_domains.txt). Always the bundled files, online or not: a heal is
    reproducible. Text like the user's own does better still.
    """
    examples = distinct_shuffled(itertools.chain(load_corpus(healing_corpus_path()), bundled_corpus()))
    corpus = load_corpus(examples, max_examples=max_examples)
    description = (
        f"the default healing corpus: the bundled UD English-EWT training sentences ({HEALING_CORPUS_FILE}) and "
        f"WikiText-2 excerpt ({DEFAULT_CORPUS_FILE}), {len(examples):,} lines"
    )
    return dataclasses.replace(corpus, description=description)


OFFLINE = "HF_HUB_OFFLINE=1"
_SAID: set[str] = set()


def _hub_unavailable() -> str | None:
    """Why the Hub cannot serve the default corpus (``None``: it can): offline mode, or no answer."""
    from huggingface_hub import constants

    if constants.HF_HUB_OFFLINE:
        return OFFLINE
    from ..models.loading import hub_reachable

    return None if hub_reachable() else "the Hugging Face Hub does not answer"
