"""Tables and figures from a sweep's results (paper Tables 1-2, Figs. 2-5): ``write_report``.

By job: ``stats`` (means over seeds with 95% t-intervals, relative drops), ``tables`` (markdown),
``figures`` (matplotlib, the paper's axis: the share of heads kept input-dependent, ``1 - fraction``) and
``tensors`` (constant matrices read back from constants files and checkpoints) and ``finetuned``
(fine-tuned beside probed scores, with cost relative to the source).
"""

from __future__ import annotations

from pathlib import Path

from .figures import plot_constants, plot_drop, plot_finetuned, plot_fractions, plot_methods
from .finetuned import cost_summary, split_protocols, table_finetuned
from .stats import (
    GROUP_FIELDS,
    METHOD_PREFERENCE,
    group_key,
    load_results,
    relative_drops,
    summarize,
    t_critical,
)
from .tables import corpus_label, markdown_table, table_all, table_corpora, table_kinds
from .tensors import constant_matrices

__all__ = [
    "GROUP_FIELDS",
    "METHOD_PREFERENCE",
    "constant_matrices",
    "cost_summary",
    "corpus_label",
    "load_results",
    "plot_constants",
    "plot_drop",
    "plot_finetuned",
    "plot_fractions",
    "plot_methods",
    "relative_drops",
    "summarize",
    "t_critical",
    "table_all",
    "table_corpora",
    "table_finetuned",
    "table_kinds",
    "write_report",
]


def write_report(results_path, out_dir, constants=None, *, overwrite: bool = False) -> list[Path]:
    """Write ``report.md`` (all scores, Table 1, Table 2, fine-tuned vs probed with cost) and the figures.

    The paper's tables and figures are made from the probe rows (from the fine-tuning rows when there are
    no probe rows); fine-tuning rows add a section with both protocols side by side and the cost columns.

    Args:
        results_path: a sweep's JSONL results, or several (e.g. a probe file and a finetune file).
        out_dir: output folder: a new path or an empty folder; an earlier report folder is replaced only with
            ``overwrite``, and never a folder holding anything else. It appears whole or not at all.
        constants: optional constants file, ``Constants`` or PAPA checkpoint for the Fig. 4 heat maps.
        overwrite: replace an earlier report papa-surgery wrote at ``out_dir``.

    Returns:
        The written files: ``report.md`` first, then the PNG figures.

    Raises:
        FileNotFoundError: no results file.
        ValueError: no result rows in it, or ``out_dir`` may not be written (the error says why).
        OutputExistsError: a folder appeared at ``out_dir`` while this ran (another run, the user): it is left
            as it was, and the finished result is kept beside it, at the path the error names.
    """
    from ..outputs.overwrite import check_output_folder
    from ..outputs.staging import staged_dir

    out_dir = Path(out_dir)
    check_output_folder(out_dir, overwrite, "report")
    paths = [results_path] if isinstance(results_path, (str, Path)) else list(results_path)
    per_file = [load_results(path) for path in paths]
    _warn_repeated_cells(paths, per_file)
    all_rows = [row for rows in per_file for row in rows]
    names = ", ".join(f"`{Path(p).name}`" for p in paths)
    if not any(r.get("score") is not None for r in all_rows):
        raise ValueError(f"{names} holds no results")
    probed, tuned = split_protocols(all_rows)
    check = lambda target: check_output_folder(target, overwrite, "report")  # noqa: E731  (again, before replacing)
    with staged_dir(out_dir, overwrite=overwrite, check=check) as staging:
        written = _write(all_rows, probed, tuned, names, staging, constants)
    return [out_dir / path.name for path in written]


def _warn_repeated_cells(paths: list, per_file: list[list[dict]]) -> None:
    """Warn when one cell and seed is in more than one file with another score or example count: the report keeps
    the last file's row (a seed counts once), so the other file's is left out of the mean and its interval."""
    import logging
    import os

    from ..experiments.results import protocol

    first: dict[tuple, tuple] = {}  # (cell, protocol, seed) -> (file, score, example counts)
    clashes = []
    for path, rows in zip(map(os.path.normpath, map(str, paths)), per_file, strict=True):
        for row in rows:
            if row.get("score") is None:
                continue
            key = (*group_key(row), protocol(row), int(row.get("seed", 0)))
            seen = (path, row["score"], (row.get("examples"), row.get("eval_examples")))  # as the user named it
            earlier = first.setdefault(key, seen)
            if earlier[0] != seen[0] and earlier[1:] != seen[1:]:
                clashes.append((key, earlier, seen))
    if clashes:
        key, earlier, later = clashes[0]
        logging.getLogger("papa_surgery").warning(
            "%d cell(s) and seed(s) are in more than one results file with other scores or example counts; the "
            "report keeps the last file's row (e.g. %s %s at fraction %s, seed %s: %s in %s, %s in %s); report "
            "such files apart",
            len(clashes), key[1], key[3], key[5], key[7], earlier[1], earlier[0], later[1], later[0],
        )  # fmt: skip


def _write(all_rows, probed, tuned, names: str, out_dir: Path, constants) -> list[Path]:
    """Write the report and its figures into ``out_dir``; the written files, ``report.md`` first."""
    rows = probed or tuned
    figures: list[tuple[str, Path | None]] = [
        ("Score vs share of heads kept input-dependent (Fig. 2)", plot_fractions(rows, out_dir / "fig2_fractions.png")),
        ("Original score vs relative drop with every head constant (Fig. 3)", plot_drop(rows, out_dir / "fig3.png")),
        ("Ranking methods (Fig. 5)", plot_methods(rows, out_dir / "fig5_methods.png")),
        ("Fine-tuned and probed (Fig. 2 style)", plot_finetuned(all_rows, out_dir / "fig2_finetuned.png")),
    ]
    if constants is not None:
        figures.append(("Constant matrices (Fig. 4)", plot_constants(constants, out_dir / "fig4_constants.png")))
    figures = [(title, path) for title, path in figures if path is not None]

    summary = summarize(rows)
    fractions = {e["fraction"] for e in summary}
    end = 1.0 if 1.0 in fractions else max(fractions)
    lines = [
        "# PAPA " + " and ".join(n for n, rs in (("probing", probed), ("fine-tuning", tuned)) if rs) + " report",
        "",
        f"Results: {names} ({_counts(probed, tuned)}). Scores are means over seeds ± the 95% "
        "confidence interval (t-distribution). *fraction* is the share of heads made constant; figures show "
        "the share kept input-dependent (1 − fraction), like the paper.",
        "",
        *[f"- *{task}*: {note}" for task, note in sorted({(r["task"], r["note"]) for r in rows if r.get("note")})],
        "",
        f"## Constant kinds (Table 1 style, fraction {end:g})",
        "",
        table_kinds(rows, fraction=end),
        "",
    ]
    if len({e["corpus"] for e in summary if e["kind"] == "average"}) > 1:
        lines += [f"## Calibration corpora (Table 2 style, fraction {end:g})", "", table_corpora(rows, end), ""]
    drops = relative_drops(rows)
    if drops:
        lines += ["## Relative drop with every head constant (Fig. 3)", ""]
        lines += [
            markdown_table(
                ["model", "tasks", "original (mean)", "relative drop"],
                [
                    [d["model"], ", ".join(d["tasks"]), f"{d['original']:.3f}", f"{100 * d['relative_drop']:.1f}%"]
                    for d in drops
                ],
                text_columns=2,
            ),
            "",
        ]
    if tuned:
        lines += [
            "## Fine-tuned and probed, with cost relative to the source (fraction 0)",
            "",
            "Speed-ups are examples per second relative to fraction 0 (> 1 is faster), ± their spread over seeds "
            "(from each side's seed-to-seed standard deviation): wall-clock times on the machine that ran the sweep, "
            "which other work may have slowed, so a speed-up marked (noise), within its spread of 1×, was not "
            "measured, and one marked (1 run) has no spread. Size is the checkpoint's weights and peak memory the "
            "run's peak, both relative to fraction 0 (< 1 is smaller). Scores marked (one class) come from a model "
            "that predicted a single class for every example.",
            "",
            table_finetuned(all_rows),
            "",
        ]
    lines += ["## Figures", ""]
    lines += [f"![{title}]({path.name})" for title, path in figures]
    lines += ["", "## All results", "", table_all(rows), ""]
    if probed and tuned:
        lines += ["## All fine-tuning results", "", table_all(tuned), ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return [report, *[path for _, path in figures]]


def _counts(probed: list, tuned: list) -> str:
    """The rows a report reads, by protocol: "6 rows: 3 probe, 3 fine-tuning"."""
    parts = [f"{len(rs)} {name}" for name, rs in (("probe", probed), ("fine-tuning", tuned)) if rs]
    total = len(probed) + len(tuned)
    return f"{total} rows" + (f": {', '.join(parts)}" if len(parts) > 1 else "")
