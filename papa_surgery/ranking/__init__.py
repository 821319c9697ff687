"""Ranking (paper 3.2, 5.4): every head in the order it is made constant.

``order`` (the :class:`Ranking` object and its file), ``methods`` (the label-free methods and the dispatch)
and ``lambdas`` (the paper's learned lambda per head). The registry (:mod:`papa_surgery.registry`) says what
each method needs.
"""

from .methods import label_free_ranking, norm_ranking, rank_heads
from .order import Ranking, head_count, reversed_ranking

__all__ = ["Ranking", "head_count", "label_free_ranking", "norm_ranking", "rank_heads", "reversed_ranking"]
