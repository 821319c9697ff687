"""The corpora the workflow's steps read: a given one, or the default (calibration's) or the default healing corpus."""

from __future__ import annotations

from ..calibration.corpus import Corpus, default_corpus, default_healing_corpus, load_corpus
from ..options import ArgumentError, spell


def open_corpus(corpus=None, *, pairs: bool = False, max_examples: int | None = None) -> Corpus:
    """A calibration corpus: anything :func:`papa_surgery.calibration.load_corpus` reads, or ``None`` for the one
    default (:func:`papa_surgery.calibration.default_corpus`: WikiText-103 train, offline the bundled excerpt)."""
    if corpus is not None:
        return load_corpus(corpus, pairs=pairs, max_examples=max_examples)
    if pairs:
        raise ArgumentError(
            "pairs", f"{spell('pairs', True)} needs a corpus of sentence pairs (the default corpus is single sentences)"
        )
    return default_corpus(max_examples=max_examples)


def open_healing_corpus(corpus=None, *, pairs: bool = False, max_examples: int | None = None) -> Corpus:
    """A healing corpus: anything :func:`open_corpus` reads, or ``None`` for the default healing corpus
    (:func:`papa_surgery.calibration.default_healing_corpus`: the bundled UD English-EWT sentences, web text of five
    genres, and the WikiText-2 excerpt, on which healing carries to other text further than on the excerpt alone)."""
    check_healing_corpus(corpus, pairs)
    if corpus is not None:
        return open_corpus(corpus, pairs=pairs, max_examples=max_examples)
    return default_healing_corpus(max_examples=max_examples)


def check_healing_corpus(corpus, pairs: bool) -> None:
    """ArgumentError, before anything loads, when a model calibrated on sentence pairs would heal on the default
    healing corpus (single sentences)."""
    if corpus is None and pairs:
        raise ArgumentError(
            "corpus",
            f"a model of sentence-pair constants heals on sentence pairs, and the default healing corpus is single "
            f"sentences: pass a corpus of pairs ({spell('corpus')}, a TAB between the two sentences of a line)",
        )
