"""``papa_recipe.json``: everything needed to redo a conversion (source, corpus, kind, ranking, fraction, versions)."""

from __future__ import annotations

import datetime as _dt
import sys

import torch

from .. import __version__
from ..calibration.constants import Constants
from ..hub_code.configuration_papa import PAPA_FORMAT_VERSION
from ..models.families import get_family, num_heads_layers


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
        **_fitted(constants.metadata),
        "command": command,
        "library_versions": library_versions(),
    }


def _fitted(metadata: dict) -> dict:
    """How trained constants were fitted: ``sharpened`` (each layer's exponent, the objective before and after) or
    ``distilled`` (steps, learning rate, objective, corpus, the loss at the start and the end)."""
    return {
        kind: {k: v for k, v in fit.items() if k != "heads"}
        for kind in ("sharpened", "distilled")
        if (fit := metadata.get(kind))
    }
