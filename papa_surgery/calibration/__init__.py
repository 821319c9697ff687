"""Calibration (paper 3.1): unlabelled text -> ``Constants``, one (L, L) matrix per layer and head.

Read top to bottom: ``corpus`` (what text, the one default corpus), ``encoding`` (tokens that fit the slot
layout), ``passes`` (one pass over a corpus, sharded under ``torch.distributed``), ``accumulate`` (fp64 sums
in slots), ``average`` (the paper's average, :func:`calibrate`), ``coverage`` (filling slots no example
reached), ``compaction`` (the compact storage form) and ``constants`` (the :class:`Constants` object and its
file). Other kinds come from :mod:`papa_surgery.analysis` (norm-based, effective) and
:mod:`papa_surgery.healing` (distilled); :mod:`papa_surgery.workflow` picks the one a kind needs.
"""

from .average import calibrate
from .constants import Constants
from .corpus import Corpus, bundled_corpus, default_corpus, load_corpus
from .coverage import CoverageWarning
from .encoding import encode

__all__ = [
    "Constants",
    "Corpus",
    "CoverageWarning",
    "bundled_corpus",
    "calibrate",
    "default_corpus",
    "encode",
    "load_corpus",
]
