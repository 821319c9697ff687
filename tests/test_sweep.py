"""Sweeps on a tiny local model: one JSONL line per cell, resume after an interruption, shared cells, bad input."""

from __future__ import annotations

import json
import random

import pytest
import torch
from metric_values import is_accuracy_of

import papa_surgery.probing as probe_pkg  # the package whose ``probe`` a sweep calls
from papa_surgery.experiments import SweepConfig, run_sweep
from papa_surgery.experiments.config import DEFAULT_FRACTIONS
from papa_surgery.experiments.results import Cell, cell_key, read_rows

POSITIVE = ["charming", "fun", "astounding", "affecting", "good", "great"]
NEGATIVE = ["bleak", "desperate", "dull", "bad", "awful", "boring"]

FILLER = ["the", "a", "movie", "is", "and", "journey", "acting", "music", "ride", "."]


def write_sst2(root, train: int = 40, dev: int = 16, seed: int = 0):
    """A tiny SST-2 in the GLUE TSV layout the probe's --data-dir reader expects (glue/sst2/{train,dev}.tsv)."""
    rng = random.Random(seed)
    (root / "glue" / "sst2").mkdir(parents=True, exist_ok=True)
    for name, n in (("train", train), ("dev", dev)):
        lines = ["sentence\tlabel"]
        for _ in range(n):
            label = rng.randrange(2)
            words = rng.choices(FILLER, k=rng.randrange(2, 10)) + [rng.choice(POSITIVE if label else NEGATIVE)]
            rng.shuffle(words)
            lines.append(f"{' '.join(words)}\t{label}")
        (root / "glue" / "sst2" / f"{name}.tsv").write_text("\n".join(lines) + "\n")
    return root


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    return write_sst2(tmp_path_factory.mktemp("sweep-data"))


def config(model_dir, data_dir, **kw) -> SweepConfig:
    base = dict(
        model=str(model_dir),
        tasks=("sst2",),
        fractions=(0.0, 1.0),
        seeds=2,
        data_dir=str(data_dir),
        epochs=1,
        max_length=32,
        calibration_batch_size=16,
    )
    base.update(kw)
    return SweepConfig(**base)


class CountingProbe:
    """Wraps the real probe: counts calls and can raise on the ``fail_on``-th call (an interruption)."""

    def __init__(self, fail_on: int | None = None):
        self.calls = 0
        self.fail_on = fail_on
        self.real = probe_pkg.probe

    def __call__(self, *args, **kwargs):
        self.calls += 1
        if self.fail_on is not None and self.calls == self.fail_on:
            raise KeyboardInterrupt("simulated interruption")
        return self.real(*args, **kwargs)


def test_defaults_are_the_papers_sweep():
    cfg = SweepConfig(model="m")
    assert cfg.fractions == DEFAULT_FRACTIONS == (0.0, 0.5, 0.875, 0.9375, 1.0)
    assert [1 - f for f in cfg.fractions] == [1, 1 / 2, 1 / 8, 1 / 16, 0]
    assert cfg.seed_list == (0, 1, 2)
    assert cfg.kinds == ("average",) and cfg.methods == ("variance",) and cfg.corpora == ("task",)


def test_sweep_writes_one_line_per_cell_and_resumes(tiny_folder, data_dir, tmp_path, monkeypatch):
    model_dir = tiny_folder("bert")
    out = tmp_path / "results.jsonl"
    cfg = config(model_dir, data_dir)

    interrupted = CountingProbe(fail_on=3)
    monkeypatch.setattr(probe_pkg, "probe", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_sweep(cfg, out, progress=False)
    lines = out.read_text().splitlines()
    assert len(lines) == 2  # the two cells that finished, each flushed as it ended

    resumed = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", resumed)
    rows = run_sweep(cfg, out, progress=False)
    assert resumed.calls == 2  # only the two missing cells ran
    assert len(out.read_text().splitlines()) == 4
    assert [json.loads(x) for x in lines] == read_rows(out)[:2]  # finished lines untouched
    assert len(rows) == 4
    assert {(r["fraction"], r["seed"]) for r in rows} == {(0.0, 0), (0.0, 1), (1.0, 0), (1.0, 1)}
    for r in rows:
        for name in ("model", "task", "fraction", "kept_fraction", "kind", "method", "seed", "metric", "score"):
            assert name in r
        for name in ("examples", "steps", "seconds", "papa_surgery_version", "corpus", "max_length"):
            assert name in r
        assert r["kept_fraction"] == pytest.approx(1 - r["fraction"])
        assert r["metric"] == "accuracy" and is_accuracy_of(r["score"], 16), r["score"]  # of the 16 dev sentences
        assert r["examples"] == 40 and r["max_length"] == 32 and r["corpus"] == "task"
        assert r["constant_heads"] == (8 if r["fraction"] == 1.0 else 0)
    attention_free = [r for r in rows if r["fraction"] == 1.0]
    assert all("sst2 training texts" in r["corpus_description"] for r in attention_free)
    assert all(r["calibration_examples"] == 40 for r in attention_free)

    again = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", again)
    assert run_sweep(cfg, out, progress=False) == rows  # nothing left to do
    assert again.calls == 0
    assert (tmp_path / "results.artifacts").is_dir()  # constants saved next to the results


def test_baseline_equals_source_and_identical_cells_run_once(tiny_folder, data_dir, tmp_path, monkeypatch):
    model_dir = tiny_folder("bert")
    out = tmp_path / "r.jsonl"
    counter = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", counter)
    cfg = config(model_dir, data_dir, seeds=(0,), kinds=("average", "identity"), methods=("variance", "random"))
    rows = run_sweep(cfg, out, progress=False)
    assert len(rows) == 8 and len(read_rows(out)) == 8
    # fraction 0 is one model whatever the kind or method; fraction 1 one model per kind
    assert counter.calls == 3
    base = [r for r in rows if r["fraction"] == 0.0]
    assert len({r["score"] for r in base}) == 1
    assert sum("reused_from" in r for r in rows) == 5

    # the fraction-0 cell scores exactly what the probe gives the source model at the same slot count
    from papa_surgery.models.loading import load_source

    model, tok = load_source(str(model_dir))
    source = counter.real(model, tok, "sst2", data_dir=data_dir, seed=0, epochs=1, max_length=32, progress=False)
    assert base[0]["score"] == source["score"]


def test_fraction_half_uses_the_ranking(tiny_folder, data_dir, tmp_path):
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.5,), seeds=1, methods=("first-to-last", "last-to-first"))
    rows = run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    assert [r["constant_heads"] for r in rows] == [4, 4]
    assert [r["method"] for r in rows] == ["first-to-last", "last-to-first"]
    assert all("reused_from" not in r for r in rows)  # different heads, different models
    saved = sorted(p.name.split("-")[0] for p in (tmp_path / "r.artifacts").iterdir())
    assert saved == ["constants", "ranking", "ranking"]  # calibrated once, ranked once per method


def test_two_corpora_of_one_name_or_one_edited_are_calibrated_apart(tiny_folder, data_dir, tmp_path):
    """Constants were cached by the corpus's description, which names a file by its name alone: two ``train.txt``
    of two folders shared the first one's constants, and a file edited since reused the old ones."""
    corpora = []
    for folder, text in (("a", "the cat sat on the mat"), ("b", "stocks fell sharply in early trading")):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "train.txt").write_text("\n".join(f"{text} {i}" for i in range(24)) + "\n")
        corpora.append(str(tmp_path / folder / "train.txt"))
    out = tmp_path / "r.jsonl"
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.5,), seeds=1, corpus=tuple(corpora))
    rows = run_sweep(cfg, out, progress=False)

    def constants_made(what="constants"):
        return sorted(p.name for p in (tmp_path / "r.artifacts").iterdir() if p.name.startswith(what))

    assert len(rows) == 2 and len(constants_made()) == 2  # one per file
    assert len(constants_made("ranking")) == 2  # variance reads each file's own constants
    before = constants_made()
    (tmp_path / "a" / "train.txt").write_text("\n".join(f"a different text, line {i}" for i in range(24)) + "\n")
    run_sweep(config(tiny_folder("bert"), data_dir, fractions=(1.0, 0.5), seeds=1, corpus=corpora[0]), out,
              progress=False)  # fmt: skip
    assert len(constants_made()) == 3 and set(before) < set(constants_made())  # the edited file: calibrated again


def test_a_torn_line_alone_is_repaired_only_when_it_starts_as_a_row(tiny_folder, data_dir, tmp_path):
    """A one-line file of any torn JSON was taken for a results file killed mid-write, and the repair cut it to
    nothing: a user's notes were emptied. Only a line that starts as a row is written is a sweep's own."""
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0,), seeds=1)
    notes = tmp_path / "notes.jsonl"
    notes.write_text('{"todo": "finish the paper", "notes": "chapter 3')
    with pytest.raises(ValueError, match="it is not a results file papa-surgery wrote"):
        run_sweep(cfg, notes, progress=False)
    assert notes.read_text() == '{"todo": "finish the paper", "notes": "chapter 3'
    out = tmp_path / "r.jsonl"
    for torn in ('{"model": "x", "task": "ss', '{"mo'):  # a sweep killed while writing its first row
        out.write_text(torn)
        rows = run_sweep(cfg, out, progress=False)
        assert len(rows) == 1 and len(out.read_text().splitlines()) == 1
    row = out.read_text()
    for cut in (3, 6, 9, 40):  # after a row, its next row torn anywhere, even in its first field
        out.write_text(row + row[:cut])
        assert run_sweep(cfg, out, progress=False) == rows and out.read_text() == row


def test_a_torn_last_line_is_dropped_on_resume(tiny_folder, data_dir, tmp_path):
    out = tmp_path / "r.jsonl"
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0,), seeds=1)
    rows = run_sweep(cfg, out, progress=False)
    out.write_text(out.read_text() + '{"model": "x", "task": "ss')  # killed mid-write
    assert run_sweep(cfg, out, progress=False) == rows
    assert out.read_text().endswith("\n") and len(out.read_text().splitlines()) == 1


@pytest.mark.parametrize(
    "bad, message",
    [
        (dict(tasks=("sst2", "sst-3")), "^tasks: unknown task"),  # the field it was given in (--task: test_probe_data)
        (dict(kinds=("avg",)), "unknown constant kind"),
        (dict(methods=("variances",)), "unknown ranking method"),
        (dict(fractions=(0.0, 1.5)), "between 0 and 1"),
        (dict(tasks=("sst2", "mrpc")), "missing"),  # no local MRPC files: fails before the SST-2 cells run
        (dict(tasks=("mlm",)), "masked-LM head"),
        (dict(corpus="no/such/file.txt"), "corpus"),
    ],
)
def test_bad_input_fails_before_any_line(tiny_folder, data_dir, tmp_path, monkeypatch, bad, message):
    counter = CountingProbe()
    monkeypatch.setattr(probe_pkg, "probe", counter)
    out = tmp_path / "r.jsonl"
    with pytest.raises(ValueError, match=message):
        run_sweep(config(tiny_folder("bert"), data_dir, **bad), out, progress=False)
    assert not out.exists() or out.read_text() == ""
    assert counter.calls == 0


def test_cell_key_ignores_float_noise():
    row = dict(model="m", task="sst2", fraction=0.875, kind="average", method="variance", seed=1)
    assert cell_key(row) == cell_key({**row, "fraction": 7 / 8 + 1e-12, "corpus": "task"})


def test_a_cell_and_its_row_share_one_key_and_rows_without_a_protocol_are_probe_rows():
    cell = Cell(model="m", task="sst2", fraction=0.875, kind="average", method="variance", seed=1)
    old_row = {k: v for k, v in cell.fields().items() if k != "protocol"}  # written before fine-tuning existed
    assert cell.key == cell_key({**cell.fields(), "score": 0.5}) == cell_key(old_row)
    assert cell.with_protocol("finetune").key != cell.key
    cells = SweepConfig(model="m", fractions=(0.5, 1 / 2, 1.0), seeds=1).cells()
    assert [c.fraction for c in cells] == [0.5, 1.0] and all(isinstance(c, Cell) for c in cells)


def test_mlm_sweep_with_a_masked_lm_head(tiny_folder, data_dir, tmp_path):
    wiki = data_dir / "wikitext" / "wikitext-2"
    wiki.mkdir(parents=True, exist_ok=True)
    rng = random.Random(1)
    text = "\n".join(" ".join(rng.choices(FILLER + POSITIVE, k=12)) for _ in range(8))
    (wiki / "wiki.valid.tokens").write_text(" = Title = \n" + text + "\n")
    model_dir = tiny_folder("bert", head="AutoModelForMaskedLM")
    cfg = config(model_dir, data_dir, tasks=("mlm",), seeds=1, max_calibration_examples=16)
    rows = run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    assert [r["fraction"] for r in rows] == [0.0, 1.0]
    assert all(r["metric"] == "neg_log_perplexity" and r["score"] < 0 for r in rows)
    assert "WikiText" in rows[1]["corpus_description"] or "wikitext" in rows[1]["corpus_description"]


def test_a_papa_checkpoint_is_probed_as_it_is(tiny, data_dir, tmp_path):
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.surgery import convert

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = Constants.from_kind("identity", 2, 4, 32)
    papa = convert(model, constants, [[0, 0], [1, 1]], tokenizer=tok, kind="identity", method="given", fraction=0.25)
    folder = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok)
    cfg = SweepConfig(model=str(folder), tasks=("sst2",), seeds=2, data_dir=str(data_dir), epochs=1)
    rows = run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    assert [(r["fraction"], r["kind"], r["seed"], r["constant_heads"], r["max_length"]) for r in rows] == [
        (0.25, "identity", 0, 2, 32),
        (0.25, "identity", 1, 2, 32),
    ]
    with pytest.raises(ValueError, match="probed as it is"):
        run_sweep(SweepConfig(model=str(folder), fractions=(0.5,), data_dir=str(data_dir)), tmp_path / "x.jsonl")


def test_analysis_kinds_and_norm_ranking_in_a_sweep(tiny_folder, data_dir, tmp_path):
    """Issue 5's PAPA variants plug into sweeps like every other kind and method."""
    cfg = config(
        tiny_folder("roberta"), data_dir, fractions=(0.5,), seeds=1,
        kinds=("norm-average", "effective-average"), methods=("norm",),
    )  # fmt: skip
    rows = run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    assert [(r["kind"], r["method"], r["constant_heads"]) for r in rows] == [
        ("norm-average", "norm", 4),
        ("effective-average", "norm", 4),
    ]
    assert all(is_accuracy_of(r["score"], 16) for r in rows)  # accuracies over the 16 dev sentences
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.ranking.order import Ranking

    artifacts = sorted((tmp_path / "r.artifacts").iterdir())
    kinds = sorted(Constants.load(p).kind for p in artifacts if p.suffix == ".safetensors")
    assert kinds == ["effective-average", "norm-average"]  # the norm ranking reused the norm-average pass
    (ranking,) = [Ranking.load(p) for p in artifacts if p.suffix == ".json"]
    assert ranking.method == "norm" and ranking.scores == sorted(ranking.scores)


def test_lambda_methods_in_a_sweep(tiny_folder, data_dir, tmp_path):
    """lambda and reversed-lambda run through the sweep's preflight and share one lambda training."""
    cfg = config(
        tiny_folder("bert"), data_dir, fractions=(0.5,), seeds=1, methods=("lambda", "reversed-lambda"),
        rank_options={"steps": 2},
    )  # fmt: skip
    rows = run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    assert [(r["method"], r["constant_heads"]) for r in rows] == [("lambda", 4), ("reversed-lambda", 4)]
    from papa_surgery.ranking.order import Ranking

    rankings = [Ranking.load(p) for p in sorted((tmp_path / "r.artifacts").glob("*.json"))]
    assert [(r.method, r.provenance["steps"]) for r in rankings] == [("lambda", 2)]  # reversed-lambda reads it back


def test_distilled_kind_in_a_sweep_resumes_and_reports(tiny_folder, data_dir, tmp_path):
    from papa_surgery.report import write_report

    cfg = config(
        tiny_folder("bert"), data_dir, fractions=(1.0,), seeds=1, kinds=("average", "distilled"),
        distill_options={"steps": 3},
    )  # fmt: skip
    out = tmp_path / "r.jsonl"
    rows = run_sweep(cfg, out, progress=False)
    assert [(r["kind"], r["constant_heads"]) for r in rows] == [("average", 8), ("distilled", 8)]
    assert rows[1]["calibration_examples"] == rows[0]["calibration_examples"]  # distilled from that average
    assert rows[1]["options"]["distill_options"] == {"steps": 3}
    assert run_sweep(cfg, out, progress=False) == rows  # resumed: nothing left to run
    assert len(out.read_text().splitlines()) == 2
    report = write_report(out, tmp_path / "report")[0].read_text()
    assert "| distilled |" in report and "| average |" in report  # both kinds in the Table 1 style table


def test_probe_sweeps_the_sharpened_kind_with_the_search_asked_for(tiny_folder, data_dir, tmp_path, monkeypatch):
    """``probe --kind sharpened`` fits per head unless ``--sharpen-search`` says otherwise; rows record the search,
    the fitted constants say it, and resuming with another search is refused by name."""
    from conftest import cli

    from papa_surgery.healing import sharpness

    fitted, real_sharpen = [], sharpness.sharpen
    monkeypatch.setattr(sharpness, "sharpen", lambda *a, **k: fitted.append(real_sharpen(*a, **k)) or fitted[-1])
    source = tiny_folder("bert")
    common = ["--task", "sst2", "--data-dir", data_dir, "--fractions", "1", "--seeds", 1, "--epochs", 1]
    common += ["--max-length", 32, "--kind", "average", "--kind", "sharpened"]
    searched = {}
    for search in ("per-head", "walk"):
        out = tmp_path / f"{search}.jsonl"
        result = cli(
            "probe", source, *common, *(["--sharpen-search", "walk"] if search == "walk" else []), "--out", out
        )
        assert result.exit_code == 0, result.output
        rows = read_rows(out)
        assert [r["kind"] for r in rows] == ["average", "sharpened"]
        assert all(r["options"]["sharpen_search"] == search for r in rows)
        searched[search] = {c.metadata["sharpened"]["search"] for c in fitted}
        fitted.clear()
    assert searched == {"per-head": {"per-head"}, "walk": {"walk"}}
    again = cli("probe", source, *common, "--out", tmp_path / "walk.jsonl")  # per-head on walk's rows
    assert again.exit_code != 0 and "--sharpen-search walk" in again.output, again.output
    old = tmp_path / "walk.jsonl"  # rows written before they recorded the search (the walk was the default then)
    rows = [json.loads(line) for line in old.read_text().splitlines()]
    for row in rows:
        del row["options"]["sharpen_search"]
    old.write_text("".join(json.dumps(row) + "\n" for row in rows))
    again = cli("probe", source, *common, "--fractions", "0.5", "--out", old)
    assert again.exit_code != 0 and "--sharpen-search walk" in again.output, again.output
    with pytest.raises(ValueError, match="sharpen_search: must be one of per-head, walk, grid"):
        config(source, data_dir, kinds=("sharpened",), sharpen_search="best").validate()


def test_labeled_kinds_change_only_constants_and_probe_resume_and_report(tiny_folder, data_dir, tmp_path, monkeypatch):
    """Paper Table 1 rows 4-5: constants trained with the probe; the backbone and the source stay untouched."""
    import papa_surgery.probing.labeled as labeled_module
    from papa_surgery.report import write_report

    trained = []
    real = labeled_module.labeled_probe

    def spy(model, *args, **kwargs):
        before = {k: v.clone() for k, v in model.state_dict().items()}
        result = real(model, *args, **kwargs)
        after = model.state_dict()
        changed = {k for k in before if not torch.equal(before[k], after[k])}
        trained.append(changed)
        return result

    monkeypatch.setattr(labeled_module, "labeled_probe", spy)
    kinds = ("identity", "toeplitz", "zeros", "labeled-toeplitz", "labeled-average", "average")
    cfg = config(tiny_folder("bert"), data_dir, fractions=(0.0, 1.0), seeds=1, kinds=kinds)
    out = tmp_path / "r.jsonl"
    rows = run_sweep(cfg, out, progress=False)
    assert {r["kind"] for r in rows if r["fraction"] == 1.0} == set(kinds)
    assert len(trained) == 2 and all(
        changed and all(k.endswith("papa_constants") for k in changed) for changed in trained
    )
    labeled = [r for r in rows if r["kind"].startswith("labeled-") and r["fraction"] == 1.0]
    assert all(is_accuracy_of(r["score"], 16) and r["cached"] is False for r in labeled)
    assert run_sweep(cfg, out, progress=False) == rows and len(trained) == 2  # resumed: nothing ran again
    report = write_report(out, tmp_path / "report")[0].read_text()
    table = report[report.index("## Constant kinds") :]
    order = [table.index(f"| {k} |") for k in kinds]
    assert order == sorted(order) and "original (fraction 0)" in table  # the paper's Table 1 rows, in its order


def test_a_short_corpus_is_said_once_in_a_sweep_of_several_kinds(tiny_folder, tmp_path):
    """The average's coverage warning is said once, however many cells and rankings read those constants; the
    data-free kind's cells (whose ranking reads the average) add none."""
    import warnings

    from papa_surgery.calibration.coverage import CoverageWarning

    write_sst2(tmp_path / "data")
    cfg = config(tiny_folder("bert"), tmp_path / "data", fractions=(0.5, 1.0), seeds=1, kinds=("average", "toeplitz"),
                 methods=("variance",))  # fmt: skip
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_sweep(cfg, tmp_path / "r.jsonl", progress=False)
    said = [w for w in caught if issubclass(w.category, CoverageWarning)]
    assert len(said) == 1, [str(w.message) for w in said]
