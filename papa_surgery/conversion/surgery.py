"""Conversion: source model + Constants + constant heads -> a PAPA model, and its checkpoint folder.

The in-memory PAPA model is the class a checkpoint loads (``PapaBertModel`` ...), built by the same
``hub_code`` that ships next to the weights, so what is tested here is what users load.
"""

from __future__ import annotations

import warnings

import torch

from .. import __version__
from ..calibration.compaction import compact_parts, layout_for
from ..calibration.coverage import warn_coverage
from ..calibration.protocol import ConstantsBase
from ..hub_code.compact_constants import COMPACT_PARTS, CompactLayout
from ..hub_code.configuration_papa import PAPA_FIELDS, PAPA_FORMAT_VERSION, papa_config_class
from ..hub_code.modeling_papa import attention_modules, heads_by_layer, papa_model_class
from ..models.families import get_family, is_papa_config, num_heads_layers
from ..models.loading import public_name, resolve_dtype


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
            A config with a compact layout stores them as compact parts (``calibration.compaction``); a layer's
            entry may also be those parts already (``{name: (Hc, ...)}``, from structured calibration), stored as
            they are, so no (L, L) matrix is ever built.
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
            elif isinstance(given, dict):
                if local not in given:
                    raise ValueError(f"compact constant parts given for a dense layout (layer {layer}); convert dense")
                state[key] = given[local]
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
        # a copy: from_pretrained adopts the given tensors, and training the PAPA model must not train the source
        state[key] = state[key].detach().to(meta.dtype, copy=True)
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
    constants: ConstantsBase,
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
        constants: ``Constants`` or ``StructuredConstants`` for every layer and head of this model (any kind).
        heads: ``[[layer, head], ...]`` to make constant (e.g. ``ranking.select(fraction)``).
        tokenizer: the source tokenizer; its separator id lets the model find a pair's middle.
        kind, method, fraction: provenance written into the config.
        dtype: storage dtype of the constants: fp32 (default), fp16 or bf16.
        trainable_constants: give the constants gradients (the paper's "labeled" matrices).
        source_name: the source's Hub id, for provenance and the compatibility check.
        storage: ``dense`` (L x L per head), ``compact`` (band, special slots, relative-offset profile and a
            low-rank residual; ``calibration.compaction``) or ``auto`` (dense up to L=128 and for distilled
            constants, compact above). The returned model already computes with the compacted matrices, exactly as the
            checkpoint will.
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
    warn_float16_underflow(constants, heads, store)
    if trainable_constants or storage == "dense":  # (L, L) matrices asked for: compact parts rebuilt (short L only)
        constants = constants.to_dense()
    layout = constants.conversion_layout(storage, trainable_constants, compact_band, compact_rank)
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
    # (Hc, L, L) matrices, or compact parts stored as they are (no (L, L) matrix)
    values = {layer: constants.layer_constants(layer, hs) for layer, hs in heads_by_layer(heads).items()}
    papa = build_papa_model(model, config, values)
    config = papa.config
    config.architectures = [type(papa).__name__]
    config.auto_map = auto_map(family)
    return papa


def warn_float16_underflow(constants: ConstantsBase, heads, store: torch.dtype) -> None:
    """A warning when float16 storage empties rows of ``heads``' dense matrices for short inputs.

    Why: float16 keeps nothing below 6e-8. A row raised to a large power (the sharpened kind: exponents up to 13)
    can hold all its mass for a short input's slots in such values (row i of an input of n > i tokens reads columns
    0..n-1): stored in float16 it is empty there, and the head then contributes nothing for that token. bfloat16
    and float32 keep those values."""
    if store != torch.float16 or not hasattr(constants, "values"):
        return
    lost = 0
    for layer, hs in heads_by_layer(heads).items():
        kept = constants.values[layer, sorted(hs)].to(torch.float16) > 0  # (Hc, L, L)
        length = kept.shape[-1]
        first = torch.where(kept.any(-1), kept.int().argmax(-1), length)  # (Hc, L): first column kept in each row
        lost += int((first > torch.arange(length)).sum())  # row i is empty for inputs of i + 1 .. first tokens
    if lost:
        warnings.warn(
            f"{lost} rows of these {getattr(constants, 'kind', '')} constants underflow to zeros in float16 for short "
            "inputs (the head then contributes nothing for those tokens): store them in bf16 or fp32 (dtype)",
            stacklevel=3,
        )


def rebuild_papa_model(papa, *, trainable_constants: bool = False, storage: str = "auto", dtype=None, compact=None):
    """The same PAPA model (weights, heads, constants) with its constants held another way.

    Healing trains dense constants as a parameter (``trainable_constants=True``, ``storage="dense"``) and stores
    them back frozen, dense or compact (``storage``: as in :func:`convert`; compact parts are fitted to the trained
    matrices, and the model returned computes with them). ``compact``: ``(band, rank)`` of the compact storage
    (default: ``papa``'s own, else the default for L). ``dtype``: the constants' storage dtype (default: the
    model's). The model is built as ``from_pretrained`` builds it, by papa-surgery's own classes (a checkpoint
    loaded with its shipped code works too); ``papa`` is not changed.
    """
    from ..hub_code.compact_constants import constants_of

    family = get_family(papa)
    config = papa.config
    constants = {
        layer: constants_of(module).detach().float()  # (Hc, L, L), rebuilt when stored compact
        for layer, module in enumerate(attention_modules(papa))
        if getattr(module, "papa_heads", None) is not None and module.papa_heads.const
    }
    store = resolve_dtype(dtype or config.papa_constants_dtype)
    layout = None
    if not trainable_constants:
        band, rank = compact or (getattr(config, "papa_compact_band", None), getattr(config, "papa_compact_rank", None))
        pairs = getattr(config, "papa_calibrated_on", None) == "pairs"
        layout = layout_for(storage, int(config.papa_max_length), pairs, band, rank, fitted=True)
    dropped = ("model_type", "architectures", "auto_map", "transformers_version", "_name_or_path")
    fields = {k: v for k, v in config.to_dict().items() if k not in dropped}
    fields.update(
        papa_trainable_constants=bool(trainable_constants),
        papa_compact_band=None if layout is None else layout.band,
        papa_compact_rank=None if layout is None else layout.rank,
        papa_constants_dtype=str(store).replace("torch.", ""),
        # the constants are stored anew by this code: its format, never the one the model was loaded in
        papa_format_version=PAPA_FORMAT_VERSION,
        papa_surgery_version=__version__,
    )
    new_config = papa_config_class(family.model_type)(**fields)
    cls = papa_model_class(family.model_type, _auto_class_of(papa, family))
    with torch.device("meta"):
        skeleton = cls(new_config)
    layer_of = {id(m): i for i, m in enumerate(attention_modules(skeleton))}
    old_state = papa.state_dict()
    parts: dict[int, dict[str, torch.Tensor]] = {}
    state: dict[str, torch.Tensor] = {}
    for key, meta in skeleton.state_dict().items():
        prefix, _, local = key.rpartition(".")
        if local == "papa_constants":
            state[key] = constants[layer_of[id(skeleton.get_submodule(prefix))]]
        elif local in COMPACT_PARTS:
            layer = layer_of[id(skeleton.get_submodule(prefix))]
            if layer not in parts:
                parts[layer] = compact_parts(constants[layer], layout, meta.dtype)
            state[key] = parts[layer][local]
        else:
            state[key] = old_state[key]
        state[key] = state[key].detach().to(meta.dtype, copy=True)  # never shared with ``papa`` (see above)
    param = next(papa.parameters())
    rebuilt, info = cls.from_pretrained(
        None,
        config=new_config,
        state_dict=state,
        dtype=param.dtype,
        attn_implementation=config._attn_implementation,
        output_loading_info=True,
    )
    problems = {k: v for k, v in info.items() if v and k in ("missing_keys", "unexpected_keys", "mismatched_keys")}
    if problems:
        raise RuntimeError(f"rebuilding the PAPA model left weights unmatched: {problems}")
    rebuilt.config.architectures = [cls.__name__]
    rebuilt.config.auto_map = auto_map(family)
    rebuilt.papa_recipe = getattr(papa, "papa_recipe", None)
    return rebuilt.to(param.device).eval()


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
