"""The command line under ``torchrun`` and ``accelerate launch``: two CPU processes (gloo) on tiny models.

Each run is compared with the same command in one process: one output, written once by rank 0, provenance
saying 2 processes, and the same result (calibration bitwise; probe rows equal but for time and process
count). A failure on one rank must end both, with rank 0 naming it and nothing written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_sweep import write_sst2

from papa_surgery.calibration.constants import Constants

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # slow tier: torchrun / accelerate

REPO_ROOT = Path(__file__).resolve().parents[1]
SINGLE = [sys.executable, "-m", "papa_surgery"]
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
TORCHRUN += ["-m", "papa_surgery"]  # --standalone: a free port on localhost
# accelerate's CPU multi-process launch: --multi_gpu runs torchrun underneath, on a CPU-only machine with gloo
# (`--cpu --num_processes 2` starts a single process unless given an MPI hostfile).
ACCELERATE = [
    sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
    "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", "0", "-m", "papa_surgery",
]  # fmt: skip
LAUNCHERS = {"torchrun": TORCHRUN, "accelerate": ACCELERATE}
LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")
RANK_HOOK = """
import importlib
import os
import time

if os.environ.get("RANK") == "0":  # rank 0 is slow, before and after it says the error: rank 1 exits meanwhile
    distributed = importlib.import_module("papa_surgery.distributed")
    real_failure, real_leave = distributed.RemoteFailure.__init__, distributed._leave

    def late_failure(self, *args, **kwargs):
        time.sleep(1.0)  # ten of torchrun's monitor intervals: it stops the other ranks once one has exited
        real_failure(self, *args, **kwargs)

    def late_leave(*args, **kwargs):
        time.sleep(1.0)  # torchrun's SIGTERM arrives here, after the error was said: not a second error
        real_leave(*args, **kwargs)

    distributed.RemoteFailure.__init__, distributed._leave = late_failure, late_leave
if os.environ.get("RANK") == "1" and os.environ.get("PAPA_TEST_FAIL"):  # rank 1 alone fails, at this step
    calibrate = importlib.import_module("papa_surgery.calibration.average")
    pipeline = importlib.import_module("papa_surgery.workflow.jobs")

    def fail(*args, **kwargs):
        raise ValueError("injected failure on rank 1")

    if os.environ["PAPA_TEST_FAIL"] == "preflight":
        pipeline.open_corpus = fail
    else:
        real, calls = calibrate.encode, []

        def encode(*args, **kwargs):
            calls.append(1)
            return fail() if len(calls) == 2 else real(*args, **kwargs)

        calibrate.encode = encode
"""


def run_cli(launcher: list[str], *args, cwd: Path, extra_env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI in fresh processes: this checkout's package, offline, one thread per process (as torchrun sets)."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}
    env.update(
        PYTHONPATH=os.pathsep.join([str(REPO_ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        OMP_NUM_THREADS="1",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        HF_HOME=str(cwd / "hf-home"),  # no user accelerate config
        TOKENIZERS_PARALLELISM="false",
    )
    env.update(extra_env or {})
    cmd = [*launcher, "-q", *map(str, args)]
    return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def ok(result: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def work(tiny, tmp_path_factory) -> Path:
    """A folder with a tiny BERT (``bert/``), a 50-line corpus and a tiny SST-2 (``data/``)."""
    root = tmp_path_factory.mktemp("distributed")
    tiny.save("bert", root / "bert")
    lines = [f"the cat {'sat ' * (i % 7)}on the mat , number {i} ." for i in range(50)]
    (root / "corpus.txt").write_text("\n".join(lines) + "\n")
    write_sst2(root / "data", train=80, dev=48)
    return root


def outputs(folder: Path) -> list[str]:
    """Every entry of ``folder`` (staging leftovers included: their names start with a dot)."""
    return sorted(p.name for p in folder.iterdir())


def calibration(launcher, work: Path, out: str) -> Constants:
    ok(run_cli(launcher, "calibrate", "bert", "--corpus", "corpus.txt", "--max-length", 32, "--batch-size", 4,
               "--out", out, cwd=work))  # fmt: skip
    return Constants.load(work / out)


@pytest.fixture(scope="module")
def single_constants(work) -> Constants:
    return calibration(SINGLE, work, "single.safetensors")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_calibrate_in_two_processes_equals_one_process(work, single_constants, launcher):
    before = outputs(work)
    constants = calibration(LAUNCHERS[launcher], work, f"{launcher}.safetensors")
    assert outputs(work) == sorted([*before, f"{launcher}.safetensors"])  # one file, no leftovers
    assert single_constants.metadata["processes"] == 1 and constants.metadata["processes"] == 2
    assert constants.metadata["examples"] == single_constants.metadata["examples"] == 50
    assert torch.equal(constants.values, single_constants.values)  # bitwise: same batches, same fp64 order
    assert torch.equal(constants.counts, single_constants.counts)
    assert torch.equal(constants.variance, single_constants.variance)


PROBE_ARGS = ("--task", "sst2", "--data-dir", "data", "--fractions", "0,0.5,1", "--seeds", 1, "--epochs", 5,
              "--lr", 0.05, "--max-length", 32)  # fmt: skip
VARYING = ("seconds", "processes")  # what may differ between a 1- and a 2-process row


def probe_rows(launcher, work: Path, out: str) -> list[dict]:
    ok(run_cli(launcher, "probe", "bert", *PROBE_ARGS, "--out", out, cwd=work))
    return [json.loads(line) for line in (work / out).read_text().splitlines()]


@pytest.fixture(scope="module")
def single_rows(work) -> list[dict]:
    return probe_rows(SINGLE, work, "single.jsonl")


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_probe_in_two_processes_equals_one_process(work, single_rows, launcher):
    out = f"{launcher}.jsonl"
    rows = probe_rows(LAUNCHERS[launcher], work, out)
    assert len(rows) == len(single_rows) == 3  # written once, not once per process
    assert {r["processes"] for r in rows} == {2} and {r["processes"] for r in single_rows} == {1}
    assert len({r["score"] for r in single_rows}) > 1  # the scores differ between cells: equality tells
    for row, single in zip(rows, single_rows, strict=True):
        assert {k: v for k, v in row.items() if k not in VARYING} == {
            k: v for k, v in single.items() if k not in VARYING
        }
    # The calibrated constants and ranking were saved once, by rank 0, and equal the single process's.
    mine, theirs = work / f"{launcher}.artifacts", work / "single.artifacts"
    assert outputs(mine) == outputs(theirs)
    for name in outputs(mine):
        if name.endswith(".safetensors"):
            assert torch.equal(Constants.load(mine / name).values, Constants.load(theirs / name).values)
        else:
            assert json.loads((mine / name).read_text()) == json.loads((theirs / name).read_text())


def test_a_resumed_probe_under_torchrun_runs_nothing(work, single_rows):
    """Rank 0 reads the file and hands every process the cells already done: a rerun adds no row."""
    out = work / "resumed.jsonl"
    out.write_text((work / "single.jsonl").read_text())
    result = ok(run_cli(TORCHRUN, "probe", "bert", *PROBE_ARGS, "--out", out.name, cwd=work))
    assert "3 rows of this sweep (0 new) in resumed.jsonl, which holds 3 rows" in result.stdout
    assert out.read_text() == (work / "single.jsonl").read_text()


FINETUNE_ARGS = ("--task", "sst2", "--data-dir", "data", "--fractions", "0,1", "--seeds", 1, "--epochs", 1,
                 "--batch-size", 16, "--max-length", 32)  # fmt: skip
# DDP shards a shuffled order across the processes: the same global batches in number and size, other members.
FINETUNE_SAME = ("model", "task", "fraction", "kind", "method", "seed", "corpus", "protocol", "examples",
                 "eval_examples", "epochs", "steps", "trainable_parameters", "total_parameters", "checkpoint_bytes",
                 "constant_heads", "max_length", "options")  # fmt: skip


def test_finetune_under_torchrun_trains_with_ddp_and_writes_once(work):
    ok(run_cli(SINGLE, "finetune", "bert", *FINETUNE_ARGS, "--out", "ft-single.jsonl", cwd=work))
    ok(run_cli(TORCHRUN, "finetune", "bert", *FINETUNE_ARGS, "--out", "ft-two.jsonl", cwd=work))
    single, two = (
        [json.loads(x) for x in (work / f).read_text().splitlines()] for f in ("ft-single.jsonl", "ft-two.jsonl")
    )
    assert len(two) == len(single) == 2  # written once, by rank 0
    assert [r["processes"] for r in two] == [2, 2] and [r["processes"] for r in single] == [1, 1]
    for row, ref in zip(two, single, strict=True):
        assert {k: row[k] for k in FINETUNE_SAME} == {k: ref[k] for k in FINETUNE_SAME}
        assert row["steps"] == 5  # 80 examples, global batch 16: each process took 8 of every batch
        assert 0 <= row["score"] <= 1 and row["score"] * 48 == round(row["score"] * 48)  # of the 48 dev sentences
    result = run_cli(
        TORCHRUN, "finetune", "bert", *FINETUNE_ARGS[:-4], "--batch-size", 15, "--out", "odd.jsonl", cwd=work
    )
    assert result.returncode == 1 and "--batch-size 15 does not split over 2 processes" in result.stderr
    assert not (work / "odd.jsonl").exists() or not (work / "odd.jsonl").read_text()


@pytest.mark.parametrize(
    "command",
    [
        ("rank", "bert", "--method", "variance", "--corpus", "corpus.txt", "--max-length", 32, "--batch-size", 4),
        ("analyze", "bert", "norms", "--corpus", "corpus.txt", "--max-length", 32, "--batch-size", 4),
    ],
    ids=["rank", "analyze"],
)
def test_rank_and_analyze_under_torchrun_write_once(work, tmp_path, command):
    suffix = ".json" if command[0] == "rank" else ""
    ok(run_cli(SINGLE, *command, "--out", tmp_path / f"single{suffix}", cwd=work))
    ok(run_cli(TORCHRUN, *command, "--out", tmp_path / f"two{suffix}", cwd=work))
    assert outputs(tmp_path) == [f"single{suffix}", f"two{suffix}"]
    if command[0] == "rank":  # from bitwise-equal constants: the same ranking
        single, two = (json.loads((tmp_path / f"{n}.json").read_text()) for n in ("single", "two"))
        assert two == single
        return
    assert outputs(tmp_path / "two") == outputs(tmp_path / "single")
    single, two = (Constants.load(tmp_path / n / "norm-average.safetensors") for n in ("single", "two"))
    assert two.metadata["processes"] == 2
    # all-reduced fp64 sums: equal up to the order of the additions
    assert torch.allclose(two.values, single.values, rtol=1e-12, atol=0)
    assert torch.allclose(two.variance, single.variance, rtol=1e-12, atol=0)


def test_convert_under_torchrun_writes_one_checkpoint(work):
    args = ("convert", "bert", "--corpus", "corpus.txt", "--max-length", 32, "--fraction", 0.5, "--batch-size", 4)
    parent = work / "checkpoints"
    parent.mkdir()
    ok(run_cli(SINGLE, *args, "--out", parent / "single", cwd=work))
    ok(run_cli(TORCHRUN, *args, "--out", parent / "two", cwd=work))
    assert outputs(parent) == ["single", "two"]
    recipe = json.loads((parent / "two" / "papa_recipe.json").read_text())
    assert recipe["processes"] == 2 and recipe["corpus"]["processes"] == 2
    from safetensors.torch import load_file

    one, two = (load_file(parent / name / "model.safetensors") for name in ("single", "two"))
    assert one.keys() == two.keys() and all(torch.equal(one[k], two[k]) for k in one)


def test_distill_under_torchrun_steps_on_both_shards(work, single_constants, tmp_path):
    """Two processes with batch 4 take the steps of one process with batch 8 (the loss is normalised over both
    shards' tokens and the gradients summed), not those of one process on its own shard."""
    args = ("calibrate", "bert", "--corpus", "corpus.txt", "--max-length", 32, "--kind", "distilled",
            "--distill-steps", 3, "--distill-lr", 0.05)  # fmt: skip
    ok(run_cli(TORCHRUN, *args, "--batch-size", 4, "--out", tmp_path / "two.safetensors", cwd=work))
    for batch in (4, 8):
        ok(run_cli(SINGLE, *args, "--batch-size", batch, "--out", tmp_path / f"one-{batch}.safetensors", cwd=work))
    assert outputs(tmp_path) == ["one-4.safetensors", "one-8.safetensors", "two.safetensors"]
    two, own_shard, both = (Constants.load(tmp_path / f"{n}.safetensors") for n in ("two", "one-4", "one-8"))
    assert two.kind == "distilled" and two.metadata["processes"] == 2
    assert two.metadata["distilled"]["batch_size"] == 4

    def gap(a, b):
        return float((a.values - b.values).abs().max())

    assert gap(two, single_constants) > 1e-3  # distilled: moved away from the average it started from
    assert gap(own_shard, both) > 1e-3  # the batches differ enough to tell the two apart
    # padding differs (each shard pads to its own longest line): equal up to float rounding, amplified by Adam
    assert gap(two, both) < 1e-4 < gap(two, own_shard) / 100


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_heal_under_a_launcher_steps_on_both_shards_and_writes_once(work, tmp_path, launcher):
    """Healing as distillation does: two processes with batch 4 take the steps of one process with batch 8; rank 0
    alone writes the checkpoint, its recipe says 2 processes, and no resume state is left."""
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    ok(run_cli(SINGLE, "convert", "bert", "--corpus", "corpus.txt", "--max-length", 32, "--fraction", 0.75,
               "--batch-size", 4, "--out", ckpt, cwd=work))  # fmt: skip
    args = ("heal", ckpt, "--corpus", "corpus.txt", "--teacher", "bert", "--train", "full", "--steps", 3,
            "--heldout", 10, "--eval-every", 1, "--lr", 0.01)  # fmt: skip
    ok(run_cli(LAUNCHERS[launcher], *args, "--batch-size", 4, "--out", tmp_path / "two", cwd=work))
    for batch in (4, 8):
        ok(run_cli(SINGLE, *args, "--batch-size", batch, "--out", tmp_path / f"one-{batch}", cwd=work))
    assert outputs(tmp_path) == ["ckpt", "one-4", "one-8", "two"]  # one checkpoint each, no state, no staging
    healing = json.loads((tmp_path / "two" / "papa_recipe.json").read_text())["healing"]
    assert healing["processes"] == 2 and healing["batch_size"] == 4
    two, own_shard, both = (load_file(tmp_path / n / "model.safetensors") for n in ("two", "one-4", "one-8"))
    start = load_file(ckpt / "model.safetensors")

    def gap(a, b):
        return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)

    assert gap(two, start) > 1e-3 and gap(own_shard, both) > 1e-3  # healing moved the weights; the batches differ
    # padding differs (each shard pads to its own longest line): equal up to float rounding, amplified by Adam
    assert gap(two, both) < gap(two, own_shard) / 30, (gap(two, both), gap(two, own_shard))


def hooked(tmp_path: Path, fail: str = "") -> dict:
    """The environment that runs RANK_HOOK in every process: rank 0 slow, rank 1 failing at ``fail`` (if given)."""
    (tmp_path / "sitecustomize.py").write_text(RANK_HOOK)
    return {"PYTHONPATH": os.pathsep.join([str(REPO_ROOT), str(tmp_path)]), "PAPA_TEST_FAIL": fail}


@pytest.mark.parametrize("step", ["preflight", "calibration"])
def test_a_failure_on_one_rank_ends_both_and_writes_nothing(work, tmp_path, step):
    before = outputs(work)
    result = run_cli(TORCHRUN, "calibrate", "bert", "--corpus", "corpus.txt", "--max-length", 32, "--batch-size", 4,
                     "--out", "failed.safetensors", cwd=work, extra_env=hooked(tmp_path, step))  # fmt: skip
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert errors == ["Error: process 1 of 2 failed: injected failure on rank 1"]  # said once, by rank 0
    assert outputs(work) == before


def test_a_bad_option_under_torchrun_is_said_once_as_bad_usage(work, tmp_path):
    """Bad usage found inside the command (more slots than the model has positions) on every rank: said once, by
    rank 0, as one process says it; nothing written. (torchrun exits 1 for any failed process; each exits 2.)"""
    before = outputs(work)
    args = ("calibrate", "bert", "--corpus", "corpus.txt", "--max-length", 100_000, "--out", "bad.safetensors")
    single = run_cli(SINGLE, *args, cwd=work)
    two = run_cli(TORCHRUN, *args, cwd=work, extra_env=hooked(tmp_path))  # rank 0 slow to leave
    assert single.returncode == 2 and two.returncode == 1
    assert "exitcode  : 2" in two.stderr  # torchrun's summary of the failed processes
    errors = [line for line in two.stderr.splitlines() if line.startswith("Error:")]
    assert errors == [line for line in single.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and "'--max-length'" in errors[0] and "100000 slots exceed" in errors[0], errors
    assert outputs(work) == before


DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA"))]


@pytest.mark.parametrize("device", DEVICES)
def test_exchanged_batches_add_up_like_one_process(tiny_model, tiny_tokenizer, monkeypatch, device):
    """The multi-process path (gather the real entries, ship them, add them back in order) run in one process
    with every batch its own: the sums are bitwise those of adding each batch's matrices directly."""
    import importlib

    module = importlib.import_module("papa_surgery.calibration.average")
    calibrate, process_batches = module.calibrate, module.process_batches

    model, tok = tiny_model("bert").to(device), tiny_tokenizer("bert")
    corpus = [f"the cat {'sat ' * (i % 5)}on mat {i} ." for i in range(11)] + ["a", "b c"]
    direct = calibrate(model, tok, corpus, max_length=16, batch_size=3, progress=False)
    # "two processes" whose exchange (no process group) hands back this process's own batch
    monkeypatch.setattr(module, "process_batches", lambda *a, **k: (process_batches(*a, **k)[0], 2))
    replayed = calibrate(model, tok, corpus, max_length=16, batch_size=3, progress=False)
    assert replayed.metadata["processes"] == 2 and replayed.metadata["examples"] == direct.metadata["examples"]
    for name in ("values", "counts", "variance"):
        assert torch.equal(getattr(replayed, name), getattr(direct, name)), name
