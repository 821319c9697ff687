"""Calibration corpora and their encoding (papa_surgery.calibration.corpus, .encoding)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import CallCounter, cli  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_pair_lines_with_an_empty_side_are_counted_and_reported(tmp_path, caplog):
    from papa_surgery.calibration.corpus import load_corpus

    path = tmp_path / "pairs.txt"
    path.write_text("a b\tc d\n\tonly second\nfirst only\t\nno tab here\ne f\tg h\n\n")
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    examples = list(load_corpus(path, pairs=True))
    assert examples == [("a b", "c d"), ("e f", "g h")]
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 3 sentence pair" in warnings[0] and "2, 3, 4" in warnings[0]


def test_pair_minimum_length_is_the_true_minimum(tiny_tokenizer):
    from papa_surgery.calibration.encoding import encode

    tok = tiny_tokenizer("bert")
    with pytest.raises(ValueError, match="use at least 5"):
        encode(tok, [("a", "b")], 4, pairs=True)
    encode(tok, [("a", "b")], 5, pairs=True)  # the minimum it names works


def test_a_text_corpus_has_a_length_so_calibration_shows_a_total(tmp_path):
    from papa_surgery.calibration.corpus import load_corpus
    from papa_surgery.calibration.passes import process_batches

    path = tmp_path / "c.txt"
    path.write_text("one\n\ntwo\nthree\nfour\nfive\n")
    corpus = load_corpus(path)
    assert len(corpus) == 5 and len(load_corpus(path, max_examples=3)) == 3
    bar, _ = process_batches(corpus, 2, "calibrate", progress=False)
    assert bar.total == 3
