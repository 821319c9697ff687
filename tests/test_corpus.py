"""Calibration corpora and their encoding (papa_surgery.calibration.corpus, .encoding)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from conftest import CallCounter, cli  # noqa: F401

from papa_surgery.calibration.corpus import load_corpus

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


def test_a_missing_text_in_a_dataset_is_skipped_and_counted_never_read_as_none(caplog):
    """A ``None`` in a dataset's text column is a missing example, not the text "None"."""
    datasets = pytest.importorskip("datasets")
    ds = datasets.Dataset.from_dict({"text": ["first", None, "third"]})
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        examples = list(load_corpus(ds))
    assert examples == ["first", "third"]
    assert "skipped 1 example(s) with a missing text" in caplog.text and "examples 2" in caplog.text
    pairs = datasets.Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": [None, "d"]})
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        assert list(load_corpus(pairs, pairs=True)) == [("b", "d")]
    assert "skipped 1 sentence pair(s) with an empty or missing side" in caplog.text


@pytest.fixture
def silent_hub():
    """A local endpoint that accepts connections and closes them unanswered, counting them (the Hub, unreachable)."""
    import socket
    import threading

    server = socket.create_server(("127.0.0.1", 0))
    server.settimeout(0.2)
    connections = []
    stop = threading.Event()

    def serve():
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            connections.append(conn.recv(200))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}", connections
    stop.set()
    thread.join()
    server.close()


@pytest.mark.parametrize("quiet", [False, True])
def test_an_unreachable_hub_is_asked_once_and_convert_falls_back_in_one_line(tiny_folder, tmp_path, silent_hub, quiet):
    """Offline without HF_HUB_OFFLINE=1: one quick question to the Hub, then the bundled excerpt, said once."""
    import json
    import os
    import subprocess
    import sys

    endpoint, connections = silent_hub
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")
    }
    env.update(HF_ENDPOINT=endpoint, HF_HOME=str(tmp_path / "hf"), HF_HUB_ETAG_TIMEOUT="1", HF_HUB_DOWNLOAD_TIMEOUT="1")
    command = [
        sys.executable, "-m", "papa_surgery", *(["-q"] if quiet else []), "convert", str(tiny_folder("bert")),
        "--fraction", "0.5", "--max-length", "16", "--max-examples", "16", "--out", str(tmp_path / "out"),
    ]  # fmt: skip
    run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-2000:]
    lines = [line for line in run.stderr.splitlines() if line.strip() and "%|" not in line]  # no progress bars
    said = [line for line in lines if "bundled" in line]
    assert len(connections) == 1 and connections[0].startswith(b"HEAD ")  # asked once, never retried
    assert not any("retry" in line.lower() for line in lines), lines
    if quiet:
        assert said == []  # -q: no warnings
    else:
        assert said == lines and len(said) == 1 and "does not answer" in said[0], lines
    recipe = json.loads((tmp_path / "out" / "papa_recipe.json").read_text())
    assert "wikitext2_valid_excerpt" in recipe["corpus"]["description"] and recipe["corpus"]["examples"] == 16


def test_documents_join_lines_into_articles_at_wikitext_headings(tmp_path):
    """``documents:SRC`` joins lines into whole articles at top-level headings; sub-headings stay inside."""
    from papa_surgery.calibration.corpus import load_corpus

    path = tmp_path / "wiki.txt"
    path.write_text(" = First = \n\n one line .\n = = Part = = \n two line .\n = Second = \n three .\n")
    docs = list(load_corpus(f"documents:{path}"))
    assert docs == ["= First = one line . = = Part = = two line .", "= Second = three ."]
    assert load_corpus(f"documents:{path}").description == "documents of text file wiki.txt"


def test_documents_of_the_bundled_excerpt_offline():
    """The bundled excerpt has no headings: documents of about DOCUMENT_WORDS words, every line used once."""
    from papa_surgery.calibration.corpus import DOCUMENT_WORDS, bundled_corpus, load_corpus

    docs = list(load_corpus("documents:"))
    lines = list(bundled_corpus())
    assert len(docs) > 5 and " ".join(docs) == " ".join(lines)
    assert all(len(d.split()) >= DOCUMENT_WORDS for d in docs[:-1])
    with pytest.raises(ValueError, match="single documents"):
        load_corpus("documents:", pairs=True)


def test_a_missing_or_empty_corpus_is_bad_usage_of_corpus_naming_the_fix(source, tmp_path, calibrations):
    """A ``--corpus`` path that is not there, or a file with no example in it, is bad usage (exit 2) of ``--corpus``,
    said with its fix, before anything is calibrated or written (it was a failed run, exit 1, naming no flag)."""
    out = tmp_path / "out"
    result = cli("convert", source, "--fraction", 0.5, "--corpus", tmp_path / "nope.txt", "--out", out)
    assert result.exit_code == 2 and "'--corpus'" in result.output and "nope.txt" in result.output, result.output
    assert "check the path" in result.output
    blank = tmp_path / "blank.txt"
    blank.write_text("\n  \n\n")
    result = cli("calibrate", source, "--corpus", blank, "--max-length", 16, "--out", tmp_path / "c.safetensors")
    assert result.exit_code == 2 and "'--corpus'" in result.output, result.output
    assert "no usable examples: give one example per line" in " ".join(result.output.split())
    assert calibrations.calls == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["blank.txt"]
    folder = tmp_path / "texts"  # a folder that is no saved dataset: it was datasets' own error, naming no flag
    folder.mkdir()
    result = cli("calibrate", source, "--corpus", folder, "--max-length", 16, "--out", tmp_path / "c.safetensors")
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "'--corpus'" in said and "not a dataset saved with `save_to_disk`" in said, said
    assert calibrations.calls == 0 and sorted(p.name for p in tmp_path.iterdir()) == ["blank.txt", "texts"]


def test_a_corpus_is_known_by_its_text_not_by_where_or_when_it_was_opened(tmp_path, monkeypatch):
    """The cache key of a corpus (``Corpus.key``): a streamed Hub dataset has no fingerprint, and keying it by the
    object made every opening a new corpus (a sweep calibrated again for every cell); a file is known by its content,
    the same on every process and machine, and two files of one name with other text differ."""
    import datasets

    rows = {"text": ["the cat sat", "a dog ran"]}
    monkeypatch.setattr(
        datasets, "load_dataset", lambda *a, **k: datasets.Dataset.from_dict(rows).to_iterable_dataset()
    )
    assert len({load_corpus("someone/text:train:text").key() for _ in range(3)}) == 1
    for folder, text in (("a", "the cat sat\n"), ("b", "the cat sat\n"), ("c", "stocks fell\n")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.txt").write_text(text)
    a, b, c = (load_corpus(tmp_path / f / "train.txt") for f in "abc")
    assert a.key() == b.key() != c.key() and a.description == c.description
    assert load_corpus(["x", "y"]).key() != load_corpus(["x", "z"]).key()


def test_a_tsv_file_is_read_as_a_table_of_columns(tmp_path):
    """A GLUE-style .tsv was read as one example per line: its header, labels, ids and tabs went into the constants.
    Its text column is read; a table with none of the usual names is refused naming its columns."""
    (tmp_path / "sst2.tsv").write_text('sentence\tlabel\nit \'s a "charming" journey .\t1\na dull film\t0\n')
    assert list(load_corpus(tmp_path / "sst2.tsv")) == ['it \'s a "charming" journey .', "a dull film"]
    (tmp_path / "mrpc.tsv").write_text("Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n1\t7\t8\tone text\tother text\n")
    with pytest.raises(ValueError, match=r"needs a text column .* its columns are \['Quality'"):
        load_corpus(tmp_path / "mrpc.tsv")
    assert list(load_corpus(tmp_path / "mrpc.tsv", pairs=True, columns=["#1 String", "#2 String"])) == [
        ("one text", "other text")
    ]
    # a .tsv with no header is the text format: one example per line, a TAB between a pair (as it always was)
    (tmp_path / "pairs.tsv").write_text("a good film\ta dull movie\nsome text\tmore text\n")
    assert list(load_corpus(tmp_path / "pairs.tsv", pairs=True)) == [
        ("a good film", "a dull movie"),
        ("some text", "more text"),
    ]
    (tmp_path / "lines.tsv").write_text("a good film\na dull movie\n")
    assert list(load_corpus(tmp_path / "lines.tsv")) == ["a good film", "a dull movie"]
