"""Conversion: source model + Constants + constant heads -> a PAPA model, and the checkpoint users load.

``surgery`` (build the PAPA model with the shipped ``hub_code``), ``recipe`` (how to redo it),
``checkpoint`` (write the folder, all or nothing), ``st_files`` (a sentence-transformers source's pipeline),
``card`` (the model card), ``inspection`` (what a checkpoint holds: ``papa-surgery inspect``) and ``hub``
(publishing). The names below load on first use, so reading a checkpoint (``inspection``) does not import
the writing side.
"""

_LAZY = {
    "build_papa_model": "surgery",
    "constant_heads_of": "surgery",
    "convert": "surgery",
    "papa_config": "surgery",
    "build_recipe": "recipe",
    "save_checkpoint": "checkpoint",
    "describe": "inspection",
    "push": "hub",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
