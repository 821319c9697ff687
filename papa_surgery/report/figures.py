"""Figures from a sweep's results (paper Figs. 2, 3 and 5; fine-tuned vs probed) and heat maps of constants (Fig. 4).

Figures use the paper's axis: the share of heads kept input-dependent, ``1 - fraction``. matplotlib runs with
the Agg backend.
"""

from __future__ import annotations

from pathlib import Path

from .finetuned import split_protocols
from .stats import METHOD_PREFERENCE, main_curves, ordered, prefer, relative_drops, summarize
from .tables import fraction_label, short_model
from .tensors import constant_matrices


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


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
    ax.set_xticks(range(len(kept)), [fraction_label(k) for k in kept])
    ax.set_xlabel("share of heads kept input-dependent")
    return positions


def _grid(n: int, plt, width: float = 4.0):
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, 3.2 * rows), squeeze=False)
    for ax in axes.flat[n:]:
        ax.set_visible(False)
    return fig, list(axes.flat)


def plot_fractions(rows, out_path) -> Path:
    """Fig. 2: score vs share of heads kept input-dependent, one panel per task, one line per model."""
    plt = _plt()
    summary = main_curves(summarize(rows))
    tasks = ordered(e["task"] for e in summary)
    if not tasks:
        raise ValueError("no results to plot")
    fig, axes = _grid(len(tasks), plt)
    for ax, task in zip(axes, tasks, strict=False):
        sub = [e for e in summary if e["task"] == task]
        positions = _fraction_axis(ax, [e["kept_fraction"] for e in sub])
        for model in ordered(e["model"] for e in sub):
            mine = [e for e in sub if e["model"] == model]
            _curve(ax, mine, positions, f"{short_model(model)} ({mine[0]['kind']}, {mine[0]['method']})")
        ax.set_title(task)
        ax.set_ylabel(sub[0]["metric"] or "score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def plot_drop(rows, out_path) -> Path | None:
    """Fig. 3: original average score (y) vs relative drop when every head is constant (x), one point per model."""
    points = relative_drops(rows)
    if not points:
        return None
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5, 4))
    for p in points:
        ax.scatter([100 * p["relative_drop"]], [p["original"]])
        ax.annotate(short_model(p["model"]), (100 * p["relative_drop"], p["original"]), fontsize=8)
    ax.set_xlabel("relative drop with all heads constant (%)")
    ax.set_ylabel("original score (mean over tasks)")
    fig.tight_layout()
    return _save(fig, out_path, plt)


def plot_methods(rows, out_path) -> Path | None:
    """Fig. 5: ranking methods vs share of heads kept input-dependent, one panel per (model, task)."""
    summary = summarize(rows)
    panels = []
    for model in ordered(e["model"] for e in summary):
        for task in ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            kind = prefer((e["kind"] for e in sub), ("average",))
            corpus = prefer((e["corpus"] for e in sub), ("task",))
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
        ax.set_title(f"{short_model(model)} · {task}")
        ax.set_ylabel(sub[0]["metric"] or "score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def plot_finetuned(rows, out_path) -> Path | None:
    """Fig.-2-style panels, one per task: score vs share of heads kept input-dependent, probed and fine-tuned."""
    probed, tuned = split_protocols(rows)
    if not tuned:
        return None
    curves = {"fine-tuned": main_curves(summarize(tuned)), "probe": main_curves(summarize(probed))}
    tasks = ordered(e["task"] for e in curves["fine-tuned"])
    plt = _plt()
    fig, axes = _grid(len(tasks), plt)
    for ax, task in zip(axes, tasks, strict=False):
        subs = {name: [e for e in entries if e["task"] == task] for name, entries in curves.items()}
        positions = _fraction_axis(ax, [e["kept_fraction"] for sub in subs.values() for e in sub])
        for name, sub in subs.items():
            for model in ordered(e["model"] for e in sub):
                _curve(ax, [e for e in sub if e["model"] == model], positions, f"{short_model(model)} ({name})")
        ax.set_title(task)
        ax.set_ylabel(subs["fine-tuned"][0]["metric"] or "score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    return _save(fig, out_path, plt)


def plot_constants(source, out_path, heads=None, max_heads: int = 3) -> Path:
    """Fig. 4: heat maps of chosen constant matrices (rows: query slot, columns: key slot), on a log scale."""
    plt = _plt()
    return _save(draw_constants(constant_matrices(source, heads, max_heads), plt), out_path, plt)


def draw_constants(picked: list[tuple[str, object]], plt=None):
    """The Fig. 4 figure of ``[(title, (L, L) array), ...]``: each matrix row-normalised (the weights a full-length
    input uses) on a log colour scale (``constants_norm``), so the diagonal bands show next to the [CLS] column."""
    import numpy as np

    plt = plt or _plt()
    fig, axes = plt.subplots(1, len(picked), figsize=(3.4 * len(picked), 3.2), squeeze=False)
    for ax, (title, matrix) in zip(axes[0], picked, strict=True):
        matrix = np.asarray(matrix, dtype=np.float64)
        rows = matrix.sum(-1, keepdims=True)
        weights = np.divide(matrix, rows, out=np.zeros_like(matrix), where=rows > 0)
        image = ax.imshow(
            np.ma.masked_less_equal(weights, 0), cmap="viridis", norm=constants_norm(weights), interpolation="nearest"
        )
        ax.set_title(f"(layer, head) = {title}", fontsize=9)
        ax.set_xlabel("key slot", fontsize=8)
        ax.set_ylabel("query slot", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="weight (log scale)")
    fig.tight_layout()
    return fig


def constants_norm(weights, decades: float = 3.0):
    """A log colour scale over the top ``decades`` orders of magnitude of ``weights``' positive values.

    Averaged attention spans several orders of magnitude: on a linear scale only the [CLS] column shows, and
    the diagonal bands (paper Fig. 4) sit in the dark end. Zeros (masked) and values below the range clip to it.
    """
    import numpy as np
    from matplotlib.colors import LogNorm, Normalize

    positive = np.asarray(weights)[np.asarray(weights) > 0]
    if positive.size == 0:
        return Normalize(vmin=0.0, vmax=1.0)
    top = float(positive.max())
    bottom = max(float(positive.min()), top * 10.0**-decades)
    return LogNorm(vmin=bottom if bottom < top else top / 10.0, vmax=top, clip=True)


def _save(fig, out_path, plt) -> Path:
    out_path = Path(out_path)
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=100)
    plt.close(fig)
    return out_path
