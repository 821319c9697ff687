"""papa-surgery: replace a pretrained encoder's attention heads with constant matrices (PAPA).

    import papa_surgery

    model, tok = papa_surgery.load("sentence-transformers/all-MiniLM-L6-v2")
    constants = papa_surgery.calibrate(model, tok, max_examples=1000)
    ranking = papa_surgery.rank("variance", constants=constants)
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.5, tokenizer=tok)
    healed = papa_surgery.heal(papa, tok)          # label-free, toward the source, on the default healing corpus
    papa_surgery.save(healed, "minilm-papa-0.5", tokenizer=tok)

The workflow functions (:mod:`papa_surgery.api`) and the ``Constants`` / ``Ranking`` objects load on first
use (PEP 562), so ``import papa_surgery`` and ``papa-surgery --help`` do not import torch.

The package reads top to bottom as the data flows, one subpackage per stage: ``calibration`` (text ->
Constants), ``ranking`` (which heads first), ``conversion`` (-> a PAPA model and its checkpoint), ``healing``
(training it toward its source), ``tasks`` (labelled data and metrics), ``probing`` and ``finetuning`` (the
two protocols), ``experiments`` (sweeps and results), ``report`` and ``analysis``; ``workflow`` runs the
stages for the Python API (``api``) and the command line (``cli``); ``registry`` and ``options`` hold the
facts and options every front end shares; ``hub_code`` is the code shipped inside every checkpoint.
"""

__version__ = "0.1.0"

# name -> the submodule that defines it (imported on first access)
_LAZY = {
    "load": "api",
    "calibrate": "api",
    "rank": "api",
    "convert": "api",
    "save": "api",
    "probe": "api",
    "finetune": "api",
    "analyze": "api",
    "heal": "healing.api",
    "distill": "healing",
    "sharpen": "healing",
    "Constants": "calibration",
    "StructuredConstants": "calibration",
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
