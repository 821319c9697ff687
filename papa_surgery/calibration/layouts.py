"""The corpus's slot layouts, known before any forward pass: per-cell counts without an (L, L) count matrix.

Every example occupies a set of slots that is a few runs of consecutive slots (the first segment from slot 0, a
pair's second segment from its middle separator, the final separator at L-1). The number of examples that reach
cell (i, j) is ``counts[i, j] = sum_u m_u o_u[i] o_u[j]`` over the corpus's distinct layouts u (occupancy o_u,
multiplicity m_u). Structured calibration needs those counts *before* it sees an example's attention, so it can
add each example's ``A / counts`` straight into its sketches (the per-cell mean is then a plain sum); one quick
tokenizer-only pass over the corpus (:func:`scan_layouts`) records the layouts. Memory is O(U * runs), U the
number of distinct layouts (at most L for single sentences).
"""

from __future__ import annotations

import torch
from tqdm.auto import tqdm

from ..hub_code.slots import compute_slots
from .encoding import encode


def runs_of(slots: torch.Tensor) -> tuple[tuple[int, int], ...]:
    """The runs ``(start, end)`` (end exclusive) of consecutive slots in one example's increasing slots (n,)."""
    s = slots[slots >= 0].tolist()
    out, start = [], None
    for a, b in zip(s, s[1:] + [None], strict=True):
        start = a if start is None else start
        if b is None or b != a + 1:
            out.append((start, a + 1))
            start = None
    return tuple(out)


class CorpusLayouts:
    """The distinct slot layouts of a corpus with their multiplicities.

    Args:
        layouts: ``{runs: examples}``, runs as from :func:`runs_of`.
        max_length: L.
    """

    def __init__(self, layouts: dict[tuple[tuple[int, int], ...], int], max_length: int, batch_tokens=None):
        self.max_length = max_length
        self.batch_tokens = batch_tokens  # the real tokens of each batch of the scan, in order (progress bars)
        keys = sorted(layouts)  # a fixed order: the counts are sums in this order on every process
        width = max((len(k) for k in keys), default=1)
        self.starts = torch.zeros(len(keys), width, dtype=torch.long)  # (U, K), empty runs pad as [0, 0)
        self.ends = torch.zeros_like(self.starts)
        for u, runs in enumerate(keys):
            for k, (a, b) in enumerate(runs):
                self.starts[u, k], self.ends[u, k] = a, b
        self.multiplicity = torch.tensor([float(layouts[k]) for k in keys], dtype=torch.float64)  # (U,)
        self.examples = int(self.multiplicity.sum())

    def occupancy(self, slots: torch.Tensor) -> torch.Tensor:
        """(U, n) float64: whether each layout occupies each of ``slots`` (n,)."""
        s = slots.to("cpu")[None, None, :]  # (1, 1, n)
        inside = (self.starts[:, :, None] <= s) & (s < self.ends[:, :, None])  # (U, K, n)
        return inside.any(1).double()

    def counts_at(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """(len(rows), len(cols)) float64: how many examples reach each cell (rows[a], cols[b]); exact integers."""
        left = self.occupancy(rows) * self.multiplicity[:, None]  # (U, c)
        return left.transpose(0, 1) @ self.occupancy(cols)  # (c, n)


def scan_layouts(corpus, tokenizer, max_length: int, pairs: bool, batch_size: int, progress: bool = True):
    """:class:`CorpusLayouts` of ``corpus`` as calibration encodes it (the tokenizer only, no model)."""
    from .passes import _batches

    layouts: dict[tuple[tuple[int, int], ...], int] = {}
    tokens = []
    for batch in tqdm(_batches(corpus, batch_size), desc="slot layouts", unit="batch", disable=not progress):
        enc = encode(tokenizer, batch, max_length, pairs=pairs)
        slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)  # (B, N)
        tokens.append(int((slots >= 0).sum()))
        for row in slots:
            runs = runs_of(row)
            layouts[runs] = layouts.get(runs, 0) + 1
    return CorpusLayouts(layouts, max_length, tokens)
