"""``Papa<Family>Config``: the source family's config plus the ``papa_*`` fields of a PAPA checkpoint.

All ``papa_*`` fields are plain JSON (head lists as ``[[layer, head], ...]``) with no file paths.
This file ships inside every PAPA checkpoint: it imports only transformers and siblings.
"""

from __future__ import annotations

from huggingface_hub.dataclasses import strict

from .families import FAMILIES

PAPA_FORMAT_VERSION = 1

# Field -> (type, default). Declared once; every family's config gets the same fields.
PAPA_FIELDS: dict[str, tuple[object, object]] = {
    "papa_max_length": (int, 128),  # L, the number of slots of each constant matrix
    "papa_constant_heads": (list | None, None),  # [[layer, head], ...] made constant
    "papa_sep_token_id": (int | None, None),  # separator that marks a pair's middle (None: no pairs)
    "papa_constants_dtype": (str, "float32"),  # storage dtype of the constants
    "papa_trainable_constants": (bool, False),  # the paper's "labeled" matrices: constants get gradients
    "papa_kind": (str | None, None),  # average, identity, toeplitz, zeros, uniform, ...
    "papa_method": (str | None, None),  # ranking method that chose the heads
    "papa_fraction": (float | None, None),  # share of heads made constant
    "papa_calibrated_on": (str | None, None),  # "single" or "pairs"
    "papa_source_model": (str | None, None),  # Hub id (or folder name) of the source model
    "papa_format_version": (int, PAPA_FORMAT_VERSION),
    "papa_surgery_version": (str | None, None),
}


def _make_config_class(family) -> type:
    base = family.config_class()
    annotations = {name: typ for name, (typ, _) in PAPA_FIELDS.items()}
    attrs = {
        "__module__": __name__,
        "__doc__": f"{base.__name__} with the PAPA fields (constant heads, slot count, provenance).",
        "model_type": family.papa_model_type,
        "__annotations__": annotations,
        **{name: default for name, (_, default) in PAPA_FIELDS.items()},
    }
    return strict(type(f"{family.papa_prefix}Config", (base,), attrs))


CONFIG_CLASSES: dict[str, type] = {}
for _family in FAMILIES.values():
    _cls = _make_config_class(_family)
    CONFIG_CLASSES[_family.model_type] = _cls
    globals()[_cls.__name__] = _cls

__all__ = [cls.__name__ for cls in CONFIG_CLASSES.values()]
