"""The model card (README.md) of a PAPA checkpoint, rendered from ``cards/papa_model_card.md``.

``render_card`` builds a ``huggingface_hub.ModelCard`` from the folder's ``config.json`` and
``papa_recipe.json`` (the same facts as ``inspect_checkpoint.describe``), optional probe results
(JSONL rows: model, task, fraction, kind, method, seed, metric, score) and the command that made it.
``write_card`` writes ``README.md`` and a heat map of a few constant matrices (``papa_constants.png``).
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from pathlib import Path

from .inspect_checkpoint import CONSTANTS_SUFFIX, describe, format_coverage

TEMPLATE = Path(__file__).resolve().parents[1] / "cards" / "papa_model_card.md"
IMAGE_NAME = "papa_constants.png"
REPO_PLACEHOLDER = "<namespace>/<model-name>"  # hub.push fills it with the repo id in what it uploads
REVISION_PLACEHOLDER = "<commit>"

BIBTEX = """@inproceedings{hassid-etal-2022-much,
    title = "How Much Does Attention Actually Attend? Questioning the Importance of Attention in Pretrained Transformers",
    author = "Hassid, Michael and Peng, Hao and Rotem, Daniel and Kasai, Jungo and Montero, Ivan and Smith, Noah A. and Schwartz, Roy",
    booktitle = "Findings of the Association for Computational Linguistics: EMNLP 2022",
    year = "2022",
    publisher = "Association for Computational Linguistics",
    url = "https://aclanthology.org/2022.findings-emnlp.101",
    pages = "1403--1416",
}"""  # noqa: E501


def _template_path() -> Path:
    if TEMPLATE.is_file():
        return TEMPLATE
    packaged = Path(__file__).resolve().parent / "cards" / TEMPLATE.name  # an installed wheel may ship it here
    if packaged.is_file():
        return packaged
    raise FileNotFoundError(f"model card template not found at {TEMPLATE}")


def load_results(results) -> list[dict]:
    """Rows of a results JSONL file (or an iterable of dicts)."""
    if results is None:
        return []
    if isinstance(results, (str, Path)):
        lines = Path(results).read_text(encoding="utf-8").splitlines()
        return [json.loads(line) for line in lines if line.strip()]
    return [dict(row) for row in results]


def results_table(rows: list[dict]) -> str:
    """Markdown table: one row per (model, task, kind, method, fraction), score mean ± std over seeds."""
    groups: dict[tuple, list[float]] = defaultdict(list)
    for row in rows:
        if row.get("score") is None:
            continue
        key = (
            str(row.get("model", "")),
            str(row.get("task", "")),
            str(row.get("metric", "")),
            str(row.get("kind", "")),
            str(row.get("method", "")),
            float(row.get("fraction") or 0.0),
        )
        groups[key].append(float(row["score"]))
    if not groups:
        return ""
    lines = [
        "| model | task | metric | kind | method | fraction constant | score | seeds |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for (model, task, metric, kind, method, fraction), scores in sorted(groups.items()):
        mean = statistics.fmean(scores)
        spread = f" ± {statistics.stdev(scores):.4f}" if len(scores) > 1 else ""
        lines.append(
            f"| {model} | {task} | {metric} | {kind} | {method} | {fraction:g} | {mean:.4f}{spread} | {len(scores)} |"
        )
    return "\n".join(lines)


def grid_table(d: dict) -> str:
    """Markdown layer x head grid (``C`` constant, ``·`` attention)."""
    heads = range(d["num_heads"])
    lines = ["| layer | " + " | ".join(str(h) for h in heads) + " |", "|---:|" + "---|" * d["num_heads"]]
    for layer, row in enumerate(d["grid"]):
        lines.append(f"| {layer} | " + " | ".join("**C**" if c else "·" for c in row) + " |")
    return "\n".join(lines)


def write_heatmap(checkpoint_dir, max_heads: int = 4, out_name: str = IMAGE_NAME) -> Path | None:
    """Heat maps of up to ``max_heads`` constant matrices, saved next to the weights; None when there are none."""
    folder = Path(checkpoint_dir)
    d = describe(folder)
    if not d["constants"]:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from safetensors import safe_open

    by_layer = defaultdict(list)
    for layer, head in d["constant_heads"]:
        by_layer[layer].append(head)
    picked = []  # (title, (L, L) array)
    with safe_open(str(folder / "model.safetensors"), framework="pt") as f:
        for key in sorted(d["constants"], key=_layer_of):
            layer = _layer_of(key)
            heads = sorted(by_layer.get(layer, []))
            values = f.get_tensor(key).float().numpy()  # (Hc, L, L), heads in sorted order
            for i, head in enumerate(heads[: values.shape[0]]):
                picked.append((f"layer {layer}, head {head}", values[i]))
    picked = _spread(picked, max_heads)
    if not picked:
        return None
    fig, axes = plt.subplots(1, len(picked), figsize=(3.2 * len(picked), 3.2), squeeze=False)
    for ax, (title, matrix) in zip(axes[0], picked, strict=True):
        image = ax.imshow(matrix, cmap="viridis", interpolation="nearest")
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("key slot", fontsize=8)
        ax.set_ylabel("query slot", fontsize=8)
        fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    fig.suptitle(f"PAPA constant matrices ({d['kind']}, L = {d['max_length']})", fontsize=10)
    fig.tight_layout()
    out = folder / out_name
    fig.savefig(out, dpi=80)
    plt.close(fig)
    return out


def _layer_of(key: str) -> int:
    """Layer index in a state-dict key such as ``encoder.layer.3.attention.self.papa_constants``."""
    parts = key[: -len(CONSTANTS_SUFFIX)].strip(".").split(".")
    numbers = [int(p) for p in parts if p.isdigit()]
    return numbers[-1] if numbers else 0


def _spread(items: list, k: int) -> list:
    """Up to ``k`` items spread evenly over the list (first and last kept)."""
    if len(items) <= k:
        return items
    step = (len(items) - 1) / (k - 1) if k > 1 else 0
    return [items[round(i * step)] for i in range(k)]


def render_card(
    checkpoint_dir,
    results=None,
    command: str | None = None,
    *,
    repo_id: str | None = None,
    revision: str | None = None,
    image: str | None = None,
):
    """Render the model card of a PAPA checkpoint folder.

    Args:
        checkpoint_dir: the checkpoint folder (config.json with papa_* fields, papa_recipe.json).
        results: a results JSONL path or rows (model, task, fraction, kind, method, seed, metric, score).
        command: the command that made the checkpoint; defaults to the recipe's ``command``.
        repo_id: the Hub repo id for the usage snippet (default: a placeholder ``push`` fills in).
        revision: the commit to pin in the usage snippet (default: the ``<commit>`` placeholder).
        image: file name of a heat-map image next to the card (``write_card`` passes ``papa_constants.png``).

    Returns:
        a ``huggingface_hub.ModelCard``.
    """
    from huggingface_hub import ModelCard, ModelCardData

    d = describe(checkpoint_dir)
    source = d["source_model"]
    tags = ["papa", "attention-free", "constant-attention", d["family"], "model-surgery"]
    card_data = ModelCardData(
        base_model=d["base_model"],
        library_name="transformers",
        license=d["license"],
        datasets=d["datasets"] or None,
        pipeline_tag=d["pipeline_tag"],
        tags=tags,
    )
    fraction = d["fraction"]
    corpus = d["corpus"] or {}
    corpus_text = str(corpus.get("description") or "not recorded")
    if corpus.get("examples") is not None:
        corpus_text += f", {corpus['examples']} examples"
    if corpus.get("pairs"):
        corpus_text += " (sentence pairs)"
    name = source.rstrip("/").split("/")[-1] if source else d["family"]
    command = command or d["command"] or "(not recorded)"
    return ModelCard.from_template(
        card_data,
        template_path=str(_template_path()),
        title=f"{name} with PAPA constant attention ({_percent(fraction)} of heads constant)",
        source_model=source,
        source_link=f"[{source}](https://huggingface.co/{d['base_model']})" if d["base_model"] else f"`{source}`",
        family=d["family"],
        architectures=", ".join(d["architectures"]) or "-",
        num_constant_heads=d["num_constant_heads"],
        num_heads_total=d["num_heads_total"],
        fraction_percent=_percent(fraction),
        fraction_text="?" if fraction is None else f"{fraction:.4g}",
        kind=d["kind"],
        method=d["method"],
        max_length=int(d["max_length"]),
        calibrated_on=d["calibrated_on"] or "not recorded",
        corpus_text=corpus_text.replace("|", "\\|"),
        coverage_text=format_coverage(d["coverage"]).replace("|", "\\|") if d["coverage"] else "not recorded",
        constants_dtype=d["constants_dtype"],
        trainable_constants=d["trainable_constants"],
        format_version=d["format_version"],
        papa_surgery_version=d["papa_surgery_version"] or "",
        grid_table=grid_table(d),
        image=image,
        results_table=results_table(load_results(results)),
        auto_class=d["auto_class"],
        repo_id=repo_id or REPO_PLACEHOLDER,
        revision=revision or REVISION_PLACEHOLDER,
        command=command,
        bibtex=BIBTEX,
    )


def write_card(checkpoint_dir, results=None, command: str | None = None, **kwargs) -> Path:
    """Write ``README.md`` (and the ``papa_constants.png`` heat map) into the checkpoint folder."""
    folder = Path(checkpoint_dir)
    describe(folder)  # fail before writing anything if this is not a PAPA checkpoint
    image = write_heatmap(folder)
    card = render_card(folder, results, command, image=image.name if image else None, **kwargs)
    out = folder / "README.md"
    card.save(out)
    return out


def _percent(fraction) -> str:
    return "?" if fraction is None else f"{100 * fraction:.4g}%"
