"""Markdown tables from a sweep's results (paper Tables 1-2 and every group)."""

from __future__ import annotations

from fractions import Fraction

from .stats import METHOD_PREFERENCE, ordered, pick, prefer, summarize


def cell(entry: dict | None, digits: int = 3) -> str:
    if entry is None:
        return "–"
    text = f"{entry['mean']:.{digits}f}"
    return text + (f" ± {entry['ci95']:.{digits}f}" if entry["ci95"] is not None else "")


def markdown_table(header: list[str], body: list[list[str]], text_columns: int = 1) -> str:
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _per_model(rows, build) -> str:
    summary = summarize(rows)
    models = ordered(e["model"] for e in summary)
    parts = []
    for model in models:
        table = build([e for e in summary if e["model"] == model])
        if table:
            parts.append((f"**{model}**\n\n" if len(models) > 1 else "") + table)
    return "\n\n".join(parts)


def corpus_label(spec: str) -> str:
    """Display name of a calibration corpus spec (``task`` -> ``per-task``, ``task:mnli`` -> ``mnli``)."""
    if spec == "task":
        return "per-task"
    if spec.startswith("task:"):
        return spec.split(":", 1)[1]
    return spec


def short_model(model: str) -> str:
    """A model's display name: the last component of its Hub id or path."""
    return str(model).rstrip("/").split("/")[-1]


def fraction_label(x: float) -> str:
    f = Fraction(x).limit_denominator(64)
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


TABLE1_KINDS = ("identity", "toeplitz", "zeros", "labeled-toeplitz", "labeled-average", "average")  # paper order


def table1_order(kinds: list[str]) -> list[str]:
    """Kinds in the paper's Table 1 order (Identity ... Average), then any other kind as it first appeared; a healed
    twin (``average+healed``) right after its kind."""
    from ..registry import healed_label, split_healed

    plain = [k for k in kinds if not split_healed(k)[1]]
    plain = [k for k in TABLE1_KINDS if k in plain] + [k for k in plain if k not in TABLE1_KINDS]
    order = [label for k in plain for label in (k, healed_label(k)) if label in kinds]
    return order + [k for k in kinds if k not in order]


def table_kinds(rows, fraction: float = 1.0, corpus: str | None = None) -> str:
    """Table-1-style markdown: constant kinds (rows) x tasks (columns) at ``fraction``, plus the original model.

    Each cell is the mean ± 95% CI over seeds. At fraction 1 every ranking method gives the same model, so
    the preferred method (lambda, then variance, ...) is shown. ``corpus``: which calibration corpus
    (default: the first in the results). One table per model.
    """

    def build(summary):
        tasks = ordered(e["task"] for e in summary)
        spec = corpus or prefer((e["corpus"] for e in summary), ("task",))
        kinds = table1_order(ordered(e["kind"] for e in summary))
        body = [["original (fraction 0)", *[cell(pick(summary, task=t, fraction=0.0)) for t in tasks]]]
        for kind in kinds:
            cells = []
            for t in tasks:
                methods = [e["method"] for e in summary if e["task"] == t and e["kind"] == kind]
                method = prefer(methods, METHOD_PREFERENCE)
                cells.append(cell(pick(summary, task=t, kind=kind, method=method, corpus=spec, fraction=fraction)))
            body.append([kind, *cells])
        metrics = {t: pick(summary, task=t)["metric"] for t in tasks}
        return markdown_table(["kind", *[f"{t} ({metrics[t]})" for t in tasks]], body)

    return _per_model(rows, build)


def table_corpora(rows, fraction: float = 1.0, kind: str = "average") -> str:
    """Table-2-style markdown: calibration corpora (rows) x tasks (columns), ``kind`` constants at ``fraction``."""

    def build(summary):
        summary = [e for e in summary if e["kind"] == kind]
        tasks = ordered(e["task"] for e in summary)
        body = []
        for spec in ordered(e["corpus"] for e in summary):
            cells = []
            for t in tasks:
                method = prefer((e["method"] for e in summary if e["task"] == t), METHOD_PREFERENCE)
                cells.append(cell(pick(summary, task=t, method=method, corpus=spec, fraction=fraction)))
            body.append([corpus_label(spec), *cells])
        return markdown_table(["calibration corpus", *tasks], body) if body else ""

    return _per_model(rows, build)


def sizes_label(entry: dict) -> str:
    """The (training / evaluation) example counts of a summary entry's rows ("mixed" when its rows differ)."""
    sizes = entry.get("sizes") or []
    text = ", ".join(f"{a if a is not None else '?'} / {b if b is not None else '?'}" for a, b in sizes)
    return text + (" (mixed)" if len(sizes) > 1 else "")


def one_class_mark(entry: dict) -> str:
    """`` (one class)`` when a seed's model predicted a single class for every example, else ``""``."""
    seeds = entry.get("one_class_seeds") or []
    if not seeds:
        return ""
    return " (one class" + ("" if len(seeds) == entry["n"] else f": seed {', '.join(map(str, seeds))}") + ")"


def table_all(rows) -> str:
    """Every group: model, task, corpus, kind, method, kept fraction, mean ± CI, seeds, training/eval sizes."""
    body = [
        [e["model"], e["task"], e["metric"] or "", corpus_label(e["corpus"]), e["kind"], e["method"]]
        + [fraction_label(e["kept_fraction"]), cell(e, 4) + one_class_mark(e), str(e["n"]), sizes_label(e)]
        for e in summarize(rows)
    ]
    header = ["model", "task", "metric", "corpus", "kind", "method", "kept input-dependent", "score", "seeds"]
    return markdown_table([*header, "train / eval examples"], body, text_columns=6)
