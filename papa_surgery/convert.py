"""Conversion: source model + Constants + constant heads -> a PAPA model, and its checkpoint folder.

The in-memory PAPA model is the class a checkpoint loads (``PapaBertModel`` ...), built by the same
``hub_code`` that ships next to the weights, so what is tested here is what users load.
"""

from __future__ import annotations

import datetime as _dt
import json
import sys
from pathlib import Path

import torch

from . import __version__
from .architectures import get_family, is_papa_config, num_heads_layers
from .compact import compact_parts, layout_for
from .constants import Constants
from .coverage import warn_coverage
from .hub_code.compact_constants import COMPACT_PARTS, CompactLayout
from .hub_code.configuration_papa import PAPA_FIELDS, PAPA_FORMAT_VERSION, papa_config_class
from .hub_code.modeling_papa import attention_modules, heads_by_layer, papa_model_class
from .loading import public_name, resolve_dtype
from .st_files import copy_sentence_transformers_files


def normalize_heads(heads, num_layers: int, num_heads: int) -> list[list[int]]:
    """Sorted, de-duplicated ``[[layer, head], ...]``; ValueError for a head the model does not have."""
    out = set()
    for item in heads or []:
        layer, head = (int(x) for x in item)
        if not (0 <= layer < num_layers and 0 <= head < num_heads):
            raise ValueError(
                f"head [{layer}, {head}] does not exist in a model of {num_layers} layers x {num_heads} heads"
            )
        out.add((layer, head))
    return [list(x) for x in sorted(out)]


def _auto_class_of(model, family) -> str:
    name = type(model).__name__.removeprefix("Papa")
    for auto, cls_name in family.auto_classes.items():
        if cls_name == name:
            return auto
    raise ValueError(
        f"{type(model).__name__} has no PAPA counterpart; load the source with one of: "
        f"{', '.join(family.auto_classes.values())}"
    )


def papa_config(source_config, **papa_fields):
    """The PAPA config of a source config: the same fields, the family's PAPA config class, ``papa_*`` set."""
    family = get_family(source_config)
    unknown = set(papa_fields) - set(PAPA_FIELDS)
    if unknown:
        raise ValueError(f"unknown PAPA fields {sorted(unknown)}; known: {sorted(PAPA_FIELDS)}")
    fields = source_config.to_dict()
    for key in ("model_type", "architectures", "auto_map", "transformers_version", "_name_or_path"):
        fields.pop(key, None)
    fields = {k: v for k, v in fields.items() if not k.startswith("papa_")}
    return papa_config_class(family.model_type)(**fields, **papa_fields)


def separator_id(tokenizer, config) -> int | None:
    """The separator that marks a pair's middle: the tokenizer's, else the config's (``None``: no pairs)."""
    return getattr(tokenizer if tokenizer is not None else config, "sep_token_id", None)


def build_papa_model(source, config, constants: dict[int, torch.Tensor] | None = None, unused: tuple[str, ...] = ()):
    """Build a PAPA model from a source model the way ``from_pretrained`` builds it from a checkpoint.

    The PAPA class is constructed on the meta device from ``config``; its state dict is the source's with
    the query/key rows of constant heads removed (each module's ``papa_rows`` says which rows it keeps)
    plus the constant matrices; ``from_pretrained`` then loads that state dict into a fresh PAPA model.

    Args:
        source: the source model (never changed), of the auto class the PAPA model should have.
        config: its PAPA config (:func:`papa_config`).
        constants: ``{layer: (Hc, L, L)}`` for each layer's constant heads, in head order; zeros if absent.
            A config with a compact layout stores them as compact parts (``papa_surgery.compact``).
        unused: prefixes of weights the caller never reads (the encoder's pooler in a lambda model), zeros
            where the source lacks them (RoBERTa-style task heads build their encoder without a pooler).

    Returns:
        The PAPA model, on the source's device, in eval mode.
    """
    family = get_family(source)
    cls = papa_model_class(family.model_type, _auto_class_of(source, family))
    with torch.device("meta"):
        skeleton = cls(config)
    layer_of = {id(m): i for i, m in enumerate(attention_modules(skeleton))}
    rows = {  # PAPA key -> (source key, the source rows it keeps)
        f"{name}.{local}": (f"{name}.{source_local}", keep)
        for name, module in skeleton.named_modules()
        for local, (source_local, keep) in getattr(module, "papa_rows", {}).items()
    }
    source_state = source.state_dict()
    compact = CompactLayout.from_config(config)
    parts: dict[int, dict[str, torch.Tensor]] = {}  # layer -> compact parts, fitted once per layer
    state: dict[str, torch.Tensor] = {}
    for key, meta in skeleton.state_dict().items():
        prefix, _, local = key.rpartition(".")
        if local == "papa_constants" or local in COMPACT_PARTS:
            layer = layer_of[id(skeleton.get_submodule(prefix))]
            given = (constants or {}).get(layer)
            if given is None:
                state[key] = torch.zeros(meta.shape)
            elif local == "papa_constants":
                state[key] = given
            else:
                if layer not in parts:
                    parts[layer] = compact_parts(given, compact, meta.dtype)
                state[key] = parts[layer][local]
        elif local == "papa_lambda_logits":
            state[key] = torch.zeros(meta.shape)
        elif key in rows:
            source_key, keep = rows[key]
            state[key] = source_state[source_key][keep]
        elif key not in source_state and key.startswith(unused):
            state[key] = torch.zeros(meta.shape)
        else:
            state[key] = source_state[key]
        state[key] = state[key].to(meta.dtype)
    papa, info = cls.from_pretrained(
        None,
        config=config,
        state_dict=state,
        dtype=next(source.parameters()).dtype,
        attn_implementation=source.config._attn_implementation,
        output_loading_info=True,
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise RuntimeError(f"building the PAPA model left weights unmatched: {problems}")
    return papa.to(next(source.parameters()).device).eval()


def convert(
    model,
    constants: Constants,
    heads,
    *,
    tokenizer=None,
    kind: str | None = None,
    method: str | None = None,
    fraction: float | None = None,
    dtype: str = "float32",
    trainable_constants: bool = False,
    source_name: str | None = None,
    storage: str = "auto",
    compact_band: int | None = None,
    compact_rank: int | None = None,
):
    """Make a PAPA model: the listed heads attend with constant matrices, the rest is the source.

    Args:
        model: a source model of a supported family and head (never changed).
        constants: ``Constants`` for every layer and head of this model (any kind).
        heads: ``[[layer, head], ...]`` to make constant (e.g. ``ranking.select(fraction)``).
        tokenizer: the source tokenizer; its separator id lets the model find a pair's middle.
        kind, method, fraction: provenance written into the config.
        dtype: storage dtype of the constants: fp32 (default), fp16 or bf16.
        trainable_constants: give the constants gradients (the paper's "labeled" matrices).
        source_name: the source's Hub id, for provenance and the compatibility check.
        storage: ``dense`` (L x L per head), ``compact`` (band, special slots, relative-offset profile and a
            low-rank residual; ``papa_surgery.compact``) or ``auto`` (dense up to L=128, compact above). The
            returned model already computes with the compacted matrices, exactly as the checkpoint will.
        compact_band, compact_rank: the compact layout's band half-width and residual rank (defaults 16, 16).

    Returns:
        The PAPA model (``Papa<Class>``), in eval mode. Its query/key weights of constant heads are gone;
        only constant heads store their matrices.
    """
    family = get_family(model)
    if is_papa_config(model.config):
        raise ValueError("this model is already a PAPA model; convert its source model instead")
    num_heads, num_layers = num_heads_layers(model.config)
    source = source_name or getattr(model.config, "_name_or_path", None) or None
    constants.check_compatible(model.config, source, model=model)
    warn_coverage(constants)  # once per Constants: calibrate() has already warned about its own
    constants = constants.fill()  # files written before filling existed still have empty cells
    heads = normalize_heads(heads, num_layers, num_heads)
    store = resolve_dtype(dtype)
    layout = (
        None
        if trainable_constants
        else layout_for(storage, constants.max_length, constants.pairs, compact_band, compact_rank)
    )
    if trainable_constants and storage == "compact":
        raise ValueError("trainable constants are stored dense; drop storage='compact' or trainable_constants")
    config = papa_config(
        model.config,
        papa_max_length=constants.max_length,
        papa_constant_heads=heads,
        papa_sep_token_id=separator_id(tokenizer, model.config),
        papa_constants_dtype=str(store).replace("torch.", ""),
        papa_compact_band=None if layout is None else layout.band,
        papa_compact_rank=None if layout is None else layout.rank,
        papa_trainable_constants=bool(trainable_constants),
        papa_kind=kind or constants.kind,
        papa_method=method,
        papa_fraction=None if fraction is None else float(fraction),
        papa_calibrated_on="pairs" if constants.pairs else "single",
        papa_source_model=public_name(source),
        papa_linear_names=linear_names(family, heads, num_layers, num_heads),
        papa_format_version=PAPA_FORMAT_VERSION,
        papa_surgery_version=__version__,
    )
    by_layer = heads_by_layer(heads)
    values = {layer: constants.values[layer, sorted(hs)] for layer, hs in by_layer.items()}  # (Hc, L, L) each
    papa = build_papa_model(model, config, values)
    config = papa.config
    config.architectures = [type(papa).__name__]
    config.auto_map = auto_map(family)
    return papa


def linear_names(family, heads, num_layers: int, num_heads: int) -> dict[str, list[int]]:
    """Per-head projection name -> the layers where it is still an ``nn.Linear`` (for LoRA ``target_modules``).

    A layer whose every head is constant has no query/key projection at all; LoRA targeting only
    ``query`` would then silently adapt nothing there.
    """
    constant = heads_by_layer(heads)
    all_layers = list(range(num_layers))
    kept = [layer for layer in all_layers if len(set(constant.get(layer, []))) < num_heads]
    if family.style == "deberta":  # fused q/k/v: in_proj stays where a head is kept
        return {"in_proj": kept, "papa_value_proj": [layer for layer in all_layers if constant.get(layer)]}
    if family.fused_qkv:  # ModernBERT: Wqkv stays a Linear where no head is constant, else Wqkv.proj holds its rows
        return {
            family.q: [layer for layer in all_layers if not constant.get(layer)],
            f"{family.q}.proj": [layer for layer in all_layers if constant.get(layer)],
            family.out: all_layers,
        }
    names = {family.q: kept, family.k: kept, family.v: all_layers}
    if family.out:
        names[family.out] = all_layers
    return names


def auto_map(family) -> dict[str, str]:
    """``auto_map`` of a PAPA config: every auto class of the family -> the shipped classes."""
    out = {"AutoConfig": f"configuration_papa.{family.papa_prefix}Config"}
    for auto, name in family.auto_classes.items():
        out[auto] = f"modeling_papa.Papa{name}"
    return out


def constant_heads_of(model) -> list[list[int]]:
    """``[[layer, head], ...]`` currently constant in a PAPA model."""
    heads = [getattr(m, "papa_heads", None) for m in attention_modules(model)]
    return [[layer, h] for layer, hs in enumerate(heads) if hs is not None for h in hs.const]


def library_versions() -> dict[str, str]:
    import huggingface_hub
    import safetensors
    import transformers

    return {
        "papa_surgery": __version__,
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "huggingface_hub": huggingface_hub.__version__,
        "safetensors": safetensors.__version__,
        "python": sys.version.split()[0],
    }


def build_recipe(model, constants: Constants, ranking=None, command: str | None = None, source_revision=None) -> dict:
    """Everything needed to redo a conversion, for ``papa_recipe.json``."""
    config = model.config
    heads, layers = num_heads_layers(config)
    return {
        "papa_surgery_version": __version__,
        "format_version": PAPA_FORMAT_VERSION,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "source": {
            "model": constants.metadata.get("source_model") or config.papa_source_model,
            "revision": source_revision,
            "model_type": get_family(config).model_type,
        },
        "corpus": {
            "description": constants.metadata.get("corpus"),
            "examples": constants.metadata.get("examples"),
            "pairs": constants.pairs,
            "processes": constants.metadata.get("processes"),  # how many processes calibrated them
        },
        "kind": config.papa_kind,
        "ranking": None if ranking is None else {"method": ranking.method, "provenance": ranking.provenance},
        "method": config.papa_method,
        "fraction": config.papa_fraction,
        "max_length": config.papa_max_length,
        "constants_dtype": config.papa_constants_dtype,
        "constants_storage": "dense"
        if config.papa_compact_band is None
        else {"band": config.papa_compact_band, "rank": config.papa_compact_rank},
        "constant_heads": config.papa_constant_heads,
        "num_heads_total": heads * layers,
        "coverage": constants.summary().get("coverage"),
        "command": command,
        "library_versions": library_versions(),
    }


def save_tokenizer(tokenizer, out_dir: str | Path, max_length: int) -> None:
    """Save ``tokenizer`` with ``model_max_length`` = L, so ``truncation=True`` and pipelines fit the slots."""
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["model_max_length"] = int(max_length)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_checkpoint(
    model,
    out_dir: str | Path,
    tokenizer=None,
    recipe: dict | None = None,
    overwrite: bool = False,
    card: bool = True,
    results=None,
    words=None,
) -> Path:
    """Write a standalone PAPA checkpoint folder, all or nothing.

    The folder is assembled in a hidden staging sibling and moved into place only when complete, with a
    rename that never replaces something this call did not create (``papa_surgery.atomic``): a failure,
    SIGTERM or Ctrl-C leaves no partial output, and a folder that appears at ``out_dir`` meanwhile is kept
    (the error names where the finished checkpoint went). A new path or an empty folder is written; an
    existing checkpoint is replaced only with ``overwrite``, and never the model being read or a folder
    holding files papa-surgery did not write (``papa_surgery.overwrite``). ``results`` (a probe results
    JSONL file or rows) adds a results table to the model card. ``words`` names the arguments in errors
    (``papa_surgery.overwrite.CLI`` for the command line; default the Python arguments).
    """
    from .atomic import staged_dir
    from .overwrite import API, local_sources

    out_dir = Path(out_dir)
    words = words or API
    # The model and tokenizer may still be read from their folders while the checkpoint is written.
    reading = local_sources(
        getattr(getattr(model, "config", None), "_name_or_path", None), getattr(tokenizer, "name_or_path", None)
    )
    check_output_dir(out_dir, overwrite, reading=reading, words=words)
    if not hasattr(model.config, "papa_constant_heads"):
        raise ValueError("save_checkpoint needs a PAPA model (from papa_surgery.convert.convert)")

    def check(target: Path) -> None:
        check_output_dir(target, overwrite, reading=reading, words=words)

    with staged_dir(out_dir, overwrite=overwrite, check=check) as tmp:
        model.save_pretrained(tmp)  # the PAPA classes are registered for auto classes: code files ride along
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp, int(model.config.papa_max_length))
            copy_sentence_transformers_files(tokenizer.name_or_path, tmp, int(model.config.papa_max_length))
        (tmp / "papa_recipe.json").write_text(json.dumps(recipe or {}, indent=2, default=str) + "\n")
        if card:
            from .card import write_card

            write_card(tmp, results=results, command=(recipe or {}).get("command"))
    return out_dir


def check_output_dir(out_dir: str | Path, overwrite: bool = False, reading=(), words=None) -> None:
    """ValueError unless a checkpoint may be written to ``out_dir`` (checked again just before it is replaced).

    A new path or an empty folder is fine; ``overwrite`` replaces an earlier PAPA checkpoint holding only files
    papa-surgery writes, never anything else: not the model being read (``reading``), not a folder with other
    content (a typo such as ``--out .`` must not delete a project). See ``papa_surgery.overwrite``.
    """
    from .overwrite import API, check_folder

    check_folder(out_dir, overwrite, reading=reading, words=words or API)
