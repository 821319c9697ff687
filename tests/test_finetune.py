"""``finetune``: each cell fine-tunes the converted model end to end with Trainer, scores it and records its cost."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest
import torch
from click.testing import CliRunner
from conftest import needs_shared_data, shared_data_dir
from metric_values import is_accuracy_of
from test_sweep import config, write_sst2

import papa_surgery
import papa_surgery.finetuning.train as train_mod
from papa_surgery.cli import main
from papa_surgery.experiments.jobs import FinetuneJob
from papa_surgery.experiments.results import cell_key, read_rows
from papa_surgery.experiments.sweep import run_sweep
from papa_surgery.finetuning import FinetuneOptions, finetune
from papa_surgery.report import cost_summary, write_report
from papa_surgery.tasks.registry import get_task

pytestmark = pytest.mark.usefixtures("one_thread")

COST = ("train_examples_per_second", "inference_examples_per_second", "peak_memory_mb", "checkpoint_bytes")


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("finetune-data"), train=40, dev=16)


class CountingFinetune:
    """Wraps the real ``finetune``: counts calls and raises on the ``fail_on``-th (an interruption)."""

    def __init__(self, fail_on: int | None = None):
        self.calls, self.fail_on, self.real = 0, fail_on, train_mod.finetune

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.calls == self.fail_on:
            raise KeyboardInterrupt("simulated interruption")
        return self.real(*args, **kwargs)


def sweep(cfg, out, **options):
    return run_sweep(cfg, out, progress=False, job=FinetuneJob(cfg, FinetuneOptions(**options)))


def test_finetune_sweep_writes_score_and_cost_rows_resumes_and_repeats(tiny_folder, data_dir, tmp_path, monkeypatch):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0, 1.0), seeds=2, epochs=1, batch_size=16)
    out = tmp_path / "finetune.jsonl"
    monkeypatch.setattr(train_mod, "finetune", CountingFinetune(fail_on=3))
    with pytest.raises(KeyboardInterrupt):
        sweep(cfg, out)
    assert len(read_rows(out)) == 2
    resumed = CountingFinetune()
    monkeypatch.setattr(train_mod, "finetune", resumed)
    rows = sweep(cfg, out)
    assert resumed.calls == 2 and len(read_rows(out)) == 4  # only the two missing cells ran
    by_fraction = {}
    for r in rows:
        assert r["protocol"] == "finetune" and r["metric"] == "accuracy" and is_accuracy_of(r["score"], 16)
        assert r["examples"] == 40 and r["eval_examples"] == 16 and r["epochs"] == 1
        assert r["steps"] == math.ceil(40 / 16)  # one epoch of batches of 16
        assert all(r[name] > 0 for name in COST), r
        assert r["options"]["lr"] == 5e-5 and r["options"]["batch_size"] == 16 and r["options"]["epochs"] == 1
        by_fraction.setdefault(r["fraction"], r)
    # Attention-free: no query/key projections left to train, and a smaller checkpoint at this L.
    assert by_fraction[1.0]["trainable_parameters"] < by_fraction[0.0]["trainable_parameters"]
    assert by_fraction[1.0]["total_parameters"] == by_fraction[1.0]["trainable_parameters"]  # constants: buffers

    again = sweep(cfg, tmp_path / "again.jsonl")
    for first, second in zip(rows, again, strict=True):
        assert cell_key(first) == cell_key(second)
        for name in ("score", "training_loss", "steps", "trainable_parameters", "checkpoint_bytes"):
            assert first[name] == second[name], name


def test_labeled_kinds_are_refused_before_a_line_is_written(tiny_folder, data_dir, tmp_path):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(1.0,), seeds=1, epochs=1, kinds=("labeled-average",))
    with pytest.raises(ValueError, match="labeled kinds train their constants with the probe"):
        sweep(cfg, tmp_path / "labeled.jsonl")
    assert not read_rows(tmp_path / "labeled.jsonl")


def test_resuming_with_other_hyperparameters_is_refused(tiny_folder, data_dir, tmp_path):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0,), seeds=1, epochs=1)
    out = tmp_path / "r.jsonl"
    sweep(cfg, out)
    with pytest.raises(ValueError, match="made with weight_decay=0.01"):
        sweep(cfg, out, weight_decay=0.1)


def test_trainable_constants_add_exactly_the_constant_values(tiny_folder, data_dir, tmp_path):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.5,), seeds=1, epochs=1, kinds=("toeplitz",))
    frozen = sweep(cfg, tmp_path / "frozen.jsonl")[0]
    trained = sweep(cfg, tmp_path / "trained.jsonl", trainable_constants=True)[0]
    heads, length = frozen["constant_heads"], frozen["max_length"]
    assert trained["trainable_parameters"] - frozen["trainable_parameters"] == heads * length * length
    assert trained["options"]["trainable_constants"] and not frozen["options"]["trainable_constants"]


def test_probe_and_finetune_rows_share_a_file_and_report_side_by_side(tiny_folder, data_dir, tmp_path):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0, 1.0), seeds=1, epochs=1)
    out = tmp_path / "both.jsonl"
    probed = run_sweep(cfg, out, progress=False)
    tuned = sweep(cfg, out)
    rows = read_rows(out)
    assert len(rows) == 4 and {r.get("protocol") for r in rows} == {"probe", "finetune"}
    assert {cell_key(r) for r in probed}.isdisjoint(cell_key(r) for r in tuned)

    costs = {c["fraction"]: c for c in cost_summary(rows)}
    base, free = (next(r for r in tuned if r["fraction"] == f) for f in (0.0, 1.0))
    expected = free["train_examples_per_second"] / base["train_examples_per_second"]
    assert costs[1.0]["train_speedup"] == pytest.approx(expected)
    assert costs[1.0]["size_ratio"] == pytest.approx(free["checkpoint_bytes"] / base["checkpoint_bytes"])
    assert costs[0.0]["train_speedup"] == 1.0

    paths = write_report(out, tmp_path / "report")
    text = paths[0].read_text()
    assert "# PAPA probing and fine-tuning report" in text and "## Fine-tuned and probed" in text
    assert "(4 rows: 2 probe, 2 fine-tuning)" in text
    table = text.split("## Fine-tuned and probed")[1].split("##")[0]
    assert f"{expected:.2f}×" in table and f"{free['score']:.3f}" in table
    assert any(p.name == "fig2_finetuned.png" for p in paths)


def test_the_public_finetune_takes_hyperparameters_as_keywords(tiny, data_dir):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    row = papa_surgery.finetune(model, tok, "sst2", data_dir=str(data_dir), epochs=1, batch_size=8, progress=False)
    assert row["steps"] == 5 and row["batch_size"] == 8 and row["examples"] == 40  # 40 examples in batches of 8
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # a copy was trained
    with pytest.raises(TypeError, match="no_such_option"):
        papa_surgery.finetune(model, tok, "sst2", data_dir=str(data_dir), no_such_option=1)


@pytest.mark.parametrize("call", ["probe", "finetune"])
@pytest.mark.parametrize(
    ("given", "error", "words"),
    [
        ({"max_train_examples": -1}, ValueError, r"max_train_examples: -1 is not in the range x>=1"),
        ({"max_eval_examples": 0}, ValueError, r"max_eval_examples: 0 is not in the range"),
        ({"max_train_examples": "20"}, TypeError, r"max_train_examples: must be int, got the str '20'"),
        ({"seed": "1"}, TypeError, r"seed: must be int, got the str '1'"),
        ({"data_dir": 123}, TypeError, r"data_dir: must be str or PathLike"),
        ({"data_dir": "/no/such/folder"}, ValueError, r"data_dir: Directory '/no/such/folder' does not exist"),
        ({"task": None}, TypeError, r"task: must be a task name"),
        ({"task": "conll"}, ValueError, r"unknown task 'conll'; did you mean 'ner' or 'pos'\?"),
    ],
)
def test_probe_and_finetune_check_their_arguments_as_their_commands_do(tiny, data_dir, call, given, error, words):
    """``papa_surgery.probe`` checked none: ``max_train_examples=-1`` was a slice that trained on all but the last
    example, ``"20"`` or ``seed="1"`` failed deep inside with torch's words, ``task=None`` an AttributeError."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    arguments = {"task": "sst2", "data_dir": str(data_dir), "progress": False, **given}
    with pytest.raises(error, match=words):
        getattr(papa_surgery, call)(model, tok, arguments.pop("task"), **arguments)


def test_probe_checks_its_own_options_and_the_models_positions(tiny, data_dir):
    import numpy as np

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    common = {"data_dir": str(data_dir), "progress": False}
    numpy_values = {"max_train_examples": np.int64(16), "batch_size": np.int32(8), "lr": np.float32(1e-3)}
    row = papa_surgery.probe(model, tok, "sst2", **common, **numpy_values, device=torch.device("cpu"), epochs=1)
    assert row["examples"] == 16 and row["batch_size"] == 8  # numpy's numbers and a torch.device are taken
    for given, words in [({"epochs": 0}, "epochs: 0 is not in"), ({"batch_size": 0}, "batch_size: 0 is not in"),
                         ({"max_length": 2}, "max_length: 2 is not in"), ({"lr": "1e-3"}, "lr: must be int or float"),
                         ({"max_length": 10_000}, "max_length: 10000 slots exceed the")]:  # fmt: skip
        with pytest.raises((ValueError, TypeError), match=words):
            papa_surgery.probe(model, tok, "sst2", **common, **given)


def test_probe_max_length_beyond_the_positions_is_bad_usage(tiny_folder, data_dir, tmp_path):
    """It exited 1 with "max_length=10000 exceeds...", where calibrate and analyze exit 2 naming --max-length."""
    args = ["probe", str(tiny_folder("bert")), "--task", "sst2", "--data-dir", str(data_dir), "--max-length", "10000"]
    result = CliRunner().invoke(main, [*args, "--fractions", "0", "--seeds", "1", "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "'--max-length': 10000 slots exceed the" in result.output, result.output
    assert not (tmp_path / "r.jsonl").exists()


def test_finetune_refuses_what_it_cannot_train(tiny, data_dir):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with pytest.raises(ValueError, match="'mlm' has no fine-tuning head"):
        finetune(model, tok, "mlm", data_dir=str(data_dir))
    with pytest.raises(ValueError, match="trainable_constants: needs a model with constant heads"):
        finetune(model, tok, "sst2", options=FinetuneOptions(trainable_constants=True), data_dir=str(data_dir))
    with pytest.raises(ValueError, match="warmup_ratio: 1.5 is not in the range"):
        finetune(model, tok, "sst2", options=FinetuneOptions(warmup_ratio=1.5), data_dir=str(data_dir))


def test_cli_finetune_writes_rows_and_report_reads_several_files(tiny_folder, data_dir, tmp_path):
    out = tmp_path / "cli.jsonl"
    args = ["-q", "finetune", str(tiny_folder("bert")), "--task", "sst2", "--data-dir", str(data_dir)]
    args += ["--fractions", "0,1", "--seeds", "1", "--epochs", "1", "--max-length", "32", "--out", str(out)]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert [r["fraction"] for r in rows] == [0.0, 1.0] and all(r["protocol"] == "finetune" for r in rows)
    result = CliRunner().invoke(main, ["report", str(out), str(out), "--out", str(tmp_path / "rep")])
    assert result.exit_code == 0, result.output
    assert "# PAPA fine-tuning report" in (tmp_path / "rep" / "report.md").read_text()


SST2_MAJORITY = 444 / 872  # SST-2 dev: 444 positive of 872


@pytest.mark.real
@needs_shared_data("glue", "sst2")
def test_minilm_fine_tuned_on_sst2_is_far_above_the_majority_at_fractions_0_and_1(minilm_path, tmp_path):
    cfg = config(
        minilm_path, shared_data_dir(), fractions=(0.0, 1.0), seeds=1, epochs=1, max_length=64, kinds=("average",)
    )
    cfg = dataclasses.replace(cfg, max_train_examples=1000, lr=1e-4)  # one short epoch: a higher rate
    rows = sweep(cfg, tmp_path / "minilm.jsonl")
    for row in rows:
        assert row["examples"] == 1000 and row["eval_examples"] == 872
        assert row["score"] > SST2_MAJORITY + 0.15, row


def test_a_model_that_predicts_one_class_is_warned_and_recorded(tiny, tmp_path, caplog):
    """A fine-tuned (or probed) model that answers one class for everything scores the majority share, silently."""
    import logging

    one_label = tmp_path / "one-label"
    (one_label / "glue" / "sst2").mkdir(parents=True)
    for name, n in (("train", 24), ("dev", 12)):
        rows = [f"a fun movie number {i}\t1" for i in range(n - 1)] + ["a dull movie\t0"]
        (one_label / "glue" / "sst2" / f"{name}.tsv").write_text("sentence\tlabel\n" + "\n".join(rows) + "\n")
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        row = finetune(model, tok, "sst2", data_dir=str(one_label), options=FinetuneOptions(epochs=1), progress=False)
    assert row["predicted_classes"] == 1 and row["score"] in (pytest.approx(11 / 12), pytest.approx(1 / 12))
    label = "positive" if row["score"] > 0.5 else "negative"  # the one class it answers: its share is the score
    said = [r.getMessage() for r in caplog.records if "predicts" in r.getMessage()]
    assert len(said) == 1, said
    assert f"the fine-tuned model (fraction 0, seed 0) predicts '{label}' for every example" in said[0]
    assert "of sst2's 12 evaluation examples" in said[0] and f"score {row['score']:.4f}" in said[0]
    from papa_surgery.tasks.metrics import degenerate_message, predicted_classes

    assert predicted_classes([[0, 1], [1]]) == 2 and predicted_classes([[2, 2], [2]]) == 1
    assert degenerate_message("m", get_task("sst2"), [0, 1], [0, 1]) is None


def test_a_tasks_note_is_said_before_the_sweep_runs(tiny_folder, tmp_path, caplog):
    """MNLI from local files trains the probe on dev-matched and scores dev-mismatched: only the rows said so."""
    mnli = tmp_path / "data" / "glue" / "mnli"
    mnli.mkdir(parents=True)
    rows = [("a cat sat", "a cat is sitting", "entailment"), ("a dog ran", "nothing moved", "contradiction"),
            ("it rained", "the day was long", "neutral")] * 4  # fmt: skip
    text = "pairID,sentence1,sentence2,label\n" + "".join(f"{i},{a},{b},{y}\n" for i, (a, b, y) in enumerate(rows))
    for split in ("matched", "mismatched"):
        (mnli / f"multinli_1.0_dev_{split}.csv").write_text(text)
    args = ["probe", str(tiny_folder("bert")), "--task", "mnli", "--data-dir", str(tmp_path / "data")]
    result = CliRunner().invoke(main, [*args, "--fractions", "0", "--seeds", "1", "--epochs", "1", "--max-length",
                                       "32", "--out", str(tmp_path / "r.jsonl")])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "mnli: local files hold no MNLI train split" in caplog.text, caplog.text
