"""Library-side view of the architecture table (``hub_code/families.py``, which ships in checkpoints).

Resolves a model or config to its ``Family``, with the error that lists supported architectures, and
reads the head/layer counts every other module needs.
"""

from __future__ import annotations

from ..hub_code.families import FAMILIES, PAPA_MODEL_TYPES, Family, family_for

__all__ = ["FAMILIES", "Family", "family_for", "get_family", "num_heads_layers", "supported_model_types"]


def supported_model_types() -> list[str]:
    """Source ``model_type`` values papa-surgery can convert."""
    return sorted(FAMILIES)


def get_family(model_or_config) -> Family:
    """The family of a model, a config, or a ``model_type`` string (source or PAPA)."""
    if isinstance(model_or_config, str):
        return family_for(model_or_config)
    config = getattr(model_or_config, "config", model_or_config)
    return family_for(getattr(config, "model_type", None))


def num_heads_layers(config) -> tuple[int, int]:
    """(heads per layer, layers) of a supported config."""
    family = get_family(config)
    return int(getattr(config, family.heads_attr)), int(getattr(config, family.layers_attr))


def is_papa_config(config) -> bool:
    """Whether ``config`` is a PAPA checkpoint's config."""
    return getattr(config, "model_type", None) in PAPA_MODEL_TYPES
