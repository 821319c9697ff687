"""The model card (README.md) of a PAPA checkpoint, rendered from ``cards/papa_model_card.md``.

``render_card`` builds a ``huggingface_hub.ModelCard`` from the folder's ``config.json`` and
``papa_recipe.json`` (the same facts as ``inspect_checkpoint.describe``), optional probe results
(JSONL rows: model, task, fraction, kind, method, seed, metric, score) and the command that made it.
``write_card`` writes ``README.md`` and a heat map of a few constant matrices (``papa_constants.png``).
"""

from __future__ import annotations

from pathlib import Path

from .. import report
from .description import (
    calibrated_on_text,
    fit_note,
    format_coverage,
    offset_profile_text,
    ranking_text,
    sentence_transformers_text,
    shorter_than_source_text,
)
from .healed import healing_table
from .inspection import describe

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
        return report.load_results(results)
    return [dict(row) for row in results]


def results_table(rows: list[dict]) -> str:
    """Markdown table: one row per (model, task, kind, method, fraction), mean ± 95% CI over seeds."""
    summary = [s for s in report.summarize([r for r in rows if r.get("score") is not None])]
    if not summary:
        return ""
    lines = [
        "| model | task | metric | kind | method | fraction constant | score | seeds |",
        "|---|---|---|---|---|---:|---:|---:|",
    ]
    for s in summary:
        spread = f" ± {s['ci95']:.4f}" if s.get("ci95") is not None else ""
        lines.append(
            f"| {s['model']} | {s['task']} | {s['metric']} | {s['kind']} | {s['method']} | {s['fraction']:g} "
            f"| {s['mean']:.4f}{spread} | {s['n']} |"
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
    """Heat maps of up to ``max_heads`` constant matrices (the report's Fig. 4), next to the weights.

    Returns ``None`` when the checkpoint has no constant heads.
    """
    folder = Path(checkpoint_dir)
    if not describe(folder)["constants"]:
        return None
    return report.plot_constants(folder, folder / out_name, max_heads=max_heads)


def constants_origin(kind: str | None) -> str:
    """How the card says a constant head's matrix ``C`` was made (it said "calibrated on unlabeled text" for every
    kind, data-free ones included)."""
    from .. import registry

    chosen = registry.KINDS.get(kind or "")
    if chosen is None:
        return f"made as the {kind or 'unrecorded'} kind"
    if chosen.made == registry.DATA_FREE:
        return f"made without data, the same for every head: {chosen.summary} (the {kind} kind)"
    if chosen.made == registry.CALIBRATED:
        return "calibrated once on unlabeled text: the average of that head's attention over the calibration corpus"
    if chosen.made == registry.ANALYSIS:
        return f"calibrated once on unlabeled text: {chosen.summary} (the {kind} kind)"
    return f"calibrated once on unlabeled text, then fitted: {chosen.summary} (the {kind} kind)"


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
    corpus_text = str(corpus.get("description") or "none")
    if corpus.get("examples") is not None:
        corpus_text += f", {corpus['examples']} examples"
    if corpus.get("pairs"):
        corpus_text += " (sentence pairs)"
    name = source.rstrip("/").split("/")[-1] if source else d["family"]
    source_link, source_intro = _source_words(source, d["base_model"], d.get("source_local", False))
    command = command or d["command"] or "(not recorded)"
    return ModelCard.from_template(
        card_data,
        template_path=str(_template_path()),
        title=f"{name} with PAPA constant attention ({_percent(fraction)} of heads constant)",
        source_model=source,
        source_intro=source_intro,
        source_link=source_link,
        family=d["family"],
        architectures=", ".join(d["architectures"]) or "-",
        family_notes=d.get("family_notes", "").replace("|", "\\|"),
        min_transformers=d.get("min_transformers", ""),
        num_constant_heads=d["num_constant_heads"],
        num_heads_total=d["num_heads_total"],
        fraction_percent=_percent(fraction),
        fraction_text="?" if fraction is None else f"{fraction:.4g}",
        kind=d["kind"],
        constants_origin=constants_origin(d["kind"]),
        kind_note=fit_note(d),
        method=ranking_text(d),
        max_length=int(d["max_length"]),
        shorter_text=shorter_than_source_text(d),
        calibrated_on=calibrated_on_text(d),
        corpus_text=corpus_text.replace("|", "\\|"),
        sentence_transformers=sentence_transformers_text(d).replace("|", "\\|"),
        coverage_text=format_coverage(d["coverage"]).replace("|", "\\|") if d["coverage"] else "not recorded",
        covered_text=covered_text(d["coverage"], int(d["max_length"]), d["num_constant_heads"]),
        constants_dtype=d["constants_dtype"],
        constants_storage=d["constants_storage"],
        constants_structure=(d.get("constants_structure") or "").replace("|", "\\|"),
        offset_profile=offset_profile_text(d["offset_profile"]).replace("|", "\\|") if d.get("offset_profile") else "",
        trainable_constants=d["trainable_constants"],
        format_version=d["format_version"],
        papa_surgery_version=d["papa_surgery_version"] or "",
        grid_table=grid_table(d),
        image=image,
        results_table=results_table(load_results(results)),
        healing_table=healing_table(d.get("healing")),
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


def _source_words(source: str | None, base_model: str | None, local: bool) -> tuple[str, str]:
    """(the card table's source entry, the intro's "This is ..." words) for a Hub or a local source."""
    if not source:
        return "not recorded", "an encoder"
    if not local:
        link = f"[{source}](https://huggingface.co/{base_model})" if base_model else f"`{source}`"
        return link, f"**{source}**"
    derived = f", derived from [{base_model}](https://huggingface.co/{base_model})" if base_model else ""
    return f"`{source}` (a local model{derived})", f"**{source}** (a local model{derived})"


def covered_text(coverage, max_length: int, constant_heads: int | None = None) -> str:
    """The card's "covered length" entry: how many slots the calibration corpus reached, from how many examples
    (``constant_heads`` 0: none calibrated, as at fraction 0)."""
    seen = coverage.get("slots_seen") if isinstance(coverage, dict) else None
    if seen is None:
        if constant_heads == 0:
            return "none: no head is constant, so nothing was calibrated"
        return "not recorded (data-free constants need no corpus)"
    first, least = coverage.get("examples_at_slot_0"), coverage.get("min_examples_per_seen_slot")
    counts = f"slot 0 by {first} examples, the least-reached slot by {least}" if first is not None else ""
    if seen >= max_length:
        text = f"the corpus reached all {max_length} slots" + (f" ({counts})" if counts else "")
    else:
        text = (
            f"the corpus reached {seen} of {max_length} slots" + (f" ({counts})" if counts else "") + "; the cells "
            "of the other slots were filled from each head's relative-offset profile and special-slot attention "
            "(estimated, not measured)"
        )
    well = coverage.get("slots_with_10_examples")
    if isinstance(well, int) and well < seen:
        text += f"; {seen - well} of the reached slots were averaged over fewer than 10 examples (noisy)"
    return text


def _percent(fraction) -> str:
    return "?" if fraction is None else f"{100 * fraction:.4g}%"
