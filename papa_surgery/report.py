"""Tables and figures from a sweep's results (paper Tables 1-2, Figs. 2-5).

Scores are averaged over seeds with a 95% confidence interval from the t-distribution (mean ± t * s / sqrt(n),
as the paper's figures show). Figures use the paper's axis: the share of heads kept input-dependent,
``1 - fraction``. Only the standard library, numpy-free math and (for figures) matplotlib with the Agg backend.
"""

from __future__ import annotations

import math
import statistics
from collections import defaultdict
from fractions import Fraction
from pathlib import Path

from .results import read_rows

GROUP_FIELDS = ("model", "task", "corpus", "kind", "method", "fraction")
METHOD_PREFERENCE = ("lambda", "variance", "first-to-last", "last-to-first", "random", "reversed-lambda")

# Two-sided 95% critical values of Student's t for 1..30 degrees of freedom.
_T95 = (
    12.7062, 4.3027, 3.1824, 2.7764, 2.5706, 2.4469, 2.3646, 2.3060, 2.2622, 2.2281,
    2.2010, 2.1788, 2.1604, 2.1448, 2.1314, 2.1199, 2.1098, 2.1009, 2.0930, 2.0860,
    2.0796, 2.0739, 2.0687, 2.0639, 2.0595, 2.0555, 2.0518, 2.0484, 2.0452, 2.0423,
)  # fmt: skip


def t_critical(df: int) -> float:
    """Two-sided 95% critical value of Student's t with ``df`` degrees of freedom (table, then a series)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two seeds (one degree of freedom)")
    if df <= len(_T95):
        return _T95[df - 1]
    z = 1.959964  # Cornish-Fisher expansion of t around the normal quantile; error < 1e-4 for df > 30
    return z + (z**3 + z) / (4 * df) + (5 * z**5 + 16 * z**3 + 3 * z) / (96 * df**2)


def load_results(path) -> list[dict]:
    """Rows of a results JSONL file (a torn last line of an interrupted sweep is skipped).

    Raises:
        ValueError: the file does not exist or a line other than the last is not JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"results file {str(path)!r} does not exist (write one with papa-surgery probe)")
    return read_rows(path)


def _corpus(row: dict) -> str:
    return str(row.get("corpus") or "task")


def summarize(rows) -> list[dict]:
    """Mean and 95% t-interval over seeds per (model, task, corpus, kind, method, fraction).

    A seed that appears twice in a group counts once (the last row wins). Returns one dict per group, in
    the order groups first appear: the group fields, ``kept_fraction``, ``metric``, ``n``, ``seeds``,
    ``scores``, ``mean``, ``std`` (sample), ``ci95`` (half-width; ``None`` for a single seed), ``low``, ``high``.
    """
    groups: dict[tuple, dict] = {}
    metric: dict[tuple, str] = {}
    for row in rows:
        if row.get("score") is None:
            continue
        key = tuple(_corpus(row) if f == "corpus" else row.get(f) for f in GROUP_FIELDS)
        key = (*key[:-1], round(float(key[-1]), 6))
        groups.setdefault(key, {})[int(row.get("seed", 0))] = float(row["score"])
        metric[key] = row.get("metric")
    out = []
    for key, by_seed in groups.items():
        seeds = sorted(by_seed)
        scores = [by_seed[s] for s in seeds]
        n = len(scores)
        mean = statistics.fmean(scores)
        std = statistics.stdev(scores) if n > 1 else None
        ci = t_critical(n - 1) * std / math.sqrt(n) if n > 1 else None
        entry = dict(zip(GROUP_FIELDS, key, strict=True))
        entry.update(
            kept_fraction=round(1.0 - entry["fraction"], 6),
            metric=metric[key],
            n=n,
            seeds=seeds,
            scores=scores,
            mean=mean,
            std=std,
            ci95=ci,
            low=None if ci is None else mean - ci,
            high=None if ci is None else mean + ci,
        )
        out.append(entry)
    return out


# ------------------------------------------------------------------------------------------------ tables
def _cell(entry: dict | None, digits: int = 3) -> str:
    if entry is None:
        return "–"
    text = f"{entry['mean']:.{digits}f}"
    return text + (f" ± {entry['ci95']:.{digits}f}" if entry["ci95"] is not None else "")


def _ordered(values) -> list:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def _prefer(values, order) -> str | None:
    values = list(values)
    for v in order:
        if v in values:
            return v
    return values[0] if values else None


def _pick(summary: list[dict], **match) -> dict | None:
    """The first summary entry matching every given field (``None`` values are wildcards)."""
    for e in summary:
        if all(
            v is None or (round(e[k], 6) == round(v, 6) if k == "fraction" else e[k] == v) for k, v in match.items()
        ):
            return e
    return None


def _markdown(header: list[str], body: list[list[str]], text_columns: int = 1) -> str:
    align = ["---"] * text_columns + ["---:"] * (len(header) - text_columns)
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(align) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in body]
    return "\n".join(lines)


def _per_model(rows, build) -> str:
    summary = summarize(rows)
    models = _ordered(e["model"] for e in summary)
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


def table_kinds(rows, fraction: float = 1.0, corpus: str | None = None) -> str:
    """Table-1-style markdown: constant kinds (rows) x tasks (columns) at ``fraction``, plus the original model.

    Each cell is the mean ± 95% CI over seeds. At fraction 1 every ranking method gives the same model, so
    the preferred method (lambda, then variance, ...) is shown. ``corpus``: which calibration corpus
    (default: the first in the results). One table per model.
    """

    def build(summary):
        tasks = _ordered(e["task"] for e in summary)
        spec = corpus or _prefer((e["corpus"] for e in summary), ("task",))
        kinds = _ordered(e["kind"] for e in summary)
        body = [["original (fraction 0)", *[_cell(_pick(summary, task=t, fraction=0.0)) for t in tasks]]]
        for kind in kinds:
            cells = []
            for t in tasks:
                methods = [e["method"] for e in summary if e["task"] == t and e["kind"] == kind]
                method = _prefer(methods, METHOD_PREFERENCE)
                cells.append(_cell(_pick(summary, task=t, kind=kind, method=method, corpus=spec, fraction=fraction)))
            body.append([kind, *cells])
        metrics = {t: _pick(summary, task=t)["metric"] for t in tasks}
        return _markdown(["kind", *[f"{t} ({metrics[t]})" for t in tasks]], body)

    return _per_model(rows, build)


def table_corpora(rows, fraction: float = 1.0, kind: str = "average") -> str:
    """Table-2-style markdown: calibration corpora (rows) x tasks (columns), ``kind`` constants at ``fraction``."""

    def build(summary):
        summary = [e for e in summary if e["kind"] == kind]
        tasks = _ordered(e["task"] for e in summary)
        body = []
        for spec in _ordered(e["corpus"] for e in summary):
            cells = []
            for t in tasks:
                method = _prefer((e["method"] for e in summary if e["task"] == t), METHOD_PREFERENCE)
                cells.append(_cell(_pick(summary, task=t, method=method, corpus=spec, fraction=fraction)))
            body.append([corpus_label(spec), *cells])
        return _markdown(["calibration corpus", *tasks], body) if body else ""

    return _per_model(rows, build)


def table_all(rows) -> str:
    """Every group: model, task, corpus, kind, method, kept fraction, mean ± CI, seeds."""
    body = [
        [e["model"], e["task"], e["metric"] or "", corpus_label(e["corpus"]), e["kind"], e["method"]]
        + [_frac_label(e["kept_fraction"]), _cell(e, 4), str(e["n"])]
        for e in summarize(rows)
    ]
    header = ["model", "task", "metric", "corpus", "kind", "method", "kept input-dependent", "score", "seeds"]
    return _markdown(header, body, text_columns=6)


# ------------------------------------------------------------------------------------------------ figures
def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _frac_label(x: float) -> str:
    f = Fraction(x).limit_denominator(64)
    return str(f.numerator) if f.denominator == 1 else f"{f.numerator}/{f.denominator}"


def _curve(ax, entries: list[dict], positions: dict, label: str) -> None:
    entries = sorted(entries, key=lambda e: -e["kept_fraction"])
    xs = [positions[e["kept_fraction"]] for e in entries]
    ys = [e["mean"] for e in entries]
    errs = [e["ci95"] or 0.0 for e in entries]
    ax.errorbar(xs, ys, yerr=errs, marker="o", capsize=3, label=label)


def _fraction_axis(ax, kept: list[float]) -> dict:
    """Evenly spaced kept fractions, largest first (the paper's 1, 1/2, 1/8, 1/16, 0)."""
    kept = sorted(set(kept), reverse=True)
    positions = {k: i for i, k in enumerate(kept)}
    ax.set_xticks(range(len(kept)), [_frac_label(k) for k in kept])
    ax.set_xlabel("share of heads kept input-dependent")
    return positions


def _grid(n: int, plt, width: float = 4.0):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def _main_curves(summary: list[dict]) -> list[dict]:
    """Entries of the headline curve per (model, task): average constants (else the first kind), the preferred
    method, the first corpus."""
    out = []
    for model in _ordered(e["model"] for e in summary):
        for task in _ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            kind = _prefer((e["kind"] for e in sub), ("average",))
            method = _prefer((e["method"] for e in sub if e["kind"] == kind), METHOD_PREFERENCE)
            corpus = _prefer((e["corpus"] for e in sub), ("task",))
            out += [e for e in sub if e["kind"] == kind and e["method"] == method and e["corpus"] == corpus]
    return out


def plot_fractions(rows, out_path) -> Path:
    """Fig. 2: score vs share of heads kept input-dependent, one panel per task, one line per model."""
    plt = _plt()
    summary = _main_curves(summarize(rows))
    tasks = _ordered(e["task"] for e in summary)
    if not tasks:
        raise ValueError("no results to plot")
    fig, axes = _grid(len(tasks), plt)
    for ax, task in zip(axes, tasks, strict=False):
        sub = [e for e in summary if e["task"] == task]
        positions = _fraction_axis(ax, [e["kept_fraction"] for e in sub])
        for model in _ordered(e["model"] for e in sub):
            mine = [e for e in sub if e["model"] == model]
            _curve(ax, mine, positions, f"{_short(model)} ({mine[0]['kind']}, {mine[0]['method']})")
        ax.set_title(task)
        ax.set_ylabel(sub[0]["metric"] or "score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def relative_drops(rows) -> list[dict]:
    """Per model: mean original score over tasks and mean relative drop (orig - attention-free) / |orig| (Fig. 3).

    Uses the tasks that have both fraction 0 and fraction 1 (headline kind/method/corpus).
    """
    summary = _main_curves(summarize(rows))
    out = []
    for model in _ordered(e["model"] for e in summary):
        origs, drops, tasks = [], [], []
        for task in _ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            orig, free = _pick(sub, fraction=0.0), _pick(sub, fraction=1.0)
            if orig is None or free is None or orig["mean"] == 0:
                continue
            origs.append(orig["mean"])
            drops.append((orig["mean"] - free["mean"]) / abs(orig["mean"]))
            tasks.append(task)
        if tasks:
            out.append(
                dict(model=model, tasks=tasks, original=statistics.fmean(origs), relative_drop=statistics.fmean(drops))
            )
    return out


def plot_drop(rows, out_path) -> Path | None:
    """Fig. 3: original average score (y) vs relative drop when every head is constant (x), one point per model."""
    points = relative_drops(rows)
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for p in points:
        ax.scatter([100 * p["relative_drop"]], [p["original"]])
        ax.annotate(_short(p["model"]), (100 * p["relative_drop"], p["original"]), fontsize=8)
    ax.set_xlabel("relative drop with all heads constant (%)")
    ax.set_ylabel("original score (mean over tasks)")
    fig.tight_layout()
    return _save(fig, out_path, plt)


def plot_methods(rows, out_path) -> Path | None:
    """Fig. 5: ranking methods vs share of heads kept input-dependent, one panel per (model, task)."""
    summary = summarize(rows)
    panels = []
    for model in _ordered(e["model"] for e in summary):
        for task in _ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            kind = _prefer((e["kind"] for e in sub), ("average",))
            corpus = _prefer((e["corpus"] for e in sub), ("task",))
            sub = [e for e in sub if e["kind"] == kind and e["corpus"] == corpus]
            if len({e["method"] for e in sub}) > 1:
                panels.append((model, task, sub))
    if not panels:
        return None
    plt = _plt()
    fig, axes = _grid(len(panels), plt)
    for ax, (model, task, sub) in zip(axes, panels, strict=False):
        positions = _fraction_axis(ax, [e["kept_fraction"] for e in sub])
        methods = sorted({e["method"] for e in sub}, key=lambda m: (METHOD_PREFERENCE + (m,)).index(m))
        for method in methods:
            _curve(ax, [e for e in sub if e["method"] == method], positions, method)
        ax.set_title(f"{_short(model)} · {task}")
        ax.set_ylabel(sub[0]["metric"] or "score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def constant_matrices(source, heads=None, max_heads: int = 3) -> list[tuple[str, object]]:
    """``[(title, (L, L) array), ...]`` of chosen constant matrices.

    Args:
        source: a ``Constants`` object, a constants ``.safetensors`` file, or a PAPA checkpoint folder.
        heads: ``[[layer, head], ...]`` to show; default up to ``max_heads`` spread over the model (a
            checkpoint: over its constant heads).
    """
    from safetensors import safe_open

    if hasattr(source, "values") and hasattr(source, "max_length"):
        values = source.values.float().numpy()  # (layers, heads, L, L)
        available = {(lay, h): values[lay, h] for lay in range(values.shape[0]) for h in range(values.shape[1])}
    else:
        path = Path(source)
        available = {}
        if path.is_dir():
            from .inspect_checkpoint import constants_header, read_config

            config = read_config(path)
            by_layer = defaultdict(list)
            for layer, head in config["papa_constant_heads"]:
                by_layer[int(layer)].append(int(head))
            with safe_open(str(path / "model.safetensors"), framework="pt") as f:
                for key in constants_header(path):
                    numbers = [int(p) for p in key.split(".") if p.isdigit()]
                    layer = numbers[-1] if numbers else 0
                    tensor = f.get_tensor(key).float().numpy()  # (Hc, L, L), heads sorted
                    for i, head in enumerate(sorted(by_layer.get(layer, []))[: tensor.shape[0]]):
                        available[(layer, head)] = tensor[i]
        elif path.is_file():
            with safe_open(str(path), framework="pt") as f:
                meta = f.metadata() or {}
                if meta.get("format") != "papa-constants":
                    raise ValueError(f"{path} is not a PAPA constants file (write one with papa-surgery calibrate)")
                values = f.get_tensor("values").float().numpy()
            available = {(lay, h): values[lay, h] for lay in range(values.shape[0]) for h in range(values.shape[1])}
        else:
            raise ValueError(f"{path} is neither a constants file nor a PAPA checkpoint folder")
    if not available:
        raise ValueError(f"{source} holds no constant matrices")
    if heads is None:
        keys = sorted(available)
        step = (len(keys) - 1) / (max_heads - 1) if max_heads > 1 and len(keys) > max_heads else 1
        heads = [keys[round(i * step)] for i in range(min(max_heads, len(keys)))]
    picked = []
    for layer, head in heads:
        if (int(layer), int(head)) not in available:
            raise ValueError(f"head ({layer}, {head}) has no constant matrix in {source}")
        picked.append((f"({layer}, {head})", available[(int(layer), int(head))]))
    return picked


def plot_constants(source, out_path, heads=None, max_heads: int = 3) -> Path:
    """Fig. 4: heat maps of chosen constant matrices (rows: query slot, columns: key slot)."""
    picked = constant_matrices(source, heads, max_heads)
    plt = _plt()
    fig, axes = plt.subplots(1, len(picked), figsize=(3.4 * len(picked), 3.2), squeeze=False)
    for ax, (title, matrix) in zip(axes[0], picked, strict=True):
        image = ax.imshow(matrix, cmap="viridis", interpolation="nearest")
        ax.set_title(f"(layer, head) = {title}", fontsize=9)
        ax.set_xlabel("key slot", fontsize=8)
        ax.set_ylabel("query slot", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def _short(model: str) -> str:
    return str(model).rstrip("/").split("/")[-1]


def _save(fig, out_path, plt) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path


# ------------------------------------------------------------------------------------------------ report
def write_report(results_path, out_dir, constants=None) -> list[Path]:
    """Write ``report.md`` (all scores, Table 1, Table 2) and the figures into ``out_dir``.

    Args:
        results_path: a sweep's JSONL results.
        out_dir: output folder (created).
        constants: optional constants file, ``Constants`` or PAPA checkpoint for the Fig. 4 heat maps.

    Returns:
        The written files: ``report.md`` first, then the PNG figures.

    Raises:
        ValueError: no results file, or no result rows in it.
    """
    rows = load_results(results_path)
    if not any(r.get("score") is not None for r in rows):
        raise ValueError(f"{results_path} holds no results")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    figures: list[tuple[str, Path | None]] = [
        ("Score vs share of heads kept input-dependent (Fig. 2)", plot_fractions(rows, out_dir / "fig2_fractions.png")),
        ("Original score vs relative drop with every head constant (Fig. 3)", plot_drop(rows, out_dir / "fig3.png")),
        ("Ranking methods (Fig. 5)", plot_methods(rows, out_dir / "fig5_methods.png")),
    ]
    if constants is not None:
        figures.append(("Constant matrices (Fig. 4)", plot_constants(constants, out_dir / "fig4_constants.png")))
    figures = [(title, path) for title, path in figures if path is not None]

    summary = summarize(rows)
    fractions = {e["fraction"] for e in summary}
    end = 1.0 if 1.0 in fractions else max(fractions)
    lines = [
        "# PAPA probing report",
        "",
        f"Results: `{Path(results_path).name}` ({len(rows)} rows). Scores are means over seeds ± the 95% "
        "confidence interval (t-distribution). *fraction* is the share of heads made constant; figures show "
        "the share kept input-dependent (1 − fraction), like the paper.",
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
            _markdown(
                ["model", "tasks", "original (mean)", "relative drop"],
                [
                    [d["model"], ", ".join(d["tasks"]), f"{d['original']:.3f}", f"{100 * d['relative_drop']:.1f}%"]
                    for d in drops
                ],
                text_columns=2,
            ),
            "",
        ]
    lines += ["## Figures", ""]
    lines += [f"![{title}]({path.name})" for title, path in figures]
    lines += ["", "## All results", "", table_all(rows), ""]
    report = out_dir / "report.md"
    report.write_text("\n".join(lines), encoding="utf-8")
    return [report, *[path for _, path in figures]]
