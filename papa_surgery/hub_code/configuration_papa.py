"""``Papa<Family>Config``: the source family's config plus the ``papa_*`` fields of a PAPA checkpoint.

All ``papa_*`` fields are plain JSON (head lists as ``[[layer, head], ...]``) with no file paths. The
config class of a family is built on first use (``papa_config_class``, or by name through this module's
``__getattr__``, which is what ``auto_map`` and unpickling do), so a checkpoint imports only its own
family's transformers module.

This file ships inside every PAPA checkpoint: it imports only transformers and siblings.
"""

from __future__ import annotations

import re
import warnings

import transformers

from .families import FAMILIES, family_for

PAPA_FORMAT_VERSION = 2

# The transformers releases this code is tested against: [floor, ceiling). Older releases are refused (the code
# uses what they lack); newer ones load with a warning, so a published checkpoint keeps working the day a new
# major release ships (scripts/test-newest.sh runs the loading tests on the newest release PyPI serves).
TRANSFORMERS_FLOOR = (5, 0)
TRANSFORMERS_CEILING = (6, 0)
_warned_untested = False

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


def check_transformers_version(version: str | None = None) -> None:
    """Refuse, with the release needed, a transformers older than the floor; warn once about one past the
    tested range (a ``UserWarning``: the checkpoint loads, but nobody has checked its outputs there)."""
    global _warned_untested
    version = version or transformers.__version__
    match = re.match(r"(\d+)\.(\d+)", version)
    found = tuple(int(x) for x in match.groups()) if match else (0, 0)
    floor, ceiling = ".".join(map(str, TRANSFORMERS_FLOOR)), ".".join(map(str, TRANSFORMERS_CEILING))
    if found < TRANSFORMERS_FLOOR:
        raise ImportError(
            f"this PAPA checkpoint needs transformers>={floor}, but transformers {version} is installed: "
            f'pip install -U "transformers>={floor}"'
        )
    if found >= TRANSFORMERS_CEILING and not _warned_untested:
        _warned_untested = True
        warnings.warn(
            f"this PAPA checkpoint's code was tested with transformers>={floor},<{ceiling}; transformers {version} "
            f"is newer: it should load, but if its outputs look wrong, compare with "
            f'pip install "transformers>={floor},<{ceiling}"',
            UserWarning,
            stacklevel=2,
        )


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
        cls.register_for_auto_class("AutoConfig")
        globals()[name] = cls
    return globals()[name]


def __getattr__(name: str):
    # ``auto_map`` and unpickling look config classes up by name: build them on demand.
    for family in FAMILIES.values():
        if name == f"{family.papa_prefix}Config":
            return papa_config_class(family.model_type)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
