"""Conversion: source model + Constants + constant heads -> a PAPA model, and its checkpoint folder.

The in-memory PAPA model is the class a checkpoint loads (``PapaBertModel`` ...), built by the same
``hub_code`` that ships next to the weights, so what is tested here is what users load.
"""

from __future__ import annotations

import copy
import datetime as _dt
import json
import shutil
import sys
from pathlib import Path

import torch

from . import __version__
from .architectures import get_family, num_heads_layers
from .constants import Constants
from .hub_code.configuration_papa import CONFIG_CLASSES, PAPA_FIELDS, PAPA_FORMAT_VERSION
from .hub_code.modeling_papa import MODEL_CLASSES, apply_papa, attention_modules
from .loading import public_name, resolve_dtype

HUB_CODE_FILES = ("configuration_papa.py", "modeling_papa.py", "papa_attention.py", "slots.py", "families.py")
HUB_CODE_DIR = Path(__file__).parent / "hub_code"


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
):
    """Make a PAPA model: the listed heads attend with constant matrices, the rest is the source.

    Args:
        model: a source model of a supported family and head (it is deep-copied, never changed).
        constants: ``Constants`` for every layer and head of this model (any kind).
        heads: ``[[layer, head], ...]`` to make constant (e.g. ``ranking.select(fraction)``).
        tokenizer: the source tokenizer; its separator id lets the model find a pair's middle.
        kind, method, fraction: provenance written into the config.
        dtype: storage dtype of the constants: fp32 (default), fp16 or bf16.
        trainable_constants: give the constants gradients (the paper's "labeled" matrices).
        source_name: the source's Hub id, for provenance and the compatibility check.

    Returns:
        The PAPA model (``Papa<Class>``), in eval mode. Its query/key weights of constant heads are gone;
        only constant heads store their matrices.
    """
    family = get_family(model)
    num_heads, num_layers = num_heads_layers(model.config)
    source = source_name or getattr(model.config, "_name_or_path", None) or None
    constants.check_compatible(model.config, source)
    heads = normalize_heads(heads, num_layers, num_heads)
    store = resolve_dtype(dtype)
    auto_class = _auto_class_of(model, family)

    papa = copy.deepcopy(model)
    config = papa.config
    config.__class__ = CONFIG_CLASSES[family.model_type]
    sep = getattr(tokenizer, "sep_token_id", None) if tokenizer is not None else getattr(config, "sep_token_id", None)
    fields = {
        "papa_max_length": constants.max_length,
        "papa_constant_heads": heads,
        "papa_sep_token_id": sep,
        "papa_constants_dtype": str(store).replace("torch.", ""),
        "papa_trainable_constants": bool(trainable_constants),
        "papa_kind": kind or constants.kind,
        "papa_method": method,
        "papa_fraction": None if fraction is None else float(fraction),
        "papa_calibrated_on": "pairs" if constants.pairs else "single",
        "papa_source_model": public_name(source),
        "papa_format_version": PAPA_FORMAT_VERSION,
        "papa_surgery_version": __version__,
    }
    assert set(fields) == set(PAPA_FIELDS)
    for name, value in fields.items():
        setattr(config, name, value)
    apply_papa(papa)
    with torch.no_grad():
        for layer, module in enumerate(attention_modules(papa)):
            if module.papa_const:
                values = constants.values[layer, module.papa_const]  # (Hc, L, L)
                module.papa_constants.copy_(values.to(module.papa_constants.device, store))
    papa.__class__ = MODEL_CLASSES[family.model_type][auto_class]
    _register_output_recording(papa)
    config.architectures = [papa.__class__.__name__]
    config.auto_map = auto_map(family)
    return papa.eval()


def _register_output_recording(model) -> None:
    """Let transformers record attentions/hidden states for the swapped-in class.

    transformers registers ``_can_record_outputs`` per class name when a model is constructed; a model whose
    class was switched in place is unknown there and ``output_attentions=True`` would return ``None``.
    """
    try:
        from transformers.utils.output_capturing import _CAN_RECORD_REGISTRY
    except ImportError:  # older transformers record outputs without a registry
        return
    _CAN_RECORD_REGISTRY[model] = model._can_record_outputs


def auto_map(family) -> dict[str, str]:
    """``auto_map`` of a PAPA config: every auto class of the family -> the shipped classes."""
    out = {"AutoConfig": f"configuration_papa.{CONFIG_CLASSES[family.model_type].__name__}"}
    for auto, cls in MODEL_CLASSES[family.model_type].items():
        out[auto] = f"modeling_papa.{cls.__name__}"
    return out


def constant_heads_of(model) -> list[list[int]]:
    """``[[layer, head], ...]`` currently constant in a PAPA model."""
    return [[layer, h] for layer, m in enumerate(attention_modules(model)) for h in getattr(m, "papa_const", [])]


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
        },
        "kind": config.papa_kind,
        "ranking": None if ranking is None else {"method": ranking.method, "provenance": ranking.provenance},
        "method": config.papa_method,
        "fraction": config.papa_fraction,
        "max_length": config.papa_max_length,
        "constants_dtype": config.papa_constants_dtype,
        "constant_heads": config.papa_constant_heads,
        "num_heads_total": heads * layers,
        "coverage": constants.summary().get("coverage"),
        "command": command,
        "library_versions": library_versions(),
    }


def save_checkpoint(
    model,
    out_dir: str | Path,
    tokenizer=None,
    recipe: dict | None = None,
    overwrite: bool = False,
    card: bool = True,
    results=None,
) -> Path:
    """Write a standalone PAPA checkpoint folder, all or nothing.

    The folder is assembled in a hidden staging sibling and moved into place only when complete, with a
    rename that never replaces something this call did not create (``papa_surgery.atomic``): a failure,
    SIGTERM or Ctrl-C leaves no partial output, and a folder that appears at ``out_dir`` meanwhile is kept
    (the error names where the finished checkpoint went). An existing folder is an error unless
    ``overwrite``, which replaces only an earlier checkpoint or an empty folder. ``results`` (a probe results
    JSONL file or rows) adds a results table to the model card.
    """
    from .atomic import staged_dir

    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    if not hasattr(model.config, "papa_constant_heads"):
        raise ValueError("save_checkpoint needs a PAPA model (from papa_surgery.convert.convert)")
    with staged_dir(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        for name in HUB_CODE_FILES:
            shutil.copy2(HUB_CODE_DIR / name, tmp / name)
        if tokenizer is not None:
            tokenizer.save_pretrained(tmp)
        (tmp / "papa_recipe.json").write_text(json.dumps(recipe or {}, indent=2, default=str) + "\n")
        if card:
            from .card import write_card

            write_card(tmp, results=results, command=(recipe or {}).get("command"))
    return out_dir


def check_output_dir(out_dir: str | Path, overwrite: bool = False) -> None:
    """ValueError unless a checkpoint may be written to ``out_dir`` (checked again, atomically, at the end).

    ``overwrite`` replaces an earlier PAPA checkpoint or an empty folder, never anything else (a typo such
    as ``--out .`` must not delete a project).
    """
    out_dir = Path(out_dir)
    if out_dir.is_file():
        raise ValueError(f"--out {str(out_dir)!r} is a file; pass a folder path for the checkpoint")
    if not out_dir.exists():
        return
    if not overwrite:
        raise ValueError(f"output folder {str(out_dir)!r} already exists; pass --overwrite to replace it")
    if any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise ValueError(
            f"--overwrite replaces an earlier checkpoint, but {str(out_dir)!r} is a folder with other content "
            "(no config.json); choose another --out"
        )
