"""Outputs appear whole or not at all: races, signals and permissions of staged writes (papa_surgery.outputs)."""

from __future__ import annotations

import json
import logging
import os
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CallCounter, cli, default_sigint  # noqa: F401

from papa_surgery.cli import main
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.outputs.staging import OutputExistsError, leftovers

REPO_ROOT = Path(__file__).resolve().parents[1]


def hidden_siblings(target: Path) -> list[Path]:
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}"))


@pytest.mark.parametrize("intruder", ["empty folder", "folder with a file", "file"])
def test_output_that_appears_during_the_save_is_never_replaced(papa_model, tmp_path, monkeypatch, intruder):
    model, tokenizer = papa_model
    out = tmp_path / "out"
    original = type(model).save_pretrained

    def save_then_intrude(self, folder, *args, **kwargs):  # another run (or the user) creates --out meanwhile
        original(self, folder, *args, **kwargs)
        if intruder == "file":
            out.write_text("the user's notes")
        else:
            out.mkdir()
            if intruder == "folder with a file":
                (out / "notes.txt").write_text("the user's notes")

    monkeypatch.setattr(type(model), "save_pretrained", save_then_intrude)
    with pytest.raises(OutputExistsError) as info:
        save_checkpoint(model, out, tokenizer=tokenizer)
    if intruder == "file":
        assert out.read_text() == "the user's notes"
    else:
        assert [p.name for p in out.iterdir()] == (["notes.txt"] if intruder == "folder with a file" else [])
    kept = info.value.kept
    assert kept is not None and (kept / "config.json").is_file() and (kept / "model.safetensors").is_file()
    assert str(kept) in str(info.value) and not kept.name.startswith(".")
    assert not leftovers(out)


def _files(folder: Path) -> dict:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("failure", ["interrupt", "rename fails", "appears"])
def test_a_replacement_that_fails_at_the_last_step_puts_the_previous_output_back(
    papa_model, tmp_path, monkeypatch, caplog, failure
):
    """``--overwrite`` moves the previous output aside, then the new one in. When that last move was interrupted
    (Ctrl-C) or failed, the previous output stayed under a hidden staging-like name and the target was gone; the next
    run to the same target then deleted it as a killed run's leftover. Now it goes back (or, when the target was
    taken meanwhile, beside it under a visible name), and no later run removes it."""
    from papa_surgery.outputs import staging

    model, tokenizer = papa_model
    out = save_checkpoint(model, tmp_path / "out", tokenizer=tokenizer)
    before = _files(out)
    real = staging.rename_noreplace

    def last_move_fails(src, dst):
        if Path(dst) == out and Path(src).name.startswith(".out.papa-staging-"):
            if failure == "interrupt":
                raise KeyboardInterrupt
            if failure == "rename fails":
                raise PermissionError(13, "Permission denied", str(dst))
            out.mkdir()  # another run (or the user) takes the target between the two moves
            (out / "notes.txt").write_text("the user's notes")
        return real(src, dst)

    monkeypatch.setattr(staging, "rename_noreplace", last_move_fails)
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    expected = {"interrupt": KeyboardInterrupt, "rename fails": PermissionError, "appears": OutputExistsError}
    with pytest.raises(expected[failure]):
        save_checkpoint(model, out, tokenizer=tokenizer, overwrite=True)
    monkeypatch.setattr(staging, "rename_noreplace", real)
    if failure == "appears":
        assert _files(out) == {"notes.txt": b"the user's notes"}
        previous = [p for p in tmp_path.iterdir() if p.name.startswith("out.papa-previous-")]
        assert len(previous) == 1 and _files(previous[0]) == before
        assert any(str(previous[0]) in r.getMessage() for r in caplog.records)
    else:
        assert _files(out) == before
    assert not hidden_siblings(out)
    if failure != "appears":  # the next run replaces it as asked, and nothing of the user's was lost meanwhile
        save_checkpoint(model, out, tokenizer=tokenizer, overwrite=True)
        assert (out / "config.json").is_file() and not hidden_siblings(out)


def test_an_output_a_killed_run_moved_aside_is_put_back_by_the_next_run(papa_model, tmp_path, caplog):
    """A run killed (SIGKILL) after moving the output it replaces aside, before its result moved in, left the target
    missing and the old output hidden, which no later run looked at: the next run to that target puts it back
    (and, as asked, replaces it with --overwrite); one whose replacement is in place is removed."""
    model, tokenizer = papa_model
    out = save_checkpoint(model, tmp_path / "out", tokenizer=tokenizer)
    before = _files(out)
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(gone.stdout)
    aside = tmp_path / f".out.papa-previous-{dead}-abcd1234"
    out.rename(aside)
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    with pytest.raises(FileExistsError, match="already exists"):  # put back first, so it is not replaced unasked
        save_checkpoint(model, out, tokenizer=tokenizer)
    assert _files(out) == before and not aside.exists()
    assert any("put" in r.getMessage() and str(dead) in r.getMessage() for r in caplog.records)
    aside.mkdir()  # a replaced output left beside the result that replaced it: removed
    (aside / "config.json").write_text("{}")
    save_checkpoint(model, out, tokenizer=tokenizer, overwrite=True)
    assert not aside.exists() and (out / "config.json").is_file() and not hidden_siblings(out)


def test_a_result_kept_where_it_was_made_is_not_removed(papa_model, tmp_path, monkeypatch):
    """When the target changed meanwhile (a file of the user's appeared in it) the result is kept beside it; when
    that move failed too, the error named the staging folder as where it was kept, which was then removed."""
    from papa_surgery.outputs import staging

    model, tokenizer = papa_model
    out = save_checkpoint(model, tmp_path / "out", tokenizer=tokenizer)
    original, real = type(model).save_pretrained, staging.rename_noreplace

    def save_then_intrude(self, folder, *args, **kwargs):
        original(self, folder, *args, **kwargs)
        (out / "notes.txt").write_text("the user's notes")

    def no_visible_name(src, dst):
        if Path(dst).name.startswith("out.papa-"):
            raise PermissionError(13, "Permission denied", str(dst))
        return real(src, dst)

    monkeypatch.setattr(type(model), "save_pretrained", save_then_intrude)
    monkeypatch.setattr(staging, "rename_noreplace", no_visible_name)
    with pytest.raises(ValueError, match="changed while this run worked") as info:
        save_checkpoint(model, out, tokenizer=tokenizer, overwrite=True)
    kept = info.value.kept
    assert str(kept) in str(info.value) and (kept / "config.json").is_file() and (out / "notes.txt").is_file()


def test_overwrite_replaces_only_a_checkpoint_or_an_empty_folder(papa_model, tmp_path):
    model, tokenizer = papa_model
    project = tmp_path / "project"
    project.mkdir()
    (project / "thesis.tex").write_text("years of work")
    with pytest.raises(ValueError, match="other content"):
        save_checkpoint(model, project, tokenizer=tokenizer, overwrite=True)
    assert (project / "thesis.tex").read_text() == "years of work"
    out = tmp_path / "ckpt"
    save_checkpoint(model, out, tokenizer=tokenizer)
    save_checkpoint(model, out, tokenizer=tokenizer, overwrite=True)  # an earlier checkpoint: replaced
    assert (out / "config.json").is_file() and not hidden_siblings(out)


SLOW_SAVE = r"""
import sys, time
from pathlib import Path
import transformers

original = transformers.PreTrainedModel.save_pretrained

def slow_save(self, folder, *args, **kwargs):
    original(self, folder, *args, **kwargs)
    Path(sys.argv[1]).write_text(str(folder))  # tell the test: inside the save window
    time.sleep(120)

transformers.PreTrainedModel.save_pretrained = slow_save
from papa_surgery.cli import main
main(sys.argv[2:], prog_name="papa-surgery")
"""


def start_slow_convert(source: str, out: Path, ready: Path) -> subprocess.Popen:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    args = ["convert", source, "--fraction", "0.5", "--kind", "identity", "--method", "first-to-last"]
    args += ["--max-length", "16", "--out", str(out)]
    return subprocess.Popen(
        [sys.executable, "-c", SLOW_SAVE, str(ready), "-q", *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=default_sigint,
    )


def wait_for(path: Path, proc: subprocess.Popen, timeout: float = 300) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if proc.poll() is not None:
            raise AssertionError(f"convert ended early: {proc.stderr.read()}")
        if time.monotonic() > deadline:
            proc.kill()
            raise AssertionError("convert never reached the save")
        time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_sigterm_and_sigint_during_the_save_leave_nothing(source, tmp_path, signum):
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = start_slow_convert(source, out, ready)
    wait_for(ready, proc)
    staging = Path(ready.read_text())
    assert staging.is_dir() and (staging / "config.json").is_file()  # a complete-looking folder exists now
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=120)
    assert proc.returncode != 0
    if signum == signal.SIGTERM:
        assert proc.returncode == 128 + signal.SIGTERM and "SIGTERM" in stderr
    assert not out.exists() and not hidden_siblings(out), stderr


def test_leftovers_of_a_killed_run_are_removed_by_the_next_run(source, tmp_path, caplog):
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = start_slow_convert(source, out, ready)
    wait_for(ready, proc)
    proc.kill()  # SIGKILL: nothing can clean up
    proc.communicate(timeout=60)
    left = hidden_siblings(out)
    assert left, "a killed save leaves its staging folder"
    # A staging folder of a run that is still alive (this test's pid) is left alone.
    alive = out.parent / f".{out.name}.papa-staging-{os.getpid()}-abcd1234"
    alive.mkdir()
    (alive / ".papa-staging.json").write_text(json.dumps({"pid": os.getpid(), "host": os.uname().nodename}))
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    args = ["convert", source, "--fraction", "0.5", "--kind", "identity", "--method", "first-to-last"]
    result = CliRunner().invoke(main, [*args, "--max-length", "16", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert (out / "config.json").is_file()
    assert hidden_siblings(out) == [alive]
    assert any(str(left[0]) in r.getMessage() and "interrupted" in r.getMessage() for r in caplog.records)


def test_outputs_follow_the_umask(papa_model, source, tmp_path):
    model, tokenizer = papa_model
    old = os.umask(0o022)
    try:
        out = save_checkpoint(model, tmp_path / "ckpt", tokenizer=tokenizer)
        consts = tmp_path / "c.safetensors"
        from papa_surgery.calibration.constants import Constants

        Constants.from_kind("identity", 2, 4, 8).save(consts)
    finally:
        os.umask(old)
    assert stat.S_IMODE(out.stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "config.json").stat().st_mode) == 0o644
    assert stat.S_IMODE(consts.stat().st_mode) == 0o644
