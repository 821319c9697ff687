"""Norm-based attention (Kobayashi et al. 2020) and effective attention (Brunner et al. 2020; Sun & Marasovic 2021).

As analyses (:func:`analyze`: per-head JSON summaries and figures) and as PAPA variants: constant kinds
``norm-average`` and ``effective-average`` (:func:`analysis_constants`) and the score table of the ``norm``
ranking (:func:`norm_scores`; ``papa_surgery.ranking.methods.norm_ranking`` makes the ranking). Analyses
return score tables and never import ``ranking``.
"""

from .effective import effective_attention, effective_attentions
from .norms import attention_norms, norm_weighted, summed_norms, value_norms
from .projections import HeadProjections, head_projections, output_projection_modules
from .streaming import (
    ANALYSIS_KINDS,
    CATEGORIES,
    WHICH,
    AnalysisState,
    analysis_constants,
    effective_constants,
    norm_constants,
    norm_scores,
    stream,
)
from .summary import analyze

__all__ = [
    "ANALYSIS_KINDS",
    "CATEGORIES",
    "WHICH",
    "AnalysisState",
    "HeadProjections",
    "analysis_constants",
    "analyze",
    "attention_norms",
    "effective_attention",
    "effective_attentions",
    "effective_constants",
    "head_projections",
    "norm_constants",
    "norm_scores",
    "norm_weighted",
    "output_projection_modules",
    "stream",
    "summed_norms",
    "value_norms",
]
