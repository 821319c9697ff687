"""A checkpoint's facts in words: ``papa-surgery inspect``'s text, and the plain phrases the model card shares.

Everything here reads :func:`papa_surgery.conversion.inspection.describe`'s dict; nothing reads files.
"""

from __future__ import annotations

from .healed import healing_line


def head_grid_lines(d: dict, constant: str = "C", kept: str = ".") -> list[str]:
    """The layer x head grid as text lines (``C`` constant, ``.`` input-dependent attention)."""
    width = len(str(max(d["num_heads"] - 1, 0))) + 1  # a space before each column: heads 9, 10, 11 stay apart
    lines = ["layer " + "".join(f"{h:>{width}}" for h in range(d["num_heads"]))]
    for layer, row in enumerate(d["grid"]):
        lines.append(f"{layer:>5} " + "".join(f"{constant if c else kept:>{width}}" for c in row))
    return lines


def human_size(n: int) -> str:
    """``n`` bytes in binary units, named as such (90,864,192 bytes: ``86.7 MiB``, as the demo prints it)."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def ranking_text(d: dict) -> str:
    """The ranking method that chose the constant heads, in words: at fraction 0 or 1 none is needed."""
    if d.get("method"):
        return d["method"]
    if d.get("num_constant_heads") == d.get("num_heads_total"):
        return "none (every head is constant, whatever the order)"
    return "none (no head is constant)" if not d.get("num_constant_heads") else "not recorded"


def sharpness_text(fit: dict) -> str:
    """The fitted exponents, in words: ``exponent per layer 0: 1.5, 1: 2; fitting objective 0.41 -> 0.33``, or
    with ``per-head``, ``exponent per head, layer 0: 0.52 to 2.1, ...`` (each layer's range)."""
    fitted = fit.get("exponents", {})
    per_head = fit.get("search") == "per-head"
    if per_head:
        ranges = {layer: (min(ps.values()), max(ps.values())) for layer, ps in fitted.items() if ps}
        exponents = ", ".join(f"{layer}: {lo:.2g} to {hi:.2g}" for layer, (lo, hi) in ranges.items())
    else:
        exponents = ", ".join(f"{layer}: {p:g}" for layer, p in fitted.items())
    before, after = fit.get("loss_average"), fit.get("loss_sharpened")
    change = f"; fitting objective {before:.3g} -> {after:.3g}" if before is not None and after is not None else ""
    if per_head and not exponents:
        return f"exponent per head: none, the average kept{change}"
    return f"exponent per {'head, layer' if per_head else 'layer'} {exponents or 'none'}{change}"


def distillation_text(fit: dict) -> str:
    """``distilled for 200 steps (lr 0.01, objective layers), loss 0.41 -> 0.33``."""
    first, last = fit.get("loss_first_steps"), fit.get("loss_last_steps")
    change = f", loss {first:.3g} -> {last:.3g}" if first is not None and last is not None else ""
    return f"distilled for {fit.get('steps')} steps (lr {fit.get('lr')}, objective {fit.get('objective')}){change}"


def fit_note(d: dict) -> str:
    """How the checkpoint's trained constants were fitted, in brackets after the kind (empty for other kinds)."""
    if d.get("kind") == "distilled" and d.get("distilled"):  # distilled from sharpened constants records both
        return f" ({distillation_text(d['distilled'])})"
    return f" ({sharpness_text(d['sharpened'])})" if d.get("kind") == "sharpened" and d.get("sharpened") else ""


def format_description(d: dict) -> str:
    """Human-readable text of ``describe``'s dict (what ``papa-surgery inspect DIR`` prints)."""
    fraction = d["fraction"]
    lines = [
        f"PAPA checkpoint: {d['folder']}",
        f"  family          {d['family']} ({', '.join(d['architectures']) or 'no architectures'})",
        *[f"  family notes    {d['family_notes']}; needs transformers>={d['min_transformers']}"]
        * bool(d.get("family_notes")),
        f"  source          {_source_text(d)}",
        f"  constant heads  {d['num_constant_heads']} of {d['num_heads_total']}"
        + (f" (fraction {fraction:.4g})" if fraction is not None else ""),
        f"  kind            {d['kind']}{fit_note(d)}",
        f"  ranking         {ranking_text(d)}",
        f"  slots (L)       {d['max_length']}   dtype {d['constants_dtype']}"
        + f"   storage {d['constants_storage']}"
        + ("   trainable" if d["trainable_constants"] else ""),
    ]
    if d.get("constants_structure"):
        lines.append(f"  structure       {d['constants_structure']}")
    if d.get("offset_profile"):
        lines.append(f"  offset profile  {offset_profile_text(d['offset_profile'])}")
    if shorter_than_source_text(d):
        lines.append(f"  shorter         {shorter_than_source_text(d)}")
    lines.append(f"  calibrated on   {calibrated_on_text(d)}")
    corpus = d["corpus"] or {}
    if corpus.get("description"):
        lines.append(
            f"  corpus          {corpus['description']}"
            + (f" ({corpus['examples']} examples)" if corpus.get("examples") is not None else "")
        )
    if d["coverage"]:
        lines.append(f"  coverage        {format_coverage(d['coverage'])}")
    if sentence_transformers_text(d):
        lines.append(f"  sentence-transformers  {sentence_transformers_text(d)}")
    if d.get("healing"):
        lines.append(f"  healed          {healing_line(d['healing'])}")
    lines.append(f"  format          v{d['format_version']}, papa-surgery {d['papa_surgery_version']}")
    if d.get("unknown_fields"):
        lines.append(
            f"  ignored fields  {', '.join(d['unknown_fields'])} (unknown to this papa-surgery; loading ignores them)"
        )
    if d["library_versions"]:
        lines.append("  libraries       " + ", ".join(f"{k} {v}" for k, v in sorted(d["library_versions"].items())))
    if d["command"]:
        lines.append(f"  command         {d['command']}")
    healed_by = (d.get("healing") or {}).get("command")
    if healed_by and healed_by != d["command"]:  # healed by its own command (heal), after the one that converted
        lines.append(f"  heal command    {healed_by}")
    lines.append("  heads (C = constant, . = attention):")
    lines += ["    " + line for line in head_grid_lines(d)]
    lines.append(f"  files ({human_size(d['total_size'])}):")
    lines += [f"    {name:<28} {human_size(size):>10}" for name, size in d["files"].items()]
    if d["missing_files"]:
        lines.append(f"  missing         {', '.join(d['missing_files'])}")
    for problem in d.get("problems") or []:
        lines.append(f"  PROBLEM         {problem}")
    return "\n".join(lines)


def offset_profile_text(profile) -> str:
    """``|j-i| = 17: 1.2e-03, 32: ...``: the mean constant weight of a cell at each distance from the diagonal."""
    return "weight per cell at |j-i| = " + ", ".join(f"{d}: {w:.2e}" for d, w in profile) + " (mean of heads)"


def _source_text(d: dict) -> str:
    """The source as ``inspect`` shows it: a Hub id (at its revision), or a local folder's name and its ancestry."""
    name = d.get("source_model") or "not recorded"
    if d.get("source_local"):
        return f"{name} (a local model" + (f", derived from {d['base_model']})" if d.get("base_model") else ")")
    return name + (f" @ {d['source_revision']}" if d.get("source_revision") else "")


def shorter_than_source_text(d: dict) -> str:
    """What a checkpoint whose L is below its source's own length refuses (empty when it is not below)."""
    own = d.get("source_max_length") or {}
    length, slots = own.get("length"), d.get("max_length")
    if not isinstance(length, int) or not isinstance(slots, int) or slots >= length:
        return ""
    return (
        f"L = {slots} is below the source's own length, {length} ({own.get('from') or 'not recorded'}): inputs of "
        f"{slots + 1} to {length} tokens, which the source takes, are refused (a tokenizer with truncation=True and a "
        f"sentence-transformers pipeline cut them at {slots})"
    )


def sentence_transformers_text(d: dict) -> str:
    """Whether the source was taken for a sentence-transformers model, what was kept, and why (empty: not recorded,
    as in recipes written before papa-surgery recorded it)."""
    record = d.get("sentence_transformers")
    if not isinstance(record, dict):
        return ""
    why = record.get("why") or "not recorded why"
    if record.get("model") is None:
        return f"unknown: {why}; the checkpoint has no sentence-transformers files"
    if record.get("model"):
        return f"yes ({why}): kept {', '.join(record.get('files') or []) or 'nothing'}, max_seq_length at most L"
    return f"no ({why})"


def calibrated_on_text(d: dict) -> str:
    """What the constants were calibrated on, in plain words (``describe``'s dict)."""
    if not (d.get("corpus") or {}).get("description"):
        if d.get("num_constant_heads") == 0:  # convert --fraction 0 calibrates nothing: no head would hold it
            return "nothing: no head is constant, so no constants were made"
        return f"no corpus: {d.get('kind') or 'these'} constants are made without data"
    if d.get("calibrated_on") == "pairs":
        return f"sentence pairs (a pair's middle separator at slot {int(d['max_length']) // 2})"
    if d.get("calibrated_on") == "single":
        return "single sentences (one segment per input; pairs work too, their layout was not calibrated)"
    return str(d.get("calibrated_on") or "not recorded")


def format_coverage(coverage) -> str:
    """A short text of the recipe's coverage entry (any JSON: dicts print as ``key value`` pairs)."""
    if isinstance(coverage, dict):
        parts = []
        for key, value in coverage.items():
            if isinstance(value, list):
                value = f"[{len(value)} values]" if len(value) > 8 else value
            parts.append(f"{key} {value}")
        return ", ".join(parts)
    if isinstance(coverage, list) and coverage and all(isinstance(v, (int, float)) for v in coverage):
        seen = sum(1 for v in coverage if v > 0)
        return f"{seen} of {len(coverage)} slots seen, min {min(coverage)}, max {max(coverage)} examples per slot"
    return str(coverage)
