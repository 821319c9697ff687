"""Fine-tuned beside probed results, and what each converted model costs relative to its source.

Cost ratios compare a cell with the fraction-0 cell (no constant heads, the source's computation) of the
same model, task, corpus, kind and method, averaged over seeds: training and inference speed-up
(examples per second, > 1 is faster), checkpoint size and peak memory (< 1 is smaller).
"""

from __future__ import annotations

import statistics

from ..experiments.results import protocol
from .stats import GROUP_FIELDS, group_key, main_curves, pick, summarize
from .tables import cell, fraction_label, markdown_table, one_class_mark, short_model, sizes_label

COST_FIELDS = (
    "train_examples_per_second",
    "inference_examples_per_second",
    "peak_memory_mb",
    "trainable_parameters",
    "checkpoint_bytes",
)


def split_protocols(rows) -> tuple[list[dict], list[dict]]:
    """(probe rows, fine-tuning rows) of a results list."""
    return [r for r in rows if protocol(r) == "probe"], [r for r in rows if protocol(r) == "finetune"]


def cost_summary(rows) -> list[dict]:
    """Per fine-tuning group: the mean of each cost field over seeds and its ratio to the fraction-0 group.

    Returns dicts with the group fields, ``<field>`` (mean) for each of ``COST_FIELDS``, and
    ``train_speedup``, ``inference_speedup``, ``size_ratio``, ``memory_ratio`` (``None`` without a fraction-0 group).
    """
    _, tuned = split_protocols(rows)
    groups: dict[tuple, list[dict]] = {}
    for row in tuned:
        groups.setdefault(group_key(row), []).append(row)
    means = {}
    for key, members in groups.items():
        entry = dict(zip(GROUP_FIELDS, key, strict=True))
        for name in COST_FIELDS:
            values = [float(r[name]) for r in members if r.get(name) is not None]
            entry[name] = statistics.fmean(values) if values else None
            entry[f"{name}_sd"] = statistics.stdev(values) if len(values) > 1 else None
        means[key] = entry
    ratios = {
        "train_speedup": "train_examples_per_second",
        "inference_speedup": "inference_examples_per_second",
        "size_ratio": "checkpoint_bytes",
        "memory_ratio": "peak_memory_mb",
    }
    out = []
    for key, entry in means.items():
        base = means.get((*key[:-1], 0.0))
        for ratio, name in ratios.items():
            ok = base is not None and entry[name] is not None and base[name]
            entry[ratio] = entry[name] / base[name] if ok else None
            entry[f"{ratio}_spread"] = _ratio_spread(entry, base, name) if ok else None
        out.append(entry)
    return out


def _ratio_spread(entry: dict, base: dict, name: str) -> float | None:
    """The standard deviation of ``entry[name] / base[name]`` from each side's seed-to-seed spread (first order);
    ``None`` when a side ran once (no spread was measured)."""
    sd_a, sd_b = entry.get(f"{name}_sd"), base.get(f"{name}_sd")
    if sd_a is None or sd_b is None:
        return None
    ratio = entry[name] / base[name]
    return ratio * ((sd_a / entry[name]) ** 2 + (sd_b / base[name]) ** 2) ** 0.5


def _ratio(value: float | None, suffix: str = "×") -> str:
    return "–" if value is None else f"{value:.2f}{suffix}"


def _speedup(value: float | None, spread: float | None) -> str:
    """A speed-up with its spread over seeds; "(1 run)" without one; "(noise)" when the spread covers 1×."""
    if value is None:
        return "–"
    if spread is None:
        return f"{value:.2f}× (1 run)"
    return f"{value:.2f}× ± {spread:.2f}" + (" (noise)" if spread >= abs(value - 1.0) else "")


def table_finetuned(rows) -> str:
    """Markdown: per model, task and kept share, the probe and fine-tuned scores and the cost columns."""
    probed, tuned = split_protocols(rows)
    if not tuned:
        return ""
    tuned_curve = main_curves(summarize(tuned))
    probe_summary = summarize(probed)
    costs = {group_key(c): c for c in cost_summary(rows)}
    header = [
        "model",
        "task",
        "kept input-dependent",
        "probe",
        "fine-tuned",
        "train speed-up",
        "inference speed-up",
        "size",
        "peak memory",
        "trainable parameters",
    ]
    body, notes = [], []
    for e in sorted(tuned_curve, key=lambda e: (e["model"], e["task"], -e["kept_fraction"])):
        probe = pick(probe_summary, model=e["model"], task=e["task"], fraction=e["fraction"], kind=e["kind"])
        c = costs.get(group_key(e), {})
        params = c.get("trainable_parameters")
        mark = ""
        if probe is not None and probe.get("sizes") != e.get("sizes"):
            mark = " †"
            note = (
                f"† {e['task']}: the probe trained / evaluated on {sizes_label(probe)} examples, fine-tuning on "
                f"{sizes_label(e)}: the two scores are not measured alike."
            )
            if note not in notes:
                notes.append(note)
        body.append(
            [
                short_model(e["model"]),
                e["task"],
                fraction_label(e["kept_fraction"]),
                cell(probe) + ("" if probe is None else one_class_mark(probe)),
                cell(e) + one_class_mark(e) + mark,
                _speedup(c.get("train_speedup"), c.get("train_speedup_spread")),
                _speedup(c.get("inference_speedup"), c.get("inference_speedup_spread")),
                _ratio(c.get("size_ratio")),
                _ratio(c.get("memory_ratio")),
                "–" if params is None else f"{params / 1e6:.2f} M",
            ]
        )
    table = markdown_table(header, body, text_columns=3)
    return table + ("\n\n" + "\n".join(notes) if notes else "")
