"""``Papa<Family>Config``: the source family's config plus the ``papa_*`` fields of a PAPA checkpoint.

All ``papa_*`` fields are plain JSON (head lists as ``[[layer, head], ...]``) with no file paths. The
config class of a family is built on first use (``papa_config_class``, or by name through this module's
``__getattr__``, which is what ``auto_map`` and unpickling do), so a checkpoint imports only its own
family's transformers module.

This file ships inside every PAPA checkpoint: it imports only its siblings (transformers through them).
"""

from __future__ import annotations

from .checkpoint_format import FORMAT_VERSION, read_papa_fields
from .compat import TRANSFORMERS_CEILING, TRANSFORMERS_FLOOR, check_transformers_version
from .families import FAMILIES, family_for

PAPA_FORMAT_VERSION = FORMAT_VERSION  # the format this code writes (checkpoint_format.py holds the format facts)
__all__ = ["PAPA_FIELDS", "PAPA_FORMAT_VERSION", "TRANSFORMERS_CEILING", "TRANSFORMERS_FLOOR", "papa_config_class"]

# Field -> (type, default). Declared once; every family's config gets the same fields. On transformers
# releases whose configs are dataclasses they become dataclass fields; on older ones, class defaults.
PAPA_FIELDS: dict[str, tuple[object, object]] = {
    "papa_max_length": (int, 128),  # L, the number of slots of each constant matrix
    "papa_constant_heads": (list | None, None),  # [[layer, head], ...] made constant
    "papa_sep_token_id": (int | None, None),  # separator that marks a pair's middle (None: no pairs)
    "papa_constants_dtype": (str, "float32"),  # storage dtype of the constants
    "papa_compact_band": (int | None, None),  # compact constants: diagonals stored exactly (None: dense)
    "papa_compact_rank": (int | None, None),  # compact constants: rank of the residual off the band
    "papa_trainable_constants": (bool, False),  # the paper's "labeled" matrices: constants get gradients
    "papa_lambda_mixing": (bool, False),  # lambda training: every head attends and has a constant (never saved)
    "papa_kind": (str | None, None),  # average, identity, toeplitz, zeros, uniform, ...
    "papa_method": (str | None, None),  # ranking method that chose the heads
    "papa_fraction": (float | None, None),  # share of heads made constant
    "papa_calibrated_on": (str | None, None),  # "single" or "pairs"
    "papa_source_model": (str | None, None),  # Hub id of the source model ("local model" when it has none)
    "papa_linear_names": (dict | None, None),  # per-head Linear name -> layers that still have it (LoRA)
    "papa_format_version": (int, PAPA_FORMAT_VERSION),
    "papa_surgery_version": (str | None, None),
}


check_transformers_version()


def papa_config_class(model_type: str) -> type:
    """``Papa<Family>Config`` for a source or PAPA ``model_type``, built on first use."""
    family = family_for(model_type)
    name = f"{family.papa_prefix}Config"
    if name not in globals():
        base = family.config_class()
        attrs = {
            "__module__": __name__,
            "__doc__": f"{base.__name__} with the PAPA fields (constant heads, slot count, provenance).",
            "model_type": family.papa_model_type,
            "__annotations__": {field: typ for field, (typ, _) in PAPA_FIELDS.items()},
            **{field: default for field, (_, default) in PAPA_FIELDS.items()},
        }
        cls = type(name, (base,), attrs)
        cls.from_dict = _gated_from_dict(cls)
        cls.register_for_auto_class("AutoConfig")
        globals()[name] = cls
    return globals()[name]


def _gated_from_dict(papa_class: type):
    """``from_dict`` of ``papa_class``: the family config's (how every saved config is read, by ``from_pretrained``
    and the auto classes) behind the format gate (``checkpoint_format.py``): a newer format is refused, a missing
    version is the oldest, unknown ``papa_*`` fields are named in one warning and dropped."""

    def from_dict(cls, config_dict: dict, **kwargs):
        """The family config's ``from_dict`` behind the PAPA format gate (``checkpoint_format.py``)."""
        return super(papa_class, cls).from_dict(read_papa_fields(config_dict, PAPA_FIELDS), **kwargs)

    return classmethod(from_dict)


def __getattr__(name: str):
    # ``auto_map`` and unpickling look config classes up by name: build them on demand.
    for family in FAMILIES.values():
        if name == f"{family.papa_prefix}Config":
            return papa_config_class(family.model_type)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
