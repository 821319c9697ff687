"""Experiments (paper 4, 5): sweeps over tasks, corpora, kinds, methods, fractions and seeds.

``config`` (what a sweep covers), ``artifacts`` (the workflow's cache for a sweep: constants and rankings
kept beside the results), ``jobs`` (how a cell scores its model: :class:`~.jobs.ProbeJob`, the paper's probe,
and :class:`~.jobs.FinetuneJob`), ``sweep`` (cells, resume, rows) and ``results`` (the JSONL results file).
"""

_LAZY = {
    "SweepConfig": "config",
    "parse_fractions": "config",
    "ProbeJob": "jobs",
    "FinetuneJob": "jobs",
    "run_sweep": "sweep",
    "read_rows": "results",
}

__all__ = sorted(_LAZY)


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from importlib import import_module

    return getattr(import_module(f".{_LAZY[name]}", __name__), name)
