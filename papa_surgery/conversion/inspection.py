"""What a PAPA checkpoint folder holds: the facts behind ``papa-surgery inspect`` and the model card.

``describe(folder)`` reads ``config.json``, ``papa_recipe.json`` and the header of ``model.safetensors``
(no weights are loaded) and returns a plain dict; :mod:`.description` says it in words.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from ..failures import one_line
from ..hub_code import HUB_CODE_FILES
from ..hub_code.checkpoint_format import CheckpointFormatError, format_of
from ..hub_code.families import family_for
from .hub_facts import auto_class_for, base_model_id, hub_datasets, pipeline_tag_for, source_facts

REQUIRED_FILES = (
    "config.json",
    "model.safetensors",
    "configuration_papa.py",
    "modeling_papa.py",
    "papa_recipe.json",
    "README.md",
)
CONSTANTS_SUFFIX = "papa_constants"


def read_config(folder: Path) -> dict:
    """``config.json`` of a PAPA checkpoint; ValueError naming what is missing otherwise."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{folder} is not a folder; pass the folder a PAPA conversion wrote")
    path = folder / "config.json"
    if not path.is_file():
        raise ValueError(f"{folder} is not a PAPA checkpoint: it has no config.json")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise ValueError(f"{path} is not valid JSON: {err}") from err
    model_type = str(config.get("model_type", ""))
    if not model_type.startswith("papa_") or "papa_max_length" not in config or "papa_constant_heads" not in config:
        raise ValueError(
            f"{folder} is not a PAPA checkpoint: config.json has model_type={model_type!r} and no papa_* fields "
            "(convert a model first: papa-surgery convert MODEL --fraction F --out DIR)"
        )
    return config


def read_recipe(folder: Path) -> dict:
    path = Path(folder) / "papa_recipe.json"
    if not path.is_file():
        return {}
    return json.loads(path.read_text(encoding="utf-8"))


def constants_header(folder: Path) -> dict[str, list[int]]:
    """Shapes of the ``*papa_constants`` tensors in ``model.safetensors`` (header only).

    Compact constants (``hub_code/compact_constants.py``) appear as the ``(Hc, L, L)`` matrices they rebuild,
    under the same ``<module>.papa_constants`` name, when every part is there with the shape the config needs.
    """
    path = Path(folder) / "model.safetensors"
    if not path.is_file():
        return {}
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as f:
        shapes = {k: list(f.get_slice(k).get_shape()) for k in f.keys() if CONSTANTS_SUFFIX in k.rpartition(".")[2]}
    out = {k: v for k, v in shapes.items() if k.endswith(CONSTANTS_SUFFIX)}
    layout = _compact_layout(folder)
    for band in [k for k in shapes if k.endswith(".papa_constants_band")]:
        prefix = band.removesuffix("_band")
        heads = shapes[band][0]
        expected = layout.shapes(heads).items() if layout is not None else ()
        found = {n: shapes.get(prefix + n.removeprefix(CONSTANTS_SUFFIX)) for n, _ in expected}
        if layout is not None and all(found[n] == list(s) for n, s in expected):
            out[prefix] = [heads, layout.max_length, layout.max_length]
        else:
            out[prefix] = [heads, "compact parts that do not match the config"]
    return out


def _compact_layout(folder: Path):
    from ..hub_code.compact_constants import CompactLayout

    class _Config:  # CompactLayout.from_config reads attributes
        def __init__(self, d):
            self.__dict__.update(d)

    try:
        return CompactLayout.from_config(_Config(read_config(folder)))
    except (ValueError, TypeError):
        return None


def read_constants(folder: Path, slots: int | None = None, heads: dict[str, list[int]] | None = None) -> dict:
    """``{<module>.papa_constants: (Hc, L, L) float32 tensor}`` of a checkpoint, compact parts rebuilt.

    ``slots``: only the first ``slots`` rows and columns (figures of a long-L checkpoint, whose full matrices would
    be L^2 values per head), read from compact parts without rebuilding the rest. ``heads``: only these tensors, and
    of each only the heads at these positions (of its Hc, in head order): a figure of three heads reads three.
    """
    import torch
    from safetensors import safe_open

    from ..hub_code.compact_constants import COMPACT_PARTS
    from ..hub_code.structured_constants import StructuredSlots

    layout = _compact_layout(folder)
    out = {}
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as f:
        for name in constants_header(folder):
            if heads is not None and name not in heads:
                continue
            pick = slice(None) if heads is None else torch.tensor(heads[name], dtype=torch.long)
            if name in f.keys():
                out[name] = f.get_tensor(name)[pick].float()[:, :slots, :slots]
            elif layout is not None:
                parts = {part: f.get_tensor(name + part.removeprefix(CONSTANTS_SUFFIX))[pick] for part in COMPACT_PARTS}
                order = torch.arange(min(slots or layout.max_length, layout.max_length))
                value = StructuredSlots(parts, layout, order, None, torch.float32).cells(order, order)  # (Hc, k, k)
                out[name] = value.clamp_min(0) if layout.clamped else value
    return out


def constants_structure(folder: Path) -> str | None:
    """How compact constants are stored and applied, in words (``None`` for dense constants)."""
    layout = _compact_layout(folder)
    if layout is None:
        return None
    from ..hub_code.constant_heads import PREPARED_UP_TO
    from ..hub_code.structured_constants import LOCAL_STRUCTURED_FROM, STRUCTURED_FROM

    text = (
        f"cells within {layout.band} of the diagonal and the rows and columns of slots "
        f"{', '.join(map(str, layout.special))} stored exactly; every other cell the head's relative-offset "
        f"profile" + (f" plus a rank-{layout.rank} residual" if layout.rank else "")
    )
    if layout.clamped:
        return text + "; rebuilt into L x L matrices at load (format 1)"
    if layout.max_length <= PREPARED_UP_TO:
        return text + "; used as stored, rebuilt once per load into the matrices every input slices"
    return text + (
        f"; used as stored, and from {STRUCTURED_FROM} slots in use on ({LOCAL_STRUCTURED_FROM} in a local layer) "
        "applied without forming the matrices (the profile as an FFT convolution, O(n log n)); a shorter batch's "
        "matrix is built from the parts"
    )


def offset_profile(folder: Path) -> list[tuple[int, float]]:
    """``[(distance, weight)]``: compact constants' relative-offset profile, averaged over constant heads and both
    directions, at distances just past the band and then at powers of two up to L - 1 (empty for dense)."""
    layout = _compact_layout(folder)
    if layout is None:
        return []
    from safetensors import safe_open

    length = layout.max_length
    total, heads = 0, 0
    with safe_open(str(Path(folder) / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            if key.endswith(".papa_constants_profile"):
                profile = f.get_tensor(key).double()  # (Hc, 2L-1)
                total, heads = total + profile.sum(0), heads + profile.shape[0]
    if not heads:
        return []
    mean = total / heads  # (2L-1,)
    powers = {2**k for k in range(1, length.bit_length())}
    distances = sorted(d for d in {layout.band + 1, length - 1, *powers} if layout.band < d < length)
    return [(d, float((mean[length - 1 + d] + mean[length - 1 - d]) / 2)) for d in distances]


def describe(folder) -> dict:
    """The facts of a PAPA checkpoint folder as a plain dict (see :func:`.description.format_description`)."""
    folder = Path(folder)
    config = read_config(folder)
    recipe = read_recipe(folder)
    family = family_for(config["model_type"])
    num_layers = int(config.get(family.layers_attr) or 0)
    num_heads = int(config.get(family.heads_attr) or 0)
    heads = _heads(config.get("papa_constant_heads"))
    grid = [[False] * num_heads for _ in range(num_layers)]
    for layer, head in heads:
        if layer < num_layers and head < num_heads:
            grid[layer][head] = True
    total = num_layers * num_heads
    fraction = config.get("papa_fraction")
    if fraction is None and total:
        fraction = len(heads) / total
    source = recipe.get("source") or {}
    corpus = recipe.get("corpus") or {}
    ranking = recipe.get("ranking") or {}
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    try:
        constants = constants_header(folder)
    except Exception:  # a truncated or damaged weights file: checkpoint_problems names it
        constants = {}
    versions = dict(recipe.get("library_versions") or {})
    if config.get("transformers_version"):
        versions.setdefault("transformers", config["transformers_version"])
    return {
        "folder": str(folder),
        "family": family.model_type,
        "family_notes": family.notes,
        "min_transformers": ".".join(map(str, family.min_transformers)),
        "model_type": config["model_type"],
        "architectures": list(config.get("architectures") or []),
        "auto_class": auto_class_for(config.get("architectures")),
        "pipeline_tag": pipeline_tag_for(config.get("architectures")),
        "source_model": source_facts(config, source)[0],
        "source_local": source_facts(config, source)[1],
        "source_revision": source.get("revision"),
        "base_model": base_model_id(source, config.get("papa_source_model") or source.get("model")),
        "license": source.get("license") or recipe.get("license"),
        "num_layers": num_layers,
        "num_heads": num_heads,
        "hidden_size": config.get("hidden_size", config.get("dim")),
        "num_constant_heads": len(heads),
        "num_heads_total": total,
        "fraction": fraction,
        "constant_heads": heads,
        "grid": grid,
        "kind": config.get("papa_kind") or recipe.get("kind"),
        "sharpened": recipe.get("sharpened"),
        "distilled": recipe.get("distilled"),
        "method": config.get("papa_method") or ranking.get("method"),
        "ranking_provenance": ranking.get("provenance"),
        "max_length": config.get("papa_max_length"),
        "source_max_length": source.get("max_length") if isinstance(source.get("max_length"), dict) else None,
        "calibrated_on": config.get("papa_calibrated_on"),
        "sep_token_id": config.get("papa_sep_token_id"),
        "constants_dtype": config.get("papa_constants_dtype"),
        "constants_storage": "dense"
        if config.get("papa_compact_band") is None
        else f"compact (band {config['papa_compact_band']}, rank {config.get('papa_compact_rank')})",
        "constants_structure": constants_structure(folder),
        "offset_profile": offset_profile(folder),
        "trainable_constants": bool(config.get("papa_trainable_constants")),
        "corpus": corpus,
        "sentence_transformers": recipe.get("sentence_transformers"),
        "datasets": hub_datasets(corpus),
        "coverage": recipe.get("coverage"),
        "command": recipe.get("command"),
        "healing": recipe.get("healing"),
        "created": recipe.get("created"),
        "format_version": _format_or_raw(config),
        "unknown_fields": unknown_fields(config),
        "papa_surgery_version": config.get("papa_surgery_version") or recipe.get("papa_surgery_version"),
        "library_versions": versions,
        "files": files,
        "total_size": sum(files.values()),
        "missing_files": [name for name in REQUIRED_FILES if name not in files],
        "constants": constants,
        "problems": checkpoint_problems(folder, config, num_layers, num_heads),
    }


def _heads(value) -> list[list[int]]:
    """The well-formed ``[layer, head]`` entries of ``papa_constant_heads``, sorted (problems are reported apart)."""
    out = []
    for item in value if isinstance(value, list) else []:
        if (
            isinstance(item, list)
            and len(item) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in item)
        ):
            out.append([int(item[0]), int(item[1])])
    return sorted(out)


_LAYER = re.compile(r"\.layers?\.(\d+)\.")


def shipped_code_files(folder: Path) -> list[str]:
    """The code files a checkpoint needs: its entry files and the siblings they import, by its own code (a checkpoint
    saved by an older papa-surgery ships fewer files than ``hub_code`` holds now); today's list when it has none."""
    entries = ("configuration_papa.py", "modeling_papa.py")
    if not all((Path(folder) / name).is_file() for name in entries):
        return list(HUB_CODE_FILES)
    names = set(entries)
    for name in entries:
        text = (Path(folder) / name).read_text(encoding="utf-8")
        names |= {f"{module}.py" for module in re.findall(r"^from \.(\w+) import", text, flags=re.MULTILINE)}
    return sorted(names)


def _format_or_raw(config: dict):
    """The checkpoint's format (1 when ``config.json`` states none), or the stated value this code cannot read."""
    try:
        return format_of(config)
    except CheckpointFormatError as err:
        return err.found


def unknown_fields(config: dict) -> list[str]:
    """``papa_*`` fields of ``config.json`` this papa-surgery does not know (loading names them and ignores them)."""
    from ..hub_code.configuration_papa import PAPA_FIELDS

    return sorted(k for k in config if k.startswith("papa_") and k not in PAPA_FIELDS)


def checkpoint_problems(folder: Path, config: dict, num_layers: int, num_heads: int) -> list[str]:
    """What would stop ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` or papa-surgery's own classes from
    loading the folder (empty when it loads).

    Checks what loading relies on: a format this code reads, the head list (a list of in-range, distinct
    ``[layer, head]`` pairs), ``papa_max_length``, one ``(constant heads, L, L)`` constants tensor per layer with
    constant heads, and every code file the model imports.
    """
    folder = Path(folder)
    problems = []
    try:
        format_of(config)
    except CheckpointFormatError as err:  # the checks below read this format: of another they would only mislead
        return [str(err)]
    raw = config.get("papa_constant_heads")
    if not isinstance(raw, list):
        problems.append(f"papa_constant_heads is {json.dumps(raw)}, not a list of [layer, head] pairs")
        raw = []
    heads = _heads(raw)
    if len(heads) != len(raw):
        problems.append("papa_constant_heads has entries that are not [layer, head] integer pairs")
    bad = [h for h in heads if not (0 <= h[0] < num_layers and 0 <= h[1] < num_heads)]
    if bad:
        problems.append(f"constant head(s) {bad[:3]} out of range for {num_layers} layers x {num_heads} heads")
    if len({tuple(h) for h in heads}) != len(heads):
        problems.append("papa_constant_heads lists a head more than once")
    length = config.get("papa_max_length")
    if not isinstance(length, int) or isinstance(length, bool) or length < 1:
        problems.append(f"papa_max_length is {json.dumps(length)}, not a positive integer")
        length = None
    missing_code = [name for name in shipped_code_files(folder) if not (folder / name).is_file()]
    if missing_code:
        problems.append(f"missing model code {', '.join(missing_code)} (copy it from papa_surgery/hub_code)")
    if not (folder / "model.safetensors").is_file():
        problems.append("missing model.safetensors")
        return problems
    try:
        tensors = constants_header(folder)
    except Exception as err:  # a truncated or damaged file: safetensors' own words, with the file named
        return [
            *problems,
            f"{folder / 'model.safetensors'} cannot be read, it is truncated or damaged ({one_line(err)}); "
            "write the checkpoint again (or download it again)",
        ]
    per_layer: dict[int, int] = {}
    for layer, _ in heads:
        per_layer[layer] = per_layer.get(layer, 0) + 1
    found = {}
    for name, shape in tensors.items():
        match = _LAYER.search("." + name)
        found[int(match.group(1)) if match else -1] = (name, shape)
    for layer, count in sorted(per_layer.items()):
        if layer not in found:
            problems.append(f"layer {layer} has {count} constant head(s) but model.safetensors has no constants for it")
            continue
        name, shape = found[layer]
        if length is not None and list(shape) != [count, length, length]:
            problems.append(
                f"{name} has shape {shape}, but the config needs [{count}, {length}, {length}] "
                f"({count} constant head(s), papa_max_length={length})"
            )
    extra = sorted(set(found) - set(per_layer))
    if extra:
        problems.append(f"model.safetensors has constants for layer(s) {extra} with no constant heads in the config")
    return problems
