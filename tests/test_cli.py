"""The command line, in-process with click's CliRunner on tiny models (and the README demo on the real MiniLM)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import default_sigint

from papa_surgery.calibration.constants import Constants
from papa_surgery.cli import main
from papa_surgery.ranking.order import Ranking

COMMANDS = ["calibrate", "rank", "convert", "probe", "report", "inspect", "push", "analyze"]
REPO_ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def runner():
    return CliRunner()


def invoke(runner, *args):
    result = runner.invoke(main, ["-q", *map(str, args)])
    return result


def test_help_for_every_command(runner):
    assert runner.invoke(main, ["--help"]).exit_code == 0
    for command in COMMANDS:
        result = runner.invoke(main, [command, "--help"])
        assert result.exit_code == 0, (command, result.output)
        assert "Usage:" in result.output
    version = runner.invoke(main, ["--version"])
    assert version.exit_code == 0 and "papa-surgery, version" in version.output


def test_help_is_fast_and_imports_no_torch():
    code = "import sys; from papa_surgery.cli import main; assert 'torch' not in sys.modules, 'torch imported'"
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_bad_usage_exits_2_naming_the_option(runner, source, tmp_path):
    result = runner.invoke(main, ["convert", source, "--fraction", "1.5"])
    assert result.exit_code == 2 and "--fraction" in result.output
    result = runner.invoke(main, ["convert", source])
    assert result.exit_code == 2 and "--fraction" in result.output
    result = runner.invoke(main, ["convert", source, "--fraction", "0.5", "--kind", "bogus"])
    assert result.exit_code == 2 and "--kind" in result.output
    result = runner.invoke(main, ["calibrate", source, "--out", str(tmp_path / "c.safetensors"), "--max-length", "x"])
    assert result.exit_code == 2 and "--max-length" in result.output
    result = runner.invoke(main, ["probe", source, "--task", "sst2", "--fractions", "0,2", "--out", "r.jsonl"])
    assert result.exit_code == 2 and "--fractions" in result.output
    result = runner.invoke(main, ["no-such-command"])
    assert result.exit_code == 2


def test_failed_run_is_one_line_exit_1(runner, tmp_path):
    from transformers import GPT2Config, GPT2Model

    folder = tmp_path / "gpt2"
    GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10)).save_pretrained(folder)
    result = runner.invoke(main, ["convert", str(folder), "--fraction", "0.5", "--out", str(tmp_path / "o")])
    assert result.exit_code == 1
    assert "unsupported architecture" in result.output and "bert" in result.output
    assert "Traceback" not in result.output
    assert not (tmp_path / "o").exists()


def test_calibrate_rank_convert_inspect(runner, source, corpus, tmp_path):
    consts = tmp_path / "c.safetensors"
    result = invoke(runner, "calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", consts)
    assert result.exit_code == 0, result.output
    c = Constants.load(consts)
    assert c.values.shape == (2, 4, 16, 16) and c.metadata["examples"] == 12

    for method in ("variance", "first-to-last", "random"):
        out = tmp_path / f"{method}.json"
        result = invoke(runner, "rank", source, "--method", method, "--constants", consts, "--out", out)
        assert result.exit_code == 0, result.output
        assert Ranking.load(out).method == method

    results = tmp_path / "results.jsonl"
    rows = [
        {"model": "tiny", "task": "sst2", "fraction": 0.5, "kind": "average", "method": "random", "seed": s,
         "metric": "accuracy", "score": score}
        for s, score in enumerate([0.75, 0.25])
    ]  # fmt: skip
    results.write_text("".join(json.dumps(r) + "\n" for r in rows))
    ckpt = tmp_path / "ckpt"
    result = invoke(
        runner, "convert", source, "--fraction", 0.5, "--constants", consts, "--ranking", tmp_path / "random.json",
        "--dtype", "fp16", "--out", ckpt, "--results", results,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((ckpt / "config.json").read_text())
    expected = Ranking.load(tmp_path / "random.json").select(0.5)
    assert config["papa_constant_heads"] == expected and config["papa_method"] == "random"
    recipe = json.loads((ckpt / "papa_recipe.json").read_text())
    assert recipe["command"].startswith("papa-surgery ") and "--fraction 0.5" in recipe["command"]
    card = (ckpt / "README.md").read_text()
    assert "| tiny | sst2 | accuracy | average | random | 0.5 | 0.5000 ± " in card  # mean and 95% CI of 2 seeds
    assert (ckpt / "papa_constants.png").stat().st_size > 0

    again = invoke(runner, "convert", source, "--fraction", 0.5, "--constants", consts, "--out", ckpt)
    assert again.exit_code == 1 and "--overwrite" in again.output

    info = invoke(runner, "inspect", ckpt)
    assert info.exit_code == 0 and "random" in info.output


def test_convert_with_defaults_and_data_free_kind(runner, source, corpus, tmp_path):
    out = tmp_path / "identity"
    result = invoke(
        runner, "convert", source, "--fraction", 1, "--kind", "identity", "--corpus", corpus, "--max-length", 16,
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["papa_kind"] == "identity" and len(config["papa_constant_heads"]) == 8
    assert config["papa_method"] is None  # fraction 1 makes every head constant: no ranking is made


def test_rank_needs_a_task_for_lambda(runner, source, tmp_path):
    result = invoke(runner, "rank", source, "--method", "lambda", "--out", tmp_path / "r.json")
    # Bad usage found by the library (a learned method needs a task): exit 2, one line naming the flag and the fix.
    assert result.exit_code == 2 and not (tmp_path / "r.json").exists()
    last = result.output.rstrip("\n").split("\n")[-1]
    assert last.startswith("Error: Invalid value for '--task': the 'lambda' ranking is learned on a labelled task")
    assert "pass --task (e.g. --task sst2)" in last
    assert "Traceback" not in result.output


def test_push_command_against_fake_hub(runner, tmp_path, monkeypatch):
    from fake_hub import FakeHub, build_tiny_checkpoint
    from huggingface_hub import constants

    folder, _, _ = build_tiny_checkpoint(tmp_path / "tiny-papa")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "hf_home" / "token"))
    with FakeHub() as server:
        monkeypatch.setenv("HF_ENDPOINT", server.endpoint)
        monkeypatch.setattr(constants, "ENDPOINT", server.endpoint)
        monkeypatch.delenv("HF_TOKEN", raising=False)
        no_token = runner.invoke(main, ["push", str(folder), "--repo-id", "user/tiny-papa"])
        assert no_token.exit_code == 1 and "token" in no_token.output.lower()
        monkeypatch.setenv("HF_TOKEN", "hf_user_token")
        result = runner.invoke(main, ["push", str(folder), "--repo-id", "user/tiny-papa", "--private"])
        assert result.exit_code == 0, result.output
        assert server.commit_count("user/tiny-papa") == 1


@pytest.mark.real
def test_readme_demo_end_to_end(tmp_path):
    """The README's demo (examples/demo.py) on the real MiniLM, on a small slice of the bundled corpus."""
    import os

    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    demo = [str(REPO_ROOT / "examples" / "demo.py"), "--out", str(tmp_path / "demo"), "--max-examples", "64"]
    proc = subprocess.run([sys.executable, *demo], capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
    assert "reloaded in a fresh process as PapaBertModel" in proc.stdout
    assert "36 of 72" in proc.stdout
    ratio = float(proc.stdout.split("MiB (")[1].split("x)")[0])
    assert ratio < 1.0


def test_short_corpus_warns_once_on_the_command_line(runner, source, corpus, tmp_path):
    args = ["convert", source, "--fraction", 1, "--corpus", corpus, "--max-length", 64, "--out", tmp_path / "c"]
    result = runner.invoke(main, [str(a) for a in args])
    assert result.exit_code == 0, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning: the calibration corpus")]
    assert len(lines) == 1 and "covers only 8 of the 64 slots" in lines[0] and "--max-length" in lines[0]
    quiet = runner.invoke(main, ["-q", *map(str, args[:-1]), str(tmp_path / "q")])
    assert quiet.exit_code == 0 and "warning:" not in quiet.stderr


@pytest.mark.parametrize(
    ("chosen", "warned"),
    [
        (("--kind", "toeplitz", "--method", "variance"), 0),
        (("--kind", "toeplitz"), 0),  # sensitivity: it converts the source once per head to rank them
        (("--kind", "average", "--method", "variance"), 1),
        ((), 1),
    ],
)
def test_short_corpus_is_said_only_of_the_constants_the_model_gets(runner, source, corpus, tmp_path, chosen, warned):
    """A data-free kind below fraction 1 calibrates the average only to rank the heads; the warning said the model's
    longer inputs used filled constants, which a data-free kind never has. The average's own warning stays, once
    (the defaults: sharpened constants, sensitivity ranking)."""
    args = ["convert", source, "--fraction", 0.5, *chosen, "--corpus", corpus, "--max-length", 64]
    result = runner.invoke(main, [str(a) for a in (*args, "--out", tmp_path / "out")])
    assert result.exit_code == 0, result.output
    assert result.stderr.count("warning: the calibration corpus covers only") == warned, result.stderr


def test_distilled_kind_on_the_command_line(runner, source, corpus, tmp_path):
    consts = tmp_path / "d.safetensors"
    result = invoke(
        runner, "calibrate", source, "--corpus", corpus, "--max-length", 16, "--kind", "distilled",
        "--distill-steps", 2, "--out", consts,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    made = Constants.load(consts)
    assert made.kind == "distilled" and made.metadata["distilled"]["steps"] == 2
    assert len(made.metadata["distilled"]["heads"]) == 8  # calibrate distils for an attention-free model
    out = tmp_path / "ckpt"
    result = invoke(
        runner, "convert", source, "--fraction", 0.5, "--kind", "distilled", "--corpus", corpus, "--max-length", 16,
        "--distill-steps", 2, "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    assert config["papa_kind"] == "distilled" and len(config["papa_constant_heads"]) == 4
    recipe = json.loads((out / "papa_recipe.json").read_text())
    assert "--distill-steps 2" in recipe["command"]
    # how it was distilled is recorded (only sharpened constants' fit was), and inspect and the card say it
    fit = recipe["distilled"]
    assert fit["steps"] == 2 and fit["objective"] == "layers" and "heads" not in fit and "loss_last_steps" in fit
    shown = invoke(runner, "inspect", out).output
    assert "kind            distilled (distilled for 2 steps (lr 0.01, objective layers), loss " in shown, shown
    assert "distilled for 2 steps" in (out / "README.md").read_text()
    # distilled from sharpened constants, the recipe holds both fits: the kind's own is the one shown
    from papa_surgery.conversion.description import fit_note

    both = {"sharpened": {"exponents": {"0": 1.5}}, "distilled": fit}
    assert fit_note({**both, "kind": "distilled"}).startswith(" (distilled for 2 steps")
    assert fit_note({**both, "kind": "sharpened"}).startswith(" (exponent per layer 0: 1.5")


# --------------------------------------------------------------------------------- flags where users put them
def test_quiet_and_verbose_work_after_the_command_name(runner, source, corpus, tmp_path):
    args = ["convert", source, "--fraction", "1", "--corpus", str(corpus), "--max-length", "64"]
    loud = runner.invoke(main, [*args, "--out", str(tmp_path / "loud")])
    assert loud.exit_code == 0 and "warning: the calibration corpus covers only" in loud.stderr  # the control
    quiet = runner.invoke(main, [*args, "--out", str(tmp_path / "quiet"), "-q"])
    assert quiet.exit_code == 0 and "warning:" not in quiet.stderr, quiet.stderr
    failing = ["convert", str(tmp_path / "no-such-model"), "--fraction", "0.5"]
    plain = runner.invoke(main, failing)
    assert plain.exit_code == 1 and isinstance(plain.exception, SystemExit)  # one line, no traceback
    verbose = runner.invoke(main, [*failing, "-v"])
    assert isinstance(verbose.exception, ValueError) and "does not exist" in str(verbose.exception)  # the traceback


def test_fractions_are_written_the_same_way_in_every_command(runner, source, tmp_path):
    out = tmp_path / "seven-eighths"
    args = ["convert", source, "--fraction", "7/8", "--kind", "identity", "--method", "first-to-last"]
    result = invoke(runner, *args, "--max-length", 16, "--out", out)
    assert result.exit_code == 0, result.output
    assert json.loads((out / "config.json").read_text())["papa_fraction"] == 0.875
    result = runner.invoke(main, ["probe", source, "--task", "sst2", "--fractions", "0,,1", "--out", "r.jsonl"])
    assert result.exit_code == 2 and "--fractions" in result.output and "empty item" in result.output


@pytest.mark.parametrize(
    ("args", "flag", "words"),
    [
        (["probe", "{src}", "--task", "sst2", "--kind", "bogus", "--out", "r"], "--kind", "'bogus' is not one of"),
        (["probe", "{src}", "--task", "sst2", "--method", "bogus", "--out", "r"], "--method", "'bogus' is not one of"),
        (["finetune", "{src}", "--task", "sst2", "--kind", "bogus", "--out", "r"], "--kind", "'bogus' is not one of"),
        (["probe", "{src}", "--task", "sst2", "--lr", "-1", "--out", "r.jsonl"], "--lr", "not in the range x>0"),
        (["probe", "{src}", "--task", "sst2", "--device", "banana", "--out", "r.jsonl"], "--device", "not a device"),
    ],
)
def test_bad_values_are_usage_errors_naming_the_flag_and_the_range(runner, source, args, flag, words):
    result = runner.invoke(main, [a.replace("{src}", source) for a in args])
    assert result.exit_code == 2, result.output
    assert f"Invalid value for '{flag}'" in result.output and words in result.output


def test_lr_help_gives_the_range_the_error_names(runner):
    result = runner.invoke(main, ["probe", "--help"])
    help_of_lr = " ".join(result.output.split("--lr", 1)[1].split("--batch-size", 1)[0].split())
    assert "positive number" in help_of_lr and "[x>0]" in help_of_lr


@pytest.mark.skipif(__import__("torch").cuda.is_available(), reason="needs a PyTorch without a usable GPU")
def test_an_unavailable_device_is_said_in_plain_words_before_loading(runner, source, tmp_path):
    import papa_surgery

    args = ["convert", source, "--fraction", "0.5", "--kind", "identity", "--method", "first-to-last"]
    result = runner.invoke(main, [*args, "--max-length", "16", "--device", "cuda", "--out", str(tmp_path / "o")])
    assert result.exit_code == 2 and "Invalid value for '--device': cuda is not available" in result.output
    assert "not compiled" not in result.output and not (tmp_path / "o").exists()
    with pytest.raises(ValueError, match=r"device: cuda:1 is not available"):
        papa_surgery.load(source, device="cuda:1")


def test_ctrl_c_exits_130_and_leaves_nothing(source, tmp_path):
    """A real process interrupted mid-calibration with SIGINT: the shell's 130, one line, no output file."""
    import os
    import signal
    import threading
    import time

    corpus = tmp_path / "long.txt"
    corpus.write_text("\n".join(f"line {i} of a corpus long enough to take a while" for i in range(200000)))
    out = tmp_path / "c.safetensors"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    command = [sys.executable, "-m", "papa_surgery", "calibrate", source, "--corpus", str(corpus)]
    proc = subprocess.Popen(
        [*command, "--max-length", "16", "--batch-size", "2", "--out", str(out)],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=default_sigint,
    )  # fmt: skip
    seen: list[str] = []
    reader = threading.Thread(target=lambda: seen.extend(iter(lambda: proc.stderr.read(1), "")), daemon=True)
    reader.start()
    deadline = time.monotonic() + 300
    while "calibrate:" not in "".join(seen) and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)  # until the calibration pass is under way
    assert proc.poll() is None, "".join(seen)
    proc.send_signal(signal.SIGINT)
    proc.wait(timeout=120)
    reader.join(timeout=10)
    text = "".join(seen)
    assert proc.returncode == 130, text[-2000:]
    assert "Aborted: interrupted" in text and "Traceback" not in text
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".c.safetensors")]


def test_positional_names_are_no_option_of_any_command():
    """Errors name a positional argument as ``--help`` shows it (``CHECKPOINT``, ``failures.POSITIONAL``): an option
    of the same name (``--checkpoint``) would then be misnamed in every error about it. Every positional argument of
    every command is in the set, and no option is (``report RESULTS`` shares its name with ``convert --results``, so
    it stays out: an error about it names it in words)."""
    import click

    from papa_surgery.cli import main
    from papa_surgery.failures import POSITIONAL

    def commands(group):
        for command in group.commands.values():
            yield from commands(command) if isinstance(command, click.Group) else (command,)

    options, positionals = set(), set()
    for command in commands(main):
        for param in command.params:
            (options if isinstance(param, click.Option) else positionals).add(param.name)
    assert positionals - options <= POSITIONAL, positionals - options - POSITIONAL
    assert not options & POSITIONAL, options & POSITIONAL


def test_rank_has_no_ranking_option():
    """``rank`` makes a ranking: its ``--help`` listed ``--ranking FILE (instead of --method)``, which it then
    refused. The option is gone from it (a usage error naming it), and stays on ``convert``."""
    from click.testing import CliRunner

    from papa_surgery.cli import main

    runner = CliRunner()
    assert "--ranking" not in runner.invoke(main, ["rank", "--help"]).output
    assert "--ranking" in runner.invoke(main, ["convert", "--help"]).output
    result = runner.invoke(main, ["rank", "m", "--ranking", "r.json", "--method", "variance", "--out", "o.json"])
    assert result.exit_code == 2 and "No such option '--ranking'" in result.output, result.output
