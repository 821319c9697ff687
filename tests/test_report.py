"""The report: means and 95% t-intervals equal a hand computation from the JSONL; tables and figures are written."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

import pytest
from test_sweep import write_sst2

from papa_surgery.experiments import SweepConfig, run_sweep
from papa_surgery.report import (
    constant_matrices,
    load_results,
    relative_drops,
    summarize,
    t_critical,
    table_corpora,
    table_kinds,
    write_report,
)

T95 = {1: 12.706, 2: 4.303, 4: 2.776, 9: 2.262, 29: 2.045}  # textbook two-sided 95% values


T95_DF1 = math.tan(0.475 * math.pi)  # exact: Student's t with 1 degree of freedom is the Cauchy distribution
T95_DF2 = (2 * 0.975 - 1) / math.sqrt(2 * 0.975 * 0.025)  # exact: the df = 2 quantile is (2p - 1) / sqrt(2p(1 - p))


def test_t_critical_matches_the_textbook():
    assert t_critical(1) == pytest.approx(T95_DF1, rel=1e-12)
    assert t_critical(2) == pytest.approx(T95_DF2, rel=1e-12)
    for df, t in T95.items():
        assert t_critical(df) == pytest.approx(t, abs=1e-3)
    assert t_critical(60) == pytest.approx(2.000, abs=1e-3)
    assert t_critical(1000) == pytest.approx(1.962, abs=1e-3)
    with pytest.raises(ValueError):
        t_critical(0)


def _row(task, fraction, seed, score, kind="average", method="variance", corpus="task", model="m"):
    return dict(
        model=model,
        task=task,
        fraction=fraction,
        kept_fraction=1 - fraction,
        kind=kind,
        method=method,
        seed=seed,
        corpus=corpus,
        metric="accuracy",
        score=score,
    )


def test_summary_equals_a_hand_computation():
    rows = [_row("sst2", 1.0, s, x) for s, x in enumerate([0.80, 0.90, 0.85])]
    rows += [_row("sst2", 0.0, 0, 0.95)]  # one seed: no interval
    rows += [_row("sst2", 1.0, 1, 0.90)]  # a repeated seed counts once
    (one_seed, three) = sorted(summarize(rows), key=lambda e: e["fraction"])
    assert three["n"] == 3 and three["seeds"] == [0, 1, 2]
    assert three["mean"] == pytest.approx(0.85)
    assert three["std"] == pytest.approx(0.05)
    assert three["ci95"] == pytest.approx(4.3027 * 0.05 / math.sqrt(3), rel=1e-4)
    assert three["low"] == pytest.approx(0.85 - three["ci95"]) and three["kept_fraction"] == 0.0
    assert one_seed["mean"] == 0.95 and one_seed["ci95"] is None and one_seed["kept_fraction"] == 1.0


def test_tables_have_the_papers_shape():
    rows = []
    for task, orig in (("sst2", 0.90), ("cola", 0.40)):
        for seed in range(2):
            rows.append(_row(task, 0.0, seed, orig))
            rows.append(_row(task, 1.0, seed, orig - 0.05 - 0.01 * seed))
            rows.append(_row(task, 1.0, seed, orig - 0.10, kind="identity"))
            rows.append(_row(task, 1.0, seed, orig - 0.06, corpus="task:mnli"))
    kinds = table_kinds(rows).splitlines()
    assert kinds[0].startswith("| kind | sst2 (accuracy) | cola (accuracy) |")
    # The paper's Table 1 order (identity ... average), whatever order the rows came in.
    assert [line.split("|")[1].strip() for line in kinds[2:]] == ["original (fraction 0)", "identity", "average"]
    ci = t_critical(1) * statistics.stdev([0.85, 0.84]) / math.sqrt(2)
    assert f"0.845 ± {ci:.3f}" in kinds[4]
    corpora = table_corpora(rows).splitlines()
    assert [line.split("|")[1].strip() for line in corpora[2:]] == ["per-task", "mnli"]
    assert "0.840 ± 0.000" in corpora[3]
    (drop,) = relative_drops(rows)
    assert drop["original"] == pytest.approx(0.65)
    assert drop["relative_drop"] == pytest.approx((0.055 / 0.9 + 0.055 / 0.4) / 2)


@pytest.fixture(scope="module")
def sweep_results(tiny_folder, tmp_path_factory):
    root = tmp_path_factory.mktemp("report")
    data_dir = write_sst2(root / "data")
    config = SweepConfig(
        model=str(tiny_folder("bert")),
        tasks=("sst2",),
        fractions=(0.0, 0.5, 1.0),
        seeds=2,
        kinds=("average", "zeros"),
        methods=("variance", "last-to-first"),
        data_dir=str(data_dir),
        epochs=4,
        lr=3e-3,
        max_length=32,
    )
    out = root / "results.jsonl"
    run_sweep(config, out, progress=False)
    return out


def test_report_numbers_equal_a_hand_computation_from_the_jsonl(sweep_results):
    raw = [json.loads(line) for line in sweep_results.read_text().splitlines()]
    assert len(raw) == 3 * 2 * 2 * 2
    assert load_results(sweep_results) == raw
    summary = summarize(raw)
    assert len(summary) == 3 * 2 * 2
    for entry in summary:
        scores = [
            r["score"]
            for r in raw
            if (r["kind"], r["method"], r["fraction"]) == (entry["kind"], entry["method"], entry["fraction"])
        ]
        assert len(scores) == 2
        mean = sum(scores) / 2
        sd = math.sqrt(sum((x - mean) ** 2 for x in scores) / 1)
        assert entry["mean"] == pytest.approx(mean, abs=1e-12)
        assert entry["ci95"] == pytest.approx(T95_DF1 * sd / math.sqrt(2), rel=1e-12)
    assert any(e["ci95"] > 0 for e in summary)  # seeds differ, so the intervals are not all degenerate


def test_write_report_writes_tables_and_figures(sweep_results, tmp_path):
    constants = next((sweep_results.parent / "results.artifacts").glob("constants-*.safetensors"))
    paths = write_report(sweep_results, tmp_path / "report", constants=constants)
    names = [p.name for p in paths]
    assert names == ["report.md", "fig2_fractions.png", "fig3.png", "fig5_methods.png", "fig4_constants.png"]
    for path in paths:
        assert path.is_file() and path.stat().st_size > 0
    for path in paths[1:]:
        assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = paths[0].read_text()
    assert "Table 1" in text and "| average |" in text and "| zeros |" in text
    assert "![Score vs share of heads kept input-dependent (Fig. 2)](fig2_fractions.png)" in text
    assert "Table 2" not in text  # one calibration corpus only


def test_constant_heat_maps_from_a_checkpoint(tiny, tmp_path):
    from conftest import SENTENCES

    from papa_surgery.calibration.average import calibrate
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.surgery import convert

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = calibrate(model, tok, SENTENCES, max_length=16, progress=False)
    papa = convert(model, constants, [[0, 1], [1, 2], [1, 3]], tokenizer=tok)
    folder = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok)
    picked = constant_matrices(folder, heads=[[1, 2]])
    assert picked[0][0] == "(1, 2)"
    assert picked[0][1] == pytest.approx(constants.values[1, 2].numpy())
    assert [t for t, _ in constant_matrices(folder)] == ["(0, 1)", "(1, 2)", "(1, 3)"]
    assert [t for t, _ in constant_matrices(constants, max_heads=3)] == ["(0, 0)", "(1, 0)", "(1, 3)"]
    with pytest.raises(ValueError, match="no constant matrix"):
        constant_matrices(folder, heads=[[0, 0]])


def test_bad_results_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        write_report(tmp_path / "nope.jsonl", tmp_path / "out")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    with pytest.raises(ValueError, match="no results"):
        write_report(empty, tmp_path / "out")


def test_report_never_writes_over_the_users_files(sweep_results, tmp_path):
    """``report --out`` writes a new or empty folder; an earlier report is replaced only with ``--overwrite``, and a
    folder holding anything else is refused whatever the flag says, with the user's files untouched (it replaced a
    ``report.md`` of the user's, silently)."""
    from conftest import cli

    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my own report\n")
    (mine / "notes.txt").write_text("keep me\n")
    for extra in ((), ("--overwrite",)):
        result = cli("report", sweep_results, "--out", mine, *extra)
        assert result.exit_code == 1 and "refusing to overwrite" in result.output, result.output
        assert "notes.txt" in result.output and "report.md" in result.output
    assert sorted(p.name for p in mine.iterdir()) == ["notes.txt", "report.md"]
    assert (mine / "report.md").read_text() == "my own report\n"
    empty = tmp_path / "empty"
    empty.mkdir()
    result = cli("report", sweep_results, "--out", empty)
    assert result.exit_code == 0 and (empty / "report.md").read_text().startswith("# PAPA "), result.output
    result = cli("report", sweep_results, "--out", empty)
    assert result.exit_code == 1 and "--overwrite" in result.output, result.output
    made = sorted(p.name for p in empty.iterdir())
    assert "fig4_constants.png" not in made  # these results have no constants to draw
    (empty / "fig3.png").unlink()  # the report is replaced whole: a deleted figure comes back, a stale one is redrawn
    (empty / "fig2_fractions.png").write_bytes(b"stale")
    (empty / "fig4_constants.png").write_bytes(b"old")  # and a figure this report no longer makes does not stay
    result = cli("report", sweep_results, "--out", empty, "--overwrite")
    assert result.exit_code == 0 and sorted(p.name for p in empty.iterdir()) == made, result.output
    assert (empty / "fig2_fractions.png").read_bytes()[:4] == b"\x89PNG" and (empty / "fig3.png").is_file()
    (empty / "draft.md").write_text("mine\n")  # an earlier report the user added to: refused, naming the file
    result = cli("report", sweep_results, "--out", empty, "--overwrite")
    assert result.exit_code == 1 and "draft.md" in result.output, result.output
    assert (empty / "draft.md").read_text() == "mine\n"
    with pytest.raises(ValueError, match="is a file"):
        write_report(sweep_results, mine / "notes.txt")
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging left behind


def test_report_into_the_working_folder_is_refused_before_it_is_pulled_away(sweep_results, tmp_path, monkeypatch):
    """A report folder is moved into place whole: ``--out "$PWD" --overwrite`` removed the shell's working folder
    (and ``--out .``, empty, replaced it with a new one). Both are refused, naming the fix; the folder stays."""
    from conftest import cli

    done = tmp_path / "done"
    assert cli("report", sweep_results, "--out", done).exit_code == 0
    before = sorted(p.name for p in done.iterdir())
    inode = done.stat().st_ino
    monkeypatch.chdir(done)
    for out in (".", str(done), ".."):
        result = cli("report", sweep_results, "--out", out, "--overwrite")
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "refusing to write into" in said, said
        assert "a path that does not exist yet" in said, said
    assert done.stat().st_ino == inode and sorted(p.name for p in done.iterdir()) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = cli("report", sweep_results, "--out", ".")
    assert result.exit_code == 1 and "folder you are working in" in " ".join(result.output.split())
    assert list(empty.iterdir()) == [] and Path.cwd().resolve() == empty.resolve()
    assert cli("report", sweep_results, "--out", "report").exit_code == 0  # a new folder works
    (tmp_path / "link").symlink_to(empty / "report", target_is_directory=True)
    result = cli("report", sweep_results, "--out", tmp_path / "link", "--overwrite")
    assert result.exit_code == 1 and "is a symbolic link" in " ".join(result.output.split()), result.output
    assert (tmp_path / "link").is_symlink()
    assert (empty / "report" / "report.md").is_file()


def _contrast(image, matrix) -> float:
    """How much brighter, on the figure's colour scale, the diagonal band is than the far cells (0 to 1)."""
    import numpy as np

    weights = np.asarray(image.get_array().filled(0.0))
    shown = np.asarray(image.norm(np.where(weights > 0, weights, np.nan)))
    n = matrix.shape[0]
    offset = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])
    body = np.ones((n, n), dtype=bool)
    body[:, 0] = False  # the [CLS] column is bright on any scale
    return float(np.nanmean(shown[(offset <= 1) & body]) - np.nanmean(shown[(offset > 8) & body]))


def test_constant_heat_maps_show_the_diagonal_bands(tmp_path):
    """Averaged attention: a heavy [CLS] column and faint diagonal bands; the figure's scale must show the bands."""
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    from papa_surgery.report.figures import draw_constants

    n = 32
    offset = np.abs(np.arange(n)[None, :] - np.arange(n)[:, None])
    matrix = 0.002 + 0.03 / (1.0 + offset) ** 2  # bands near the diagonal, a floor far away
    matrix[:, 0] = 0.9  # most of every row's mass on [CLS]
    fig = draw_constants([("(0, 0)", matrix)])
    image = fig.axes[0].images[0]
    assert isinstance(image.norm, LogNorm)
    assert _contrast(image, matrix) > 0.3
    # The test can fail: on the old linear scale the bands are nearly as dark as the far cells.
    image.set_norm(Normalize(vmin=0.0, vmax=float(image.get_array().max())))
    assert _contrast(image, matrix) < 0.05


def _protocol_row(protocol: str, fraction: float, seed: int, score: float, examples: int, **extra) -> dict:
    return {
        "model": "m", "task": "sst2", "corpus": "task", "kind": "average", "method": "variance", "metric": "accuracy",
        "fraction": fraction, "seed": seed, "score": score, "examples": examples, "eval_examples": 872,
        "protocol": protocol, **extra,
    }  # fmt: skip


def test_the_report_says_what_it_holds_and_what_its_numbers_are_worth(tmp_path):
    """A tiny fine-tuning sweep beside a probe sweep: one-class models, other sizes, timings within their noise."""
    rows = [_protocol_row("probe", f, s, 0.80 - 0.1 * f + 0.01 * s, 2000) for f in (0.0, 1.0) for s in range(2)]
    speeds = {(0.0, 0): 100.0, (0.0, 1): 140.0, (1.0, 0): 110.0, (1.0, 1): 150.0}  # 1.09x, spread far wider
    rows += [
        _protocol_row("finetune", f, s, 0.509, 300, predicted_classes=1, train_examples_per_second=speeds[f, s],
             inference_examples_per_second=400.0 + 100 * f + s, checkpoint_bytes=1000 - 100 * f, peak_memory_mb=50.0)
        for f in (0.0, 1.0) for s in range(2)
    ]  # fmt: skip
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    text = write_report(path, tmp_path / "report")[0].read_text()
    assert text.startswith("# PAPA probing and fine-tuning report")
    assert "(8 rows: 4 probe, 4 fine-tuning)" in text
    table = text.split("## Fine-tuned and probed")[1].split("\n## ")[0]
    assert "0.509 ± 0.000 (one class) †" in table
    assert "† sst2: the probe trained / evaluated on 2000 / 872 examples, fine-tuning on 300 / 872" in table
    ratio = statistics.fmean([110.0, 150.0]) / statistics.fmean([100.0, 140.0])
    assert f"{ratio:.2f}× ± " in table and "(noise)" in table  # the spread covers 1x: not a measured speed-up
    everything = text.split("## All fine-tuning results")[1]
    assert "train / eval examples" in everything and "300 / 872" in everything and "(one class)" in everything
    assert (
        "# PAPA fine-tuning report"
        in write_report([_write(tmp_path / "t.jsonl", rows[4:])], tmp_path / "t")[0].read_text()
    )


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_a_sweep_says_how_many_rows_it_added_and_its_file_holds(tiny_folder, tmp_path):
    from test_sweep import write_sst2

    from papa_surgery.cli import main

    data = write_sst2(tmp_path / "data")
    out = _write(tmp_path / "r.jsonl", [_protocol_row("finetune", 0.0, s, 0.5, 300) for s in range(3)])
    args = ["-q", "probe", str(tiny_folder("bert")), "--task", "sst2", "--data-dir", str(data), "--fractions", "0,1"]
    from click.testing import CliRunner

    result = CliRunner().invoke(main, [*args, "--seeds", "1", "--max-length", "32", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert f"2 rows of this sweep (2 new) in {out}, which holds 5 rows" in result.output


def test_one_cell_in_two_files_with_other_scores_is_said(tmp_path, caplog):
    """``report a.jsonl b.jsonl`` kept b's row of a cell and seed that a.jsonl held too, with another score, and
    said nothing: the mean mixed two measurements. A row repeated as it was (the same file twice) says nothing."""
    rows = [_row("sst2", f, seed, 0.8 - f / 4) for f in (0.0, 1.0) for seed in (0, 1)]
    (tmp_path / "run1").mkdir(), (tmp_path / "run2").mkdir()  # the usual layout: one name, two folders
    first = _write(tmp_path / "run1" / "r.jsonl", rows)
    other = _write(tmp_path / "run2" / "r.jsonl", [{**rows[0], "score": 0.1}])
    with caplog.at_level("WARNING", logger="papa_surgery"):
        write_report([first, first], tmp_path / "same")
    assert "more than one results file" not in caplog.text
    with caplog.at_level("WARNING", logger="papa_surgery"):
        write_report([first, other], tmp_path / "mixed")
    said = [r.getMessage() for r in caplog.records if "more than one results file" in r.getMessage()]
    assert len(said) == 1 and "1 cell(s)" in said[0], said
    assert f"0.8 in {tmp_path / 'run1' / 'r.jsonl'}, 0.1 in {tmp_path / 'run2' / 'r.jsonl'}" in said[0], said


def test_the_report_says_each_tasks_note(tmp_path):
    """MNLI from local files trains on dev-matched and scores dev-mismatched: rows said so, the report did not."""
    note = "local files hold no MNLI train split: with --data-dir the probe trains on dev-matched"
    rows = [{**_row("mnli", f, 0, 0.5 - f / 8), "note": note} for f in (0.0, 1.0)]
    rows += [_row("sst2", f, 0, 0.8 - f / 4) for f in (0.0, 1.0)]
    write_report(_write(tmp_path / "r.jsonl", rows), tmp_path / "rep")
    text = (tmp_path / "rep" / "report.md").read_text()
    assert text.count(f"- *mnli*: {note}") == 1 and "- *sst2*" not in text
