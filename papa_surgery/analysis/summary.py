"""``analyze``: one streaming pass, then per-head summaries (JSON) and figures (PNG) in an output folder.

Shares by category of the attended token j ([CLS], [SEP], punctuation, other), summed over the corpus's
real query rows i (Kobayashi et al. 2020, Fig. 3-4; Sun & Marasovic 2021 for [SEP]):

- ``attention_share[c]``: sum of alpha_ij over j in c / number of rows (rows of A sum to 1);
- ``norm_share[c]``: the same with ||alpha_ij f_h(x_j)||, divided by its total over all j;
- ``summed_norm_share[c]`` (per layer): the same with the layer-level ||sum_h alpha_ij f_h(x_j)||;
- ``effective_mass[c]``: sum of effective attention over j in c / number of rows (rows of the
  effective attention need not sum to 1 and entries may be negative, so this is a mass, not a share).

A layer's value is the mean over its heads of the per-head values.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from ..distributed import agree, is_main_process
from .streaming import CATEGORIES, WHICH, AnalysisState, stream


def _by_cat(row) -> dict[str, float]:
    return {c: float(v) for c, v in zip(CATEGORIES, row, strict=True)}


def summarize(state: AnalysisState) -> dict:
    """JSON-ready per-layer and per-head summaries of a pass made with ``with_categories=True``."""
    if state.cat_main is None:
        raise ValueError("summaries need a pass made with with_categories=True")
    rows = max(state.rows, 1.0)
    attn = (state.cat_attention / rows).cpu()  # (layers, heads, C)
    out = {
        "analysis": state.which,
        **{k: state.metadata.get(k) for k in ("source_model", "model_type", "corpus", "examples")},
        "max_length": state.max_length,
        "pairs": state.pairs,
        "categories": list(CATEGORIES),
        "query_rows": state.rows,
        "definitions": __doc__.split("\n\n", 1)[1].strip(),
    }
    num_layers, num_heads = attn.shape[:2]
    if state.which == "norms":
        main = state.cat_main.cpu()
        main_share = main / main.sum(-1, keepdim=True).clamp_min(1e-30)
        summed = state.cat_summed.cpu()
        summed_share = summed / summed.sum(-1, keepdim=True).clamp_min(1e-30)
        contribution = state.contribution()
        per_head = {"norm_share": main_share, "contribution": contribution}
        out["layers"] = [
            {
                "layer": layer,
                "attention_share": _by_cat(attn[layer].mean(0)),
                "norm_share": _by_cat(main_share[layer].mean(0)),
                "summed_norm_share": _by_cat(summed_share[layer]),
                "mean_contribution": float(contribution[layer].mean()),
            }
            for layer in range(num_layers)
        ]
    else:
        eff = (state.cat_main / rows).cpu()
        rank = (state.rank_sum / max(state.examples, 1)).cpu()
        per_head = {"effective_mass": eff, "effective_row_sum": eff.sum(-1), "mean_rank": rank}
        out["layers"] = [
            {
                "layer": layer,
                "attention_share": _by_cat(attn[layer].mean(0)),
                "effective_mass": _by_cat(eff[layer].mean(0)),
                "effective_row_sum": float(eff[layer].sum(-1).mean()),
                "mean_rank": float(rank[layer].mean()),
            }
            for layer in range(num_layers)
        ]
    heads = []
    for layer in range(num_layers):
        for head in range(num_heads):
            item = {"layer": layer, "head": head, "attention_share": _by_cat(attn[layer, head])}
            for name, t in per_head.items():
                v = t[layer, head]
                item[name] = _by_cat(v) if v.dim() else float(v)
            heads.append(item)
    out["heads"] = heads
    return out


def pick_heads(summary: dict, count: int = 4) -> list[list[int]]:
    """Heads whose [CLS]+[SEP] weight changes most under the other lens, at most one per layer."""
    key = "norm_share" if summary["analysis"] == "norms" else "effective_mass"
    scored = []
    for item in summary["heads"]:
        gap = sum(item["attention_share"][c] - item[key][c] for c in ("cls", "sep"))
        scored.append((-abs(gap), item["layer"], item["head"]))
    picked, layers = [], set()
    for _, layer, head in sorted(scored):
        if layer not in layers:
            picked.append([layer, head])
            layers.add(layer)
        if len(picked) == count:
            break
    return sorted(picked)


def analyze(
    model,
    tokenizer,
    corpus,
    which: str,
    out_dir: str | Path,
    max_length: int = 128,
    batch_size: int = 32,
    max_examples: int | None = None,
    progress: bool = True,
    pairs: bool = False,
    device=None,
    source_name: str | None = None,
    heads: list[list[int]] | None = None,
    figures: bool = True,
) -> dict:
    """Norm-based (``which="norms"``) or effective-attention (``"effective"``) analysis of ``model``.

    Writes to ``out_dir``: ``summary.json`` (per layer and head), the corpus averages as ``Constants``
    (``norm-average.safetensors`` or ``effective-average.safetensors``, usable with ``convert``), and figures
    ``token_shares.png``, ``heatmaps.png`` and, for effective, ``sep_mass.png``. ``papa_surgery.analyze`` adds
    ``norm-ranking.json`` for norms.

    Returns:
        The summary dict, with ``"files"`` listing what was written.
    """
    if which not in WHICH:
        raise ValueError(f"unknown analysis {which!r}; choose one of {', '.join(WHICH)}")
    from .. import registry
    from ..calibration.budget import check_kind_fits
    from ..models.families import num_heads_layers

    heads_per_layer, layers = num_heads_layers(model.config)
    kind = registry.kind("norm-average" if which == "norms" else "effective-average")
    check_kind_fits(kind, (layers, heads_per_layer), max_length)  # its averages are dense (L, L) matrices
    out_dir = Path(out_dir)
    state = stream(
        model,
        tokenizer,
        corpus,
        which,
        max_length=max_length,
        pairs=pairs,
        batch_size=batch_size,
        device=device,
        progress=progress,
        max_examples=max_examples,
        source_name=source_name,
        with_attention=True,
        with_categories=True,
    )
    summary = summarize(state)
    agree()  # rank 0 writes only once every rank is done
    if not is_main_process():  # under torch.distributed rank 0 alone writes
        summary["files"] = []
        return summary
    out_dir.mkdir(parents=True, exist_ok=True)
    constants = state.constants()
    files = [constants.save(out_dir / f"{constants.kind}.safetensors").name]
    if which == "effective":
        clipped = torch.tensor(constants.metadata["clipped_negative_mass"])
        summary["clipped_negative_mass"] = float(clipped.mean())
    if figures:
        from . import figures as fig

        heads = heads or pick_heads(summary)
        summary["heatmap_heads"] = heads
        files.append(fig.plot_token_shares(summary, out_dir / "token_shares.png").name)
        if which == "effective":
            files.append(fig.plot_sep_mass(summary, out_dir / "sep_mass.png").name)
        averaged_attention = state.attention.result()[0]
        files.append(fig.plot_heatmaps(averaged_attention, constants, heads, which, out_dir / "heatmaps.png").name)
    summary["files"] = [*files, "summary.json"]
    (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
