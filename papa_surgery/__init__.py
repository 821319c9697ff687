"""papa-surgery: replace a pretrained encoder's attention heads with constant matrices (PAPA).

    import papa_surgery

    model, tok = papa_surgery.load("sentence-transformers/all-MiniLM-L6-v2")
    constants = papa_surgery.calibrate(model, tok, max_examples=1000)
    ranking = papa_surgery.rank("variance", constants=constants)
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.5, tokenizer=tok)
    papa_surgery.save(papa, "minilm-papa-0.5", tokenizer=tok)

The workflow (:mod:`papa_surgery.api`) and the ``Constants`` / ``Ranking`` objects load on first use
(PEP 562), so ``import papa_surgery`` and ``papa-surgery --help`` do not import torch.

``papa_surgery.calibrate``, ``convert``, ``probe`` and ``finetune`` are the workflow functions;
the modules of the same names stay importable as ever (``from papa_surgery.convert import save_checkpoint``).
"""

import sys
import types

__version__ = "0.1.0"

# name -> the submodule that defines it (imported on first access)
_LAZY = {
    "load": "api",
    "calibrate": "api",
    "distill": "distill",
    "rank": "api",
    "convert": "api",
    "save": "api",
    "probe": "api",
    "finetune": "api",
    "analyze": "api",
    "Constants": "constants",
    "Ranking": "ranking",
}

__all__ = ["__version__", *_LAZY]


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    value = getattr(import_module(f".{_LAZY[name]}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


class _Package(types.ModuleType):
    """Keeps the workflow functions ``calibrate``, ``convert``, ``probe`` and ``finetune`` the package's attributes
    when the submodules of the same names are imported (the import system would otherwise bind the modules here)."""

    def __setattr__(self, name: str, value) -> None:
        if name in _LAZY and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
