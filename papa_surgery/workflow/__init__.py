"""The one workflow, calibrate -> rank -> convert -> save, that the Python API, the CLI and sweeps all call.

``steps`` (:class:`Workflow`: the steps on a loaded source model, with a cache), ``jobs`` (whole CLI jobs from
names to files), ``analysis_job`` (the norm and effective-attention analyses, to a folder), ``preflight`` (the checks
a job runs before its first expensive step) and ``corpora`` (the corpus a step reads).
"""

from .corpora import open_corpus, open_healing_corpus
from .steps import Cache, Workflow

__all__ = ["Cache", "Workflow", "open_corpus", "open_healing_corpus"]
