"""Issue 10: nothing the user has is lost (races, signals, permissions, overwrites); failures come early and clearly."""

from __future__ import annotations

import importlib
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
from fake_hub import build_tiny_checkpoint

from papa_surgery.cli import main
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.outputs.staging import OutputExistsError, leftovers

REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def papa_model(tmp_path_factory):
    _, model, tokenizer = build_tiny_checkpoint(tmp_path_factory.mktemp("ckpt") / "tiny-papa")
    return model, tokenizer


@pytest.fixture
def source(tiny_folder):
    return str(tiny_folder("bert"))


def hidden_siblings(target: Path) -> list[Path]:
    return sorted(p for p in target.parent.iterdir() if p.name.startswith(f".{target.name}"))


# ---------------------------------------------------------------------------------------------- 1. output race
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


# ---------------------------------------------------------------------------------------------- 2. signals
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


# ---------------------------------------------------------------------------------------------- 4. permissions
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


# ---------------------------------------------------------------------------------------------- CLI helpers
@pytest.fixture
def corpus(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(["the cat sat on the mat", "a dog ran off", "it was a good movie", "the end"] * 3))
    return path


def cli(*args):
    return CliRunner().invoke(main, ["-q", *map(str, args)])


class CallCounter:
    def __init__(self, real):
        self.real, self.calls = real, 0

    def __call__(self, *args, **kwargs):
        self.calls += 1
        return self.real(*args, **kwargs)


@pytest.fixture
def calibrations(monkeypatch):
    """Counts calibrations (the first expensive step), to prove a failure came before any."""
    calibrate_mod = importlib.import_module("papa_surgery.calibration.average")

    counter = CallCounter(calibrate_mod.calibrate)
    monkeypatch.setattr(calibrate_mod, "calibrate", counter)
    return counter


# ---------------------------------------------------------------------------------------------- 5. calibrate overwrite
def test_calibrate_refuses_to_overwrite_without_the_flag(source, corpus, tmp_path, calibrations):
    from papa_surgery.calibration.constants import Constants

    out = Constants.from_kind("identity", 2, 4, 8).save(tmp_path / "c.safetensors")  # an earlier constants file
    precious = out.read_bytes()  # (--overwrite replaces nothing else: tests/test_overwrite.py)
    result = cli("calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", out)
    assert result.exit_code == 1 and "--overwrite" in result.output and str(out) in result.output
    assert out.read_bytes() == precious and calibrations.calls == 0
    result = cli("calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert Constants.load(out).max_length == 16


# ---------------------------------------------------------------------------------------------- 6. limits before work
@pytest.mark.parametrize("command", ["calibrate", "convert", "analyze"])
def test_max_length_above_the_position_limit_is_refused_before_work(source, corpus, tmp_path, calibrations, command):
    out = tmp_path / "out"
    args = {
        "calibrate": ["calibrate", source, "--corpus", corpus, "--out", out],
        "convert": ["convert", source, "--fraction", 0.5, "--corpus", corpus, "--out", out],
        "analyze": ["analyze", source, "norms", "--corpus", corpus, "--out", out],
    }[command]
    result = cli(*args, "--max-length", 200)  # the tiny models have 96 positions
    assert result.exit_code == 2, result.output
    assert "--max-length" in result.output and "96" in result.output
    assert not out.exists() and calibrations.calls == 0


def test_rank_checks_the_task_data_before_calibrating(source, corpus, tmp_path, calibrations):
    empty = tmp_path / "data"
    empty.mkdir()
    result = cli(
        "rank", source, "--method", "lambda", "--task", "sst2", "--data-dir", empty, "--corpus", corpus,
        "--max-length", 16, "--out", tmp_path / "r.json",
    )  # fmt: skip
    assert result.exit_code == 1 and "sst2" in result.output, result.output
    assert calibrations.calls == 0 and not (tmp_path / "r.json").exists()


# ---------------------------------------------------------------------------------------------- 7. --push
@pytest.fixture
def fake_hub(tmp_path, monkeypatch):
    from fake_hub import FakeHub
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    monkeypatch.setenv("HF_TOKEN", "hf_user_token")
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        yield server


def test_convert_push_derives_the_repo_id_like_push_to_hub(source, tmp_path, fake_hub):
    out = tmp_path / "tiny-papa-0.5"
    result = CliRunner().invoke(
        main,
        ["convert", source, "--fraction", "0.5", "--kind", "identity", "--method", "first-to-last",
         "--max-length", "16", "--out", str(out), "--push"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    assert fake_hub.commit_count("user/tiny-papa-0.5") == 1
    again = CliRunner().invoke(main, ["push", str(out)])  # push without --repo-id: the same default
    assert again.exit_code == 0, again.output and "user/tiny-papa-0.5" in again.output


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--repo-id", "bad id!"], 2, "--repo-id"),
        (["--repo-id", "someone-else/x"], 1, "cannot create repos in 'someone-else'"),
        (["--repo-id", "user/x", "TOKEN="], 1, "token"),
    ],
    ids=["syntax", "namespace", "token"],
)
def test_push_target_is_checked_before_calibrating(
    source, corpus, tmp_path, fake_hub, calibrations, monkeypatch, extra, code, message
):
    if extra[-1] == "TOKEN=":
        monkeypatch.setenv("HF_TOKEN", "hf_wrong_token")
        extra = extra[:-1]
    out = tmp_path / "o"
    result = CliRunner().invoke(
        main,
        ["convert", source, "--fraction", "0.5", "--corpus", str(corpus), "--max-length", "16", "--out", str(out),
         "--push", *extra],
    )  # fmt: skip
    assert result.exit_code == code, result.output
    assert message in result.output.lower() or message in result.output
    assert calibrations.calls == 0 and not out.exists()


# ---------------------------------------------------------------------------------------------- 8. fingerprint
def test_constants_are_checked_by_identity_not_by_folder_name(tiny, corpus, tmp_path, calibrations):
    first = tiny.save("bert", tmp_path / "x1" / "model")
    other_weights = tiny.save("bert", tmp_path / "x2" / "model", seed=1)
    consts = tmp_path / "c.safetensors"
    assert cli("calibrate", first, "--corpus", corpus, "--max-length", 16, "--out", consts).exit_code == 0
    result = cli("convert", other_weights, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 1 and "other attention weights" in result.output, result.output
    other_family = tiny.save("electra", tmp_path / "x3" / "model")
    result = cli("convert", other_family, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 1 and "model_type" in result.output, result.output
    renamed = tiny.save("bert", tmp_path / "copy-of-x1")  # the same weights under another name: accepted
    result = cli("convert", renamed, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output


# ---------------------------------------------------------------------------------------------- 9. silent wrong answers
def test_non_finite_variance_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from papa_surgery.calibration.constants import Constants

    values = torch.full((2, 4, 8, 8), 1 / 8)
    variance = torch.zeros(2, 4, dtype=torch.float64)
    variance[0, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        Constants(values, "average", 8, variance=variance)
    path = tmp_path / "c.safetensors"
    meta = {"format": "papa-constants", "kind": "average", "max_length": "8", "pairs": "false", "provenance": "{}"}
    save_file({"values": values, "variance": variance}, str(path), metadata=meta)
    with pytest.raises(ValueError, match=r"c\.safetensors.*NaN"):
        Constants.load(path)


def test_calibration_options_with_constants_are_not_silently_ignored(source, corpus, tmp_path):
    consts = tmp_path / "c.safetensors"
    assert cli("calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", consts).exit_code == 0
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--max-length", 32, "--out", tmp_path / "o"
    )
    assert result.exit_code == 2 and "--max-length" in result.output and "16" in result.output
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--corpus", corpus, "--out", tmp_path / "o"
    )
    assert result.exit_code == 2 and "--corpus" in result.output
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--max-length", 16, "--out", tmp_path / "o"
    )
    assert result.exit_code == 0, result.output  # the same L is fine


def test_pair_lines_with_an_empty_side_are_counted_and_reported(tmp_path, caplog):
    from papa_surgery.calibration.corpus import load_corpus

    path = tmp_path / "pairs.txt"
    path.write_text("a b\tc d\n\tonly second\nfirst only\t\nno tab here\ne f\tg h\n\n")
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    examples = list(load_corpus(path, pairs=True))
    assert examples == [("a b", "c d"), ("e f", "g h")]
    warnings = [r.getMessage() for r in caplog.records if "skipped" in r.getMessage()]
    assert len(warnings) == 1 and "skipped 3 sentence pair" in warnings[0] and "2, 3, 4" in warnings[0]


def test_a_pair_as_inputs_embeds_is_not_silently_one_segment(papa_model):
    import torch

    model, tokenizer = papa_model
    enc = tokenizer("the cat sat", "a dog ran", return_tensors="pt")
    with torch.no_grad():
        by_ids = model(**enc).last_hidden_state
        embeds = model.get_input_embeddings()(enc["input_ids"])
        try:
            by_embeds = model(
                inputs_embeds=embeds, attention_mask=enc["attention_mask"], token_type_ids=enc["token_type_ids"]
            ).last_hidden_state
        except ValueError as err:
            assert "inputs_embeds" in str(err)
            return
    torch.testing.assert_close(by_embeds, by_ids)


# ------------------------------------------------------------------------------------ 10. checkpoint validation
def _break(folder: Path, how: str) -> None:
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if how == "out of range":
        config["papa_constant_heads"] = [[0, 1], [7, 0]]
    elif how == "duplicate":
        config["papa_constant_heads"] = [[0, 1], [0, 1], [1, 0]]
    elif how == "max_length":
        config["papa_max_length"] = 32
    elif how == "null":
        config["papa_constant_heads"] = None
    elif how == "missing slots.py":
        (folder / "slots.py").unlink()
    config_path.write_text(json.dumps(config))


@pytest.mark.parametrize("how", ["out of range", "duplicate", "max_length", "null", "missing slots.py"])
def test_inspect_and_push_refuse_a_checkpoint_that_cannot_load(tmp_path, how, monkeypatch):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    assert cli("inspect", folder).exit_code == 0
    _break(folder, how)
    result = cli("inspect", folder)
    assert result.exit_code == 1 and "would not load" in result.output, result.output
    from papa_surgery.conversion.hub import validate_checkpoint

    with pytest.raises(ValueError, match="would not load"):
        validate_checkpoint(folder)


# ---------------------------------------------------------------------------------------------- 11. messages
def test_model_messages_name_the_problem_and_the_fix(tmp_path, monkeypatch):
    result = cli("convert", tmp_path / "no" / "such" / "model", "--fraction", 0.5)
    assert result.exit_code == 1 and "does not exist" in result.output and "Repo id" not in result.output
    monkeypatch.chdir(tmp_path)
    result = cli("convert", "minlm", "--fraction", 0.5)
    assert result.exit_code == 1 and "'minilm'" in result.output, result.output
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"x")
    result = cli("convert", a_file, "--fraction", 0.5)
    assert result.exit_code == 1 and "is a file" in result.output and "weights_only" not in result.output


def test_unreachable_hub_is_one_clear_line_without_retries(tmp_path, monkeypatch):
    from huggingface_hub import constants

    import papa_surgery.models.loading as loading

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=5.0: False)
    result = CliRunner().invoke(main, ["convert", "some-org/some-model", "--fraction", "0.5"])
    assert result.exit_code == 1
    assert "'some-org/some-model'" in result.output and "HF_HUB_OFFLINE=1" in result.output
    assert "Retry" not in result.output


def test_probe_offline_without_data_dir_suggests_it(source, tmp_path):
    result = cli("probe", source, "--task", "sst2", "--fractions", "0", "--seeds", 1, "--out", tmp_path / "r.jsonl")
    assert result.exit_code == 1 and "could not be reached" in result.output and "--data-dir" in result.output


def test_file_format_errors_name_the_file_and_line(tmp_path):
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.calibration.corpus import load_corpus
    from papa_surgery.experiments.results import read_rows
    from papa_surgery.ranking.order import Ranking

    bad = tmp_path / "corpus.txt"
    bad.write_bytes(b"fine line\nanother\nbroken \xff\xfe line\nlast\n")
    with pytest.raises(ValueError, match=r"corpus\.txt: line 3 is not valid UTF-8"):
        list(load_corpus(bad))
    results = tmp_path / "r.jsonl"
    results.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n{"c": 3}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl: line 2 is not valid UTF-8"):
        read_rows(results)

    ranking = tmp_path / "ranking.json"
    base = {"format": "papa-ranking", "method": "random", "num_layers": 1, "num_heads": 2, "order": [[0, 0], [0, 1]]}
    cases = [({"order": [[0], [1]]}, "order"), ({"order": None}, "order"), ({"num_layers": "1"}, "num_layers")]
    cases += [({"scores": [1.0]}, "scores"), ({"provenance": []}, "provenance")]
    for broken, field in cases:
        ranking.write_text(json.dumps({**base, **broken}))
        with pytest.raises(ValueError, match=field):
            Ranking.load(ranking)
    ranking.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a papa-surgery ranking"):
        Ranking.load(ranking)

    import torch
    from safetensors.torch import save_file

    consts = tmp_path / "c.safetensors"
    values = {"values": torch.full((1, 2, 4, 4), 0.25)}
    save_file(values, str(consts), metadata={"format": "papa-constants", "max_length": "4"})
    with pytest.raises(ValueError, match="lacks 'kind'"):
        Constants.load(consts)
    save_file(values, str(consts), metadata={"format": "papa-constants", "kind": "average", "max_length": "four"})
    with pytest.raises(ValueError, match="metadata is damaged"):
        Constants.load(consts)
    with pytest.raises(ValueError, match="is a folder"):
        Constants.load(tmp_path)


def test_empty_task_file_is_named(tmp_path):
    from papa_surgery.tasks import load_split

    (tmp_path / "glue" / "sst2").mkdir(parents=True)
    (tmp_path / "glue" / "sst2" / "train.tsv").write_text("")
    with pytest.raises(ValueError, match=r"train\.tsv is empty"):
        load_split("sst2", "train", tmp_path)


def test_a_papa_checkpoint_as_the_source_of_convert(tmp_path):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    result = cli("convert", folder, "--fraction", 0.5, "--kind", "identity", "--out", tmp_path / "o")
    assert result.exit_code == 1 and "already a PAPA checkpoint" in result.output and "source" in result.output


def test_pair_minimum_length_is_the_true_minimum(tiny_tokenizer):
    from papa_surgery.calibration.encoding import encode

    tok = tiny_tokenizer("bert")
    with pytest.raises(ValueError, match="use at least 5"):
        encode(tok, [("a", "b")], 4, pairs=True)
    encode(tok, [("a", "b")], 5, pairs=True)  # the minimum it names works


def test_analyze_on_a_checkpoint_names_its_source(tmp_path, corpus):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    result = cli("analyze", folder, "norms", "--corpus", corpus, "--max-length", 16, "--out", tmp_path / "an")
    assert result.exit_code == 1 and "PAPA checkpoint" in result.output and "source model" in result.output
    assert "eager" not in result.output and not (tmp_path / "an").exists()


def test_loading_a_checkpoint_trusts_its_code_for_the_tokenizer_too(tmp_path, monkeypatch):
    import transformers

    from papa_surgery.models.loading import load_source

    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    seen = {}
    real = transformers.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    load_source(str(folder))
    assert seen.get("trust_remote_code") is True


# ---------------------------------------------------------------------------------------------- 12. progress
def test_a_text_corpus_has_a_length_so_calibration_shows_a_total(tmp_path):
    from papa_surgery.calibration.corpus import load_corpus
    from papa_surgery.calibration.passes import process_batches

    path = tmp_path / "c.txt"
    path.write_text("one\n\ntwo\nthree\nfour\nfive\n")
    corpus = load_corpus(path)
    assert len(corpus) == 5 and len(load_corpus(path, max_examples=3)) == 3
    bar, _ = process_batches(corpus, 2, "calibrate", progress=False)
    assert bar.total == 3


# ---------------------------------------------------------------------------------------------- 13. demo timing
def test_demo_times_both_models_warm_and_interleaved_with_medians():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", REPO_ROOT / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    log, now = [], [0.0]

    def clock():
        return now[0]

    def model(name, cost):
        def run():
            log.append(name)
            now[0] += cost.pop(0) if cost else 1.0

        return run

    costs = {"source": [9, 9, 3, 1, 2], "papa": [9, 9, 1, 5, 2]}  # two warm-up calls each, then 3 timed
    result = demo.time_interleaved(
        {"source": model("source", costs["source"]), "papa": model("papa", costs["papa"])},
        repeats=3,
        warmup=2,
        clock=clock,
    )
    assert log == ["source", "papa"] * 5  # warm-up for both first, then alternating timed calls
    assert result == {"source": 2, "papa": 2}  # medians, not the first (cold) or the best call
    assert "time_interleaved(" in demo.COMPARE.split("def time_interleaved", 1)[1]


# ---------------------------------------------------------------------------------------------- 14. no local paths
@pytest.mark.parametrize("hub_id", [None, "org/tiny-bert"])
def test_recipe_and_card_do_not_record_local_paths(tiny_folder, tmp_path, hub_id):
    import shutil

    src = tmp_path / "home" / "someone" / "models" / "tiny"
    shutil.copytree(tiny_folder("bert"), src)
    if hub_id:
        (src / "README.md").write_text(f"---\nbase_model: {hub_id}\nlicense: mit\n---\n# tiny\n")
    out = tmp_path / "ckpt"
    result = cli(
        "convert", src, "--fraction", 0.5, "--kind", "identity", "--method", "first-to-last", "--max-length", 16,
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    recipe = (out / "papa_recipe.json").read_text()
    card = (out / "README.md").read_text()
    for text in (recipe, card):
        assert str(tmp_path) not in text and "/home/someone" not in text
    data = json.loads(recipe)
    if hub_id:
        assert data["source"]["model"] == hub_id and f"convert {hub_id} " in data["command"]
    else:
        assert data["source"]["model"] == "local model" and "'<local model>'" in data["command"]
