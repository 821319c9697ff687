"""Data-free constants (paper 5.2) in the storage their length calls for: O(L) per head when it is compact.

A long L (``--max-length 8192``) then never allocates an (L, L) matrix: a fraction-1 ModernBERT-base's toeplitz
constants at L = 8,192 take about 6 values per slot and head (``kinds.py``: the parts are exact) instead of L^2
(22 x 12 x 8,192^2 floats, 70.9 GB).
"""

from __future__ import annotations

from .constants import Constants
from .structured_constants import StructuredConstants


def data_free_constants(kind: str, num_layers: int, num_heads: int, max_length: int, layout=None, **metadata):
    """Data-free constants of ``kind`` for every layer and head: ``StructuredConstants`` in ``layout`` (a
    ``CompactLayout``: O(L) values per head), dense ``Constants`` when ``layout`` is ``None``."""
    if layout is None:
        return Constants.from_kind(kind, num_layers, num_heads, max_length, **metadata)
    return StructuredConstants.from_kind(kind, num_layers, num_heads, layout, **metadata)
