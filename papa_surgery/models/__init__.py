"""Source models and checkpoints: where MODEL comes from, loading it, and the family table's library view.

``sources`` (the embedded default, Hub ids and folders, public names for recipes), ``loading`` (configs
and weights, with the errors users need) and ``families`` (which family a model is, its head counts).
"""

from .families import get_family, is_papa_config, num_heads_layers, supported_model_types
from .loading import load_config, load_source
from .sources import EMBEDDED_HUB_ID, embedded_model_path, resolve_model

__all__ = [
    "EMBEDDED_HUB_ID",
    "embedded_model_path",
    "get_family",
    "is_papa_config",
    "load_config",
    "load_source",
    "num_heads_layers",
    "resolve_model",
    "supported_model_types",
]
