"""Calibration corpora (``papa_surgery.calibration.corpus``): what a corpus may hold, and the one default corpus."""

from __future__ import annotations

import logging

import pytest

from papa_surgery.calibration.corpus import load_corpus


def test_a_missing_text_in_a_dataset_is_skipped_and_counted_never_read_as_none(caplog):
    """A ``None`` in a dataset's text column is a missing example, not the text "None"."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["first", None, "third"]})
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        examples = list(load_corpus(ds))
    assert examples == ["first", "third"]
    assert "skipped 1 example(s) with a missing text" in caplog.text and "examples 2" in caplog.text
    pairs = datasets.Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": [None, "d"]})
    assert list(load_corpus(pairs, pairs=True)) == [("b", "d")]
