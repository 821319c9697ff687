"""Streaming corpus averages of norm-weighted and effective attention, in the slot layout of calibration.

One pass over the corpus, like :func:`papa_surgery.calibration.average.calibrate` and with its accumulator (fp64
sums per (layer, head, slot_i, slot_j), examples grouped by slot layout, deterministic scatter):

- ``norm-average``: the average of the norm-weighted matrices alpha_ij ||f_h(x_j)|| (a constant head
  renormalises rows at use time, so only their shape matters); the per-head mean contribution (mean of
  ||alpha f|| over real entries) is stored in ``metadata["contribution"]`` for the ``norm`` ranking.
- ``effective-average``: the average of the signed effective attention A U U^T, clamped at 0 afterwards
  (constants are weights, so cells with a negative average get 0; ``metadata["clipped_negative_mass"]``
  says how much mass that removed, per head, relative to the head's absolute mass).

The per-head ``variance`` is that of the averaged matrices (norm-weighted, or signed effective).
Per-token-category sums (what the analysis figures show) are gathered in the same pass.

Under ``torch.distributed`` each process runs every world_size-th batch (the batches of one process) and
the fp64 sums are all-reduced at the end: the result equals a single process's up to the order of the fp64
additions (a relative difference near 1e-16; calibration itself is bitwise, see ``calibrate.py``).
"""

from __future__ import annotations

import unicodedata
from dataclasses import dataclass, field

import torch

from ..calibration.accumulate import SlotAccumulator, SlotLayout
from ..calibration.constants import ANALYSIS_KINDS, Constants
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow, pass_metadata, process_batches
from ..distributed import shared_failures
from ..hub_code.slots import compute_slots
from ..models.families import num_heads_layers
from .capture import needs_output_attentions, recording
from .effective import DEFAULT_RTOL, layer_effective
from .norms import summed_norms
from .projections import head_projections

WHICH = ("norms", "effective")
# The constant kind each analysis produces (the kinds themselves are declared once, in constants.py).
ANALYSIS_OF_KIND = dict(zip(ANALYSIS_KINDS, ("norms", "effective"), strict=True))
CATEGORIES = ("cls", "sep", "punct", "other")


class TokenCategories:
    """Maps token ids to CATEGORIES indices: [CLS]/<s>, [SEP]/</s>, punctuation-only tokens, the rest."""

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.cls = {t for t in (tokenizer.cls_token_id, tokenizer.bos_token_id) if t is not None}
        self.sep = {t for t in (tokenizer.sep_token_id, tokenizer.eos_token_id) if t is not None} - self.cls
        self._cache: dict[int, int] = {}

    def _category(self, token_id: int) -> int:
        if token_id in self.cls:
            return 0
        if token_id in self.sep:
            return 1
        piece = self.tokenizer.convert_ids_to_tokens(token_id) or ""
        piece = piece.removeprefix("##").lstrip("\u0120\u2581")  # WordPiece, byte-level BPE, SentencePiece
        if piece and all(unicodedata.category(ch).startswith("P") or ch in "$+<=>^`|~" for ch in piece):
            return 2
        return 3

    def onehot(self, input_ids: torch.Tensor, real: torch.Tensor, dtype=torch.float64) -> torch.Tensor:
        """(B, N) ids -> (B, N, C) one-hot categories, zero rows for padding."""
        ids = input_ids.tolist()
        cats = [[self._cache.setdefault(t, self._category(t)) for t in row] for row in ids]
        out = torch.nn.functional.one_hot(torch.tensor(cats, device=input_ids.device), len(CATEGORIES))
        return out.to(dtype) * real[..., None].to(dtype)


@dataclass
class AnalysisState:
    """What one streaming pass gathered (float64 sums; see :func:`stream`)."""

    which: str
    max_length: int
    pairs: bool
    main: SlotAccumulator  # norm-weighted or effective matrices
    attention: SlotAccumulator | None  # plain A, for side-by-side heat maps
    # Per layer/head, summed over examples and real query rows i, per category of the attended token j.
    cat_attention: torch.Tensor | None = None  # (layers, heads, C) sum of alpha
    cat_main: torch.Tensor | None = None  # (layers, heads, C) sum of ||alpha f|| or of effective attention
    cat_summed: torch.Tensor | None = None  # (layers, C) sum of ||sum_h alpha f_h|| (norms only)
    rows: float = 0.0  # real query rows seen (sum of example lengths)
    rank_sum: torch.Tensor | None = None  # (layers, heads) sum over examples of rank(T) (effective only)
    metadata: dict = field(default_factory=dict)

    @property
    def examples(self) -> int:
        return self.main.examples

    def contribution(self) -> torch.Tensor:
        """(layers, heads) mean of the main quantity over every real (i, j) entry of the corpus."""
        return self.main.sums.sum(-1).cpu() / self.main.counts.sum().clamp_min(1.0).cpu()

    def constants(self) -> Constants:
        """``Constants`` of kind ``norm-average`` or ``effective-average``."""
        values, counts, variance = self.main.result()
        meta = dict(self.metadata)
        if self.which == "norms":
            kind = "norm-average"
            meta["contribution"] = self.contribution().tolist()
            meta["contribution_definition"] = "mean of ||alpha_ij f_h(x_j)|| over real (i, j) entries"
        else:
            kind = "effective-average"
            negative = values.clamp_max(0).abs().sum((-1, -2))
            total = values.abs().sum((-1, -2)).clamp_min(1e-30)
            meta["clipped_negative_mass"] = (negative / total).tolist()
            values = values.clamp_min(0)
        meta["variance_of"] = "norm-weighted attention" if self.which == "norms" else "signed effective attention"
        return Constants(values, kind, self.max_length, self.pairs, counts, variance, meta).fill()


@torch.no_grad()
def stream(
    model,
    tokenizer,
    corpus,
    which: str,
    max_length: int = 128,
    pairs: bool = False,
    batch_size: int = 32,
    device=None,
    progress: bool = True,
    max_examples: int | None = None,
    source_name: str | None = None,
    with_attention: bool = False,
    with_categories: bool = False,
    rtol: float = DEFAULT_RTOL,
) -> AnalysisState:
    """One pass over ``corpus`` accumulating ``which`` ("norms" or "effective") in the slot layout.

    Args mirror :func:`papa_surgery.calibration.average.calibrate`; ``with_attention`` also averages plain A (as
    calibration does), ``with_categories`` gathers the per-token-category sums, ``rtol`` is the rank
    tolerance of effective attention.
    """
    if which not in WHICH:
        raise ValueError(f"unknown analysis {which!r}; choose one of {', '.join(WHICH)}")
    corpus = load_corpus(corpus, pairs=pairs, max_examples=max_examples)
    num_heads, num_layers = num_heads_layers(model.config)
    device, restore = borrow(model, device)
    try:
        distributed = torch.distributed.is_available() and torch.distributed.is_initialized()

        state = AnalysisState(
            which,
            max_length,
            pairs,
            SlotAccumulator(num_layers, num_heads, max_length, device),
            SlotAccumulator(num_layers, num_heads, max_length, device, squares=False) if with_attention else None,
        )
        cats = TokenCategories(tokenizer) if with_categories else None
        if with_categories:
            shape = (num_layers, num_heads, len(CATEGORIES))
            state.cat_attention = torch.zeros(shape, dtype=torch.float64, device=device)
            state.cat_main = torch.zeros(shape, dtype=torch.float64, device=device)
            if which == "norms":
                state.cat_summed = torch.zeros(num_layers, len(CATEGORIES), dtype=torch.float64, device=device)
        if which == "effective":
            state.rank_sum = torch.zeros(num_layers, num_heads, dtype=torch.float64, device=device)
        projections = [
            p.to(torch.float64 if which == "effective" else torch.float32, device) for p in head_projections(model)
        ]
        factors = [p.output_factor() for p in projections] if which == "effective" else None
        batch: dict = {}

        def on_layer(layer, x, probs):
            real, cells, onehot = batch["real"], batch["cells"], batch.get("onehot")
            part = cells.gather(probs)  # (H, cells) float64: A at the real entries
            if state.attention is not None:
                state.attention.add_gathered(layer, part)
            proj = projections[layer]
            if which == "norms":
                norms = proj.value_norms(x.float())  # (B, H, N) ||f_h(x_j)||, without forming f
                state.main.add_gathered(layer, part * cells.gather_columns(norms))
            else:
                eff, r = layer_effective(probs, x, proj, real, rtol, factor=factors[layer])  # (B, H, N, N) float64
                state.rank_sum[layer] += r.sum(0)
                state.main.add_gathered(layer, cells.gather(eff))
            if onehot is None:
                return
            rows = real.to(probs.dtype)[:, None, None, :]  # (B, 1, 1, N)
            column = (rows @ probs).squeeze(-2)  # (B, H, N): sum over real query rows i of A_ij
            state.cat_attention[layer] += torch.einsum("bhn,bnc->hc", column.double(), onehot)
            if which == "norms":
                state.cat_main[layer] += torch.einsum("bhn,bnc->hc", (column * norms).double(), onehot)
                summed = summed_norms(probs.float(), proj.gram(x.float()), real)  # (B, N, N)
                state.cat_summed[layer] += torch.einsum("bn,bnc->c", summed.sum(1).double(), onehot)
            else:
                state.cat_main[layer] += torch.einsum("bhn,bnc->hc", eff.sum(-2), onehot)

        bar, world = process_batches(corpus, batch_size, f"analyze {which}", progress)
        # shared_failures: a rank that fails in its batches makes the others raise before the all-reduces
        with recording(model, on_layer), shared_failures():
            for examples in bar:
                enc = encode(tokenizer, examples, max_length, pairs=pairs).to(device)
                slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)
                layout = SlotLayout(slots, max_length)
                batch["cells"] = state.main.start_batch(layout)
                if state.attention is not None:
                    state.attention.start_batch(layout, batch["cells"])
                batch["real"] = enc["attention_mask"].bool()
                state.rows += float(batch["real"].sum())
                if cats is not None:
                    batch["onehot"] = cats.onehot(enc["input_ids"], batch["real"])
                model(**model_inputs(model, enc), output_attentions=needs_output_attentions(model))
        for acc in (state.main, state.attention):
            if acc is not None:
                acc.reduce()
        if distributed:
            for t in (state.cat_attention, state.cat_main, state.cat_summed, state.rank_sum):
                if t is not None:
                    torch.distributed.all_reduce(t)
            rows = torch.tensor([state.rows], dtype=torch.float64, device=device)
            torch.distributed.all_reduce(rows)
            state.rows = float(rows.item())
    finally:
        restore()
    if state.examples == 0:
        raise ValueError(f"the corpus {corpus.description} gave no examples to analyze")
    state.metadata = pass_metadata(model, corpus, state.examples, batch_size, world, source_name)
    state.metadata["analysis"] = which
    if which == "effective":
        state.metadata["rank_rtol"] = rtol
    return state


def analysis_constants(kind: str, model, tokenizer, corpus, **kwargs) -> Constants:
    """Constants of an analysis kind (``norm-average`` or ``effective-average``), like ``calibrate``.

    ``kwargs`` are :func:`stream`'s (max_length, pairs, batch_size, device, progress, max_examples, source_name).
    """
    if kind not in ANALYSIS_OF_KIND:
        raise ValueError(f"unknown analysis kind {kind!r}; choose one of {', '.join(ANALYSIS_OF_KIND)}")
    return stream(model, tokenizer, corpus, ANALYSIS_OF_KIND[kind], **kwargs).constants()


def norm_constants(model, tokenizer, corpus, **kwargs) -> Constants:
    """``norm-average`` constants (see :func:`analysis_constants`)."""
    return analysis_constants("norm-average", model, tokenizer, corpus, **kwargs)


def effective_constants(model, tokenizer, corpus, **kwargs) -> Constants:
    """``effective-average`` constants (see :func:`analysis_constants`)."""
    return analysis_constants("effective-average", model, tokenizer, corpus, **kwargs)


def norm_scores(
    constants: Constants | None = None, *, model=None, tokenizer=None, corpus=None, **kwargs
) -> tuple[list[list[float]], dict]:
    """Per-head mean contribution ||alpha f|| (Kobayashi et al. 2020): the score table of the ``norm`` ranking.

    Args:
        constants: ``norm-average`` constants (their ``metadata["contribution"]`` holds the scores); when
            ``None`` or of another kind, ``model``, ``tokenizer`` and ``corpus`` run a norm pass instead.
        kwargs: passed to :func:`stream` (max_length, batch_size, max_examples, progress, ...).

    Returns:
        ``(scores, metadata)``: a (layers, heads) nested list and the provenance of the pass (corpus, examples,
        source model).
    """
    meta = {} if constants is None else constants.metadata
    if "contribution" in meta:
        return meta["contribution"], meta
    if model is None or tokenizer is None or corpus is None:
        raise ValueError(
            "the norm ranking needs norm-average constants (papa-surgery calibrate --kind norm-average) or a "
            "model, tokenizer and corpus to measure head contributions on"
        )
    state = stream(model, tokenizer, corpus, "norms", **kwargs)
    return state.contribution().tolist(), state.metadata
