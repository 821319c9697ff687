"""Issue 10, item 3: resuming a sweep is option-aware, equal fractions are one cell, and concurrent sweeps on one
results file never run or write a cell twice."""

from __future__ import annotations

import json
import os
import threading

import pytest
from test_sweep import CountingProbe, config, write_sst2

import papa_surgery.probing as probe_pkg  # the package whose ``probe`` a sweep calls
from papa_surgery.experiments import parse_fractions, run_sweep
from papa_surgery.experiments.results import cell_key, read_rows


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("resume-data"))


@pytest.mark.parametrize(
    "change",
    [{"max_length": 16}, {"max_train_examples": 20}, {"epochs": 2}, {"lr": 1e-3}, {"max_eval_examples": 8}],
    ids=lambda c: next(iter(c)),
)
def test_resume_with_a_score_changing_option_is_refused(tiny_folder, data_dir, tmp_path, monkeypatch, change):
    model_dir = tiny_folder("bert")
    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(probe_pkg, "probe", CountingProbe())
    run_sweep(config(model_dir, data_dir, fractions=(0.0,), seeds=1), out, progress=False)
    before = out.read_bytes()
    counter = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", counter)
    name = next(iter(change))
    with pytest.raises(ValueError, match=f"made with {name}="):  # the Python API names the argument
        run_sweep(config(model_dir, data_dir, fractions=(0.0,), seeds=1, **change), out, progress=False)
    assert counter.calls == 0 and out.read_bytes() == before  # the old rows are not reported as this run's


def test_same_options_spelled_differently_resume(tiny_folder, data_dir, tmp_path, monkeypatch):
    model_dir = tiny_folder("bert")
    out = tmp_path / "r.jsonl"
    monkeypatch.setattr(probe_pkg, "probe", CountingProbe())
    run_sweep(config(model_dir, data_dir, fractions=(0.0,), seeds=1, epochs=None), out, progress=False)
    counter = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", counter)
    run_sweep(config(model_dir, data_dir, fractions=(0.0,), seeds=1, epochs=4), out, progress=False)  # sst2's default
    assert counter.calls == 0


def test_equal_fractions_are_one_cell(tiny_folder, data_dir, tmp_path, monkeypatch):
    assert parse_fractions("0.5,1/2,0.50") == (0.5,)
    counter = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", counter)
    out = tmp_path / "r.jsonl"
    rows = run_sweep(config(tiny_folder("bert"), data_dir, fractions=(0.0, 0.0, 1e-12), seeds=1), out, progress=False)
    assert len(rows) == 1 and len(read_rows(out)) == 1 and counter.calls == 1


def test_two_sweeps_on_one_file_run_each_cell_once(tiny_folder, data_dir, tmp_path, monkeypatch):
    model_dir = tiny_folder("bert")
    out = tmp_path / "r.jsonl"
    cfg = config(model_dir, data_dir, fractions=(0.0,), seeds=2)
    both_started = threading.Barrier(2)
    real = probe_pkg.probe
    calls = []

    def probe(*args, **kwargs):
        calls.append(1)
        try:  # without a lock both sweeps reach their first cell together; with it the second one waits
            both_started.wait(timeout=5)
        except threading.BrokenBarrierError:
            pass
        return real(*args, **kwargs)

    monkeypatch.setattr(probe_pkg, "probe", probe)
    errors = []

    def sweep():
        try:
            run_sweep(cfg, out, progress=False)
        except Exception as err:  # pragma: no cover - reported below
            errors.append(err)

    threads = [threading.Thread(target=sweep) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)
    assert not errors
    rows = read_rows(out)
    assert len(rows) == 2 and len({cell_key(r) for r in rows}) == 2
    assert len(calls) == 2


def test_a_sweep_that_fails_before_its_first_row_leaves_no_results_file(tiny_folder, tmp_path):
    """A failed sweep left a 0-byte results file (``--corpus missing.txt``: exit 2 and an empty ``r.jsonl``); a file
    the sweep did not create stays, even empty."""
    from click.testing import CliRunner
    from test_sweep import write_sst2

    from papa_surgery.cli import main

    data = write_sst2(tmp_path / "data")
    args = ["probe", str(tiny_folder("bert")), "--task", "sst2", "--data-dir", str(data), "--fractions", "1"]
    for out in (tmp_path / "new.jsonl", tmp_path / "sub" / "new.jsonl"):
        result = CliRunner().invoke(main, [*args, "--corpus", str(tmp_path / "missing.txt"), "--out", str(out)])
        assert result.exit_code == 2 and "--corpus" in result.output, result.output
        assert not out.exists()
    mine = tmp_path / "mine.jsonl"
    mine.touch()
    result = CliRunner().invoke(main, [*args, "--corpus", str(tmp_path / "missing.txt"), "--out", str(mine)])
    assert result.exit_code == 2 and mine.is_file() and mine.stat().st_size == 0


def test_a_sweep_waiting_on_one_that_made_nothing_locks_the_file_at_the_path(tmp_path, caplog):
    """Sweep A made the results file and wrote no row, so it removes the file as it ends; sweep B, waiting all
    along on the lock of A's file, must then lock the file at the path (or a third sweep would run beside it, the
    same cells twice), and its rows land there. A file whose rows were written is never removed."""
    import fcntl
    import logging
    import threading
    import time

    from papa_surgery.experiments.results import append_row, locked

    path = tmp_path / "r.jsonl"
    inside, leave = threading.Event(), threading.Event()

    def second():
        with locked(path):
            inside.set()
            leave.wait(10)
            append_row(path, {"row": "b"})

    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        with locked(path):
            thread = threading.Thread(target=second)
            thread.start()
            for _ in range(100):  # until B is waiting on this lock
                if any("waiting for it to finish" in r.getMessage() for r in caplog.records):
                    break
                time.sleep(0.05)
            assert any("waiting for it to finish" in r.getMessage() for r in caplog.records)
    assert inside.wait(10)
    with open(path, "a") as third:  # B holds the lock of the file at the path: a third sweep would wait
        with pytest.raises(OSError):
            fcntl.flock(third.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    leave.set()
    thread.join(10)
    assert json.loads(path.read_text()) == {"row": "b"}
    moved = tmp_path / "moved.jsonl"  # a file replaced at the path while a sweep wrote: its rows are kept
    with locked(moved):
        os.replace(path, moved)
    assert json.loads(moved.read_text()) == {"row": "b"}


def test_a_results_link_to_nothing_is_refused(tmp_path):
    """Appending through a link to nothing would make a file where it leads, silently (and removing it after a
    failure removed the user's link)."""
    from papa_surgery.outputs.overwrite import check_results_file

    link = tmp_path / "r.jsonl"
    link.symlink_to(tmp_path / "elsewhere.jsonl")
    with pytest.raises(ValueError, match="symbolic link to .*which does not exist"):
        check_results_file(link)
    assert link.is_symlink() and not (tmp_path / "elsewhere.jsonl").exists()
