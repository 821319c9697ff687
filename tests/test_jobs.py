"""The CLI's jobs (papa_surgery.workflow.jobs): every input checked before the first expensive step."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CallCounter, cli  # noqa: F401
from fake_hub import build_tiny_checkpoint

from papa_surgery.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


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


def test_calibration_options_with_constants_are_not_silently_ignored(source, corpus, tmp_path):
    consts = tmp_path / "c.safetensors"
    assert cli("calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", consts).exit_code == 0
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--max-length", 32, "--out", tmp_path / "o"
    )
    assert result.exit_code == 2 and "--max-length" in result.output and "16" in result.output
    for unused in (("--method", "variance"), ("--fraction", 1)):  # nothing reads the corpus
        args = ("--fraction", 0.5, "--constants", consts, "--corpus", corpus, *unused, "--out", tmp_path / "o")
        result = cli("convert", source, *args)
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and "'--corpus': not used when --constants is given" in said, said
        assert "drop --corpus or --constants" in said
    assert not (tmp_path / "o").exists()
    # convert's default ranking (sensitivity) runs the model on the corpus: it is read, not refused
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--corpus", corpus, "--out", tmp_path / "read"
    )
    assert result.exit_code == 0, result.output
    ranking = json.loads((tmp_path / "read" / "papa_recipe.json").read_text())["ranking"]
    assert ranking["method"] == "sensitivity" and corpus.name in ranking["provenance"]["corpus"]
    result = cli(
        "convert", source, "--fraction", 0.5, "--constants", consts, "--max-length", 16, "--out", tmp_path / "o"
    )
    assert result.exit_code == 0, result.output  # the same L is fine


def test_a_papa_checkpoint_as_the_source_of_convert(tmp_path):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    result = cli("convert", folder, "--fraction", 0.5, "--kind", "identity", "--out", tmp_path / "o")
    assert result.exit_code == 1 and "already a PAPA checkpoint" in result.output and "source" in result.output


def test_analyze_on_a_checkpoint_names_its_source(tmp_path, corpus):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    result = cli("analyze", folder, "norms", "--corpus", corpus, "--max-length", 16, "--out", tmp_path / "an")
    assert result.exit_code == 1 and "PAPA checkpoint" in result.output and "source model" in result.output
    assert "eager" not in result.output and not (tmp_path / "an").exists()
