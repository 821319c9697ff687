"""Calibration (paper 3.1): unlabelled text -> ``Constants``, one (L, L) matrix per layer and head.

Read top to bottom: ``corpus`` (what text, the one default corpus), ``encoding`` (tokens that fit the slot
layout), ``passes`` (one pass over a corpus, sharded under ``torch.distributed``), ``accumulate`` (fp64 sums
in slots), ``average`` (the paper's average, :func:`calibrate`), ``coverage`` (filling slots no example
reached), ``compaction`` (the compact storage form), ``protocol`` (the one interface of constants) with its two
storages, ``constants`` (:class:`Constants`, dense) and ``structured_constants`` (:class:`StructuredConstants`,
compact: long inputs), and ``data_free`` (the data-free kinds in either storage). Other kinds come from
:mod:`papa_surgery.analysis` (norm-based, effective) and :mod:`papa_surgery.healing` (distilled);
:mod:`papa_surgery.workflow` picks the one a kind needs.
"""

from .average import calibrate
from .constants import Constants
from .corpus import Corpus, bundled_corpus, default_corpus, default_healing_corpus, load_corpus
from .coverage import CoverageWarning
from .encoding import encode
from .structured_constants import StructuredConstants

__all__ = [
    "Constants",
    "Corpus",
    "CoverageWarning",
    "StructuredConstants",
    "bundled_corpus",
    "calibrate",
    "default_corpus",
    "default_healing_corpus",
    "encode",
    "load_corpus",
]
