"""Matplotlib figures of :func:`papa_surgery.analysis.analyze` (matplotlib is the ``plots`` extra)."""

from __future__ import annotations

from pathlib import Path

import torch

from .streaming import CATEGORIES

COLORS = {"cls": "#4c72b0", "sep": "#dd8452", "punct": "#55a868", "other": "#bbbbbb"}
LABELS = {"cls": "[CLS]", "sep": "[SEP]", "punct": "punctuation", "other": "other"}


def _plt():
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise ImportError("figures need matplotlib: pip install 'papa-surgery[plots]'") from err
    return plt


def plot_token_shares(summary: dict, path: Path) -> Path:
    """Per layer, stacked shares by category of the attended token: attention weight vs the other lens."""
    plt = _plt()
    layers = summary["layers"]
    if summary["analysis"] == "norms":
        bars = [("attention_share", "α"), ("norm_share", "‖αf‖"), ("summed_norm_share", "‖Σαf‖")]
        fig, ax = plt.subplots(figsize=(1.2 + 1.1 * len(layers), 4))
        width = 0.8 / len(bars)
        for k, (key, label) in enumerate(bars):
            bottom = [0.0] * len(layers)
            xs = [i + (k - (len(bars) - 1) / 2) * width for i in range(len(layers))]
            for c in CATEGORIES:
                vals = [item[key][c] for item in layers]
                ax.bar(xs, vals, width * 0.95, bottom=bottom, color=COLORS[c], label=LABELS[c] if k == 0 else None)
                bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
            for x in xs:
                ax.text(x, 1.01, label, ha="center", va="bottom", fontsize=7)
        ax.set_ylim(0, 1.1)
        ax.set_ylabel("share")
        ax.set_title("Share of attention weight vs norm contribution, by attended token")
    else:
        fig, axes = plt.subplots(1, len(CATEGORIES), figsize=(3.2 * len(CATEGORIES), 3.4), sharey=False)
        xs = [item["layer"] for item in layers]
        for ax, c in zip(axes, CATEGORIES, strict=True):
            ax.plot(xs, [item["attention_share"][c] for item in layers], "o-", label="attention A")
            ax.plot(xs, [item["effective_mass"][c] for item in layers], "s--", label="effective A·UUᵀ")
            ax.axhline(0, color="black", lw=0.5)
            ax.set_title(LABELS[c])
            ax.set_xlabel("layer")
        axes[0].set_ylabel("mass per query token")
        axes[0].legend(fontsize=7)
        fig.suptitle("Attention vs effective attention mass, by attended token")
    ax = fig.axes[0]
    ax.set_xticks(range(len(layers)))
    ax.set_xticklabels([str(item["layer"]) for item in layers])
    if summary["analysis"] == "norms":
        ax.set_xlabel("layer")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_sep_mass(summary: dict, path: Path) -> Path:
    """Attention vs effective attention mass on [SEP], per head (dots) and layer mean (line)."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(6, 3.6))
    for key, label, marker, color in (
        ("attention_share", "attention A", "o", "#4c72b0"),
        ("effective_mass", "effective A·UUᵀ", "s", "#dd8452"),
    ):
        xs = [item["layer"] for item in summary["heads"]]
        ys = [item[key]["sep"] for item in summary["heads"]]
        ax.scatter(xs, ys, s=10, alpha=0.5, marker=marker, color=color)
        ax.plot(
            [i["layer"] for i in summary["layers"]],
            [i[key]["sep"] for i in summary["layers"]],
            color=color,
            label=label,
        )
    ax.axhline(0, color="black", lw=0.5)
    ax.set_xlabel("layer")
    ax.set_ylabel("mass on [SEP] per query token")
    ax.set_title("[SEP]: attention vs effective attention (dots: heads)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def _shown_slots(counts: torch.Tensor, max_slots: int = 24) -> list[int]:
    """Slots worth showing: the first ones reached by at least half the examples, plus the final slot."""
    cov = counts.diagonal()
    last = cov.shape[0] - 1
    common = [s for s in range(last) if cov[s] >= 0.5 * cov[last]]
    return sorted({*common[:max_slots], last})


def plot_heatmaps(attention: torch.Tensor, constants, heads, which: str, path: Path) -> Path:
    """Averaged A next to the averaged norm-weighted (row-normalised) or effective attention of a few heads."""
    plt = _plt()
    slots = _shown_slots(constants.counts)
    idx = torch.tensor(slots)
    labels = [str(s) if s != constants.max_length - 1 else "L-1" for s in slots]
    other = "norm-weighted (rows renormalised)" if which == "norms" else "effective (clamped at 0)"
    fig, axes = plt.subplots(len(heads), 2, figsize=(8, 3.6 * len(heads)), squeeze=False)
    for row, (layer, head) in enumerate(heads):
        a = attention[layer, head][idx][:, idx]
        b = constants.values[layer, head][idx][:, idx]
        if which == "norms":
            b = b / b.sum(-1, keepdim=True).clamp_min(1e-30)
        vmax = float(max(a.max(), b.max()))
        for col, (mat, title) in enumerate(((a, "averaged attention A"), (b, f"averaged {other}"))):
            ax = axes[row, col]
            im = ax.imshow(mat.numpy(), cmap="viridis", vmin=0, vmax=vmax)
            ax.set_title(f"layer {layer} head {head}: {title}", fontsize=8)
            ax.set_xticks(range(len(slots)))
            ax.set_xticklabels(labels, fontsize=5, rotation=90)
            ax.set_yticks(range(len(slots)))
            ax.set_yticklabels(labels, fontsize=5)
            ax.set_xlabel("attended slot j", fontsize=7)
            ax.set_ylabel("query slot i", fontsize=7)
            fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)
