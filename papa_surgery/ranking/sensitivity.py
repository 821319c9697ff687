"""The ``sensitivity`` ranking: each head made constant alone, measured on the source over an unlabelled corpus.

A head's score is how far making it (and no other) constant moves the model's sentence embeddings on the corpus's
first ``max_examples`` examples: the mean of ``1 - cos(embedding_papa, embedding_source)``. The embeddings are the
ones the source's sentence-transformers files make (its pooling, CLS or mean or another, and any Dense layers:
:mod:`papa_surgery.healing.sentence`, as healing reads them), and the last hidden states mean-pooled over the real
tokens for a source without them. Heads that move them least are made constant first. Label-free,
like ``variance``; where ``variance`` asks how much a head's attention varies, this asks what replacing it costs the
output, which is what a user of the converted model reads (issue 32: all-MiniLM-L6-v2 at fraction 0.5 on SST-2 dev,
sentence cosine to the source 0.959 against variance's 0.916; docs/kinds-ranking.md).

One head at a time runs on the lambda-mixed model (:func:`papa_surgery.ranking.lambdas.lambda_model`: every head
mixes its attention with its constant matrix): lambda 0 for the measured head, 1 for every other, so no model is
converted or copied per head. That equals converting the one head (tested against ``convert``). The layers below
the measured head's are the source's, so what they return is kept and they are not run again: a head of layer l runs
layers l to n - 1 only, (n + 1) / 2 of a model's n layers on average, about half a forward pass over the examples.
The examples are batched by their length in tokens, with little padding (:func:`_snug_batches`): every head runs over
every batch, so padding would be paid once per head.
"""

from __future__ import annotations

import logging

import torch

from .. import __version__
from ..calibration.budget import check_dense_fits
from ..calibration.corpus import load_corpus
from ..calibration.encoding import encode, model_inputs
from ..calibration.passes import borrow
from ..calibration.protocol import ConstantsBase as Constants
from ..failures import spell
from ..healing.agreement import mean_pooled
from ..healing.blocks import returned_by, skipped
from ..healing.sentence import sentence_pipeline
from ..healing.trainable import layer_modules
from ..models.loading import public_name
from .lambdas import lambda_model, set_lambda_logits
from .order import Ranking, order_by_scores

logger = logging.getLogger(__name__)
SCORE = "mean 1 - cos(sentence embeddings, the source's) over the corpus, the head alone constant"
# all-mpnet-base-v2: 32 WikiText lines gave the order measured in docs/kinds-ranking.md (all-MiniLM-L6-v2 measured
# with 32 and 64); every head runs over all of them, so the cost grows with their number.
DEFAULT_EXAMPLES = 32
# Bytes per (layer, head, i, j) cell while measuring: the dense copy of the constants, the mixed model's float32
# buffer and its masked, row-normalised matrix in a forward pass.
MIXED_BYTES = 16
# How much padding a batch may hold: its examples padded to its longest take at most this times their real tokens.
SLACK = 1.25
# A logit this large is a lambda of exactly 1 in float32 (and 4e-18 at its negative): the head attends as the
# source's, or with its constant matrix alone.
_SATURATED = 40.0


@torch.no_grad()
def sensitivity_scores(
    model,
    tokenizer,
    corpus,
    constants: Constants,
    *,
    max_examples: int = DEFAULT_EXAMPLES,
    batch_size: int = 16,
    device=None,
    progress: bool = True,
    pipeline_source=None,
    source_name=None,
) -> tuple[torch.Tensor, dict]:
    """(layers, heads) score of each head made constant alone (module docstring), and what it was measured on.

    Args:
        model: the source model (never changed).
        tokenizer: its tokenizer.
        corpus: unlabelled text (anything :func:`papa_surgery.calibration.load_corpus` accepts); its first
            ``max_examples`` examples are measured on.
        constants: the constants the heads would be made constant with (usually the ``average``).
        batch_size: examples per forward pass.
        device: where to run (default: the model's device).
        progress: a progress bar over the heads.
        pipeline_source: the folder or Hub id whose sentence-transformers files make the embeddings (default: the
            model's own, ``model.config._name_or_path``); mean pooling where it has none.
        source_name: what the source is called in the result (its Hub id; default: the pipeline source's name).

    Raises:
        ValueError: the corpus gives no example, or ``max_examples`` is not a positive integer.
    """
    from tqdm.auto import tqdm

    if isinstance(max_examples, bool) or not isinstance(max_examples, int) or max_examples < 1:
        raise ValueError(f"max_examples: must be a positive integer, got {max_examples!r}")
    corpus = load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
    if corpus.pairs != constants.pairs:  # an opened corpus keeps what it was opened as
        held = {True: "sentence pairs", False: "single sentences"}
        raise ValueError(
            f"the corpus {corpus.description} holds {held[corpus.pairs]} and the constants were calibrated on "
            f"{held[constants.pairs]}: rank on a corpus like the calibration's"
        )
    examples = list(corpus)
    if not examples:
        raise ValueError(f"the corpus {corpus.description} gave no examples to measure the heads on")
    layers, heads = constants.num_layers, constants.num_heads
    check_fits((layers, heads), int(constants.max_length))
    device, restore = borrow(model, device)
    try:
        files = pipeline_source or getattr(model.config, "_name_or_path", None)  # the sentence-transformers files
        embed, embedding = _embedding(files, source_name or public_name(files))
        mixed = lambda_model(model, constants, tokenizer).to(device)
        set_lambda_logits(mixed, _SATURATED)  # every head as the source's
        blocks = layer_modules(mixed)
        batches = []  # [(inputs, mask, the source's (B, E) sentence embeddings)]
        for batch in _snug_batches(tokenizer, examples, constants, batch_size):
            enc = encode(tokenizer, batch, constants.max_length, pairs=constants.pairs)
            inputs = {k: v.to(device) for k, v in model_inputs(model, enc).items()}
            mask = inputs["attention_mask"]
            source = getattr(model, "base_model", model)(**inputs).last_hidden_state.float()  # any task head
            batches.append((inputs, mask, embed(source, mask)))  # (B, E) the source's sentence embeddings
        scores = torch.zeros(layers, heads)
        bar = tqdm(total=layers * heads, desc="sensitivity", unit="head", disable=not progress)
        below = None  # what block layer - 1 returns on each batch, every head as the source's
        for layer in range(layers):
            for head in range(heads):
                logits = torch.full((layers, heads), _SATURATED)
                logits[layer, head] = -_SATURATED  # this head attends with its constant matrix, every other as before
                set_lambda_logits(mixed, logits)
                scores[layer, head] = _moved(mixed, embed, batches, blocks[:layer], below) / len(examples)
                bar.update()
            set_lambda_logits(mixed, _SATURATED)  # the layers below the next one need not run again
            below = returned_by(mixed, blocks, [inputs for inputs, _, _ in batches], layer, layer - 1, below)
        bar.close()
    finally:
        restore()
    meta = {
        "corpus": corpus.description,
        "examples": len(examples),
        "max_length": int(constants.max_length),
        "embedding": embedding,
    }
    return scores, meta


def _snug_batches(tokenizer, examples: list, constants: Constants, batch_size: int) -> list[list]:
    """``examples`` in batches of at most ``batch_size``, sorted by their length in tokens and cut wherever padding the
    batch to its longest would spend more than ``SLACK`` times its real tokens. Every head runs over every batch, so
    padding is paid once per head: a corpus's first lines vary (the default corpus's first 32 run from 14 to 92
    tokens), and one batch of 32 padded to 92 tokens ran three times the tokens these hold."""
    lengths = [
        encode(tokenizer, [e], constants.max_length, pairs=constants.pairs)["input_ids"].shape[1] for e in examples
    ]
    batches: list[list] = []
    held = 0  # real tokens of the batch being filled
    for i in sorted(range(len(examples)), key=lambda i: lengths[i]):  # stable: ties in the corpus's order
        n = lengths[i]  # the batch's longest, the examples coming shortest first
        fits = batches and len(batches[-1]) < batch_size and (len(batches[-1]) + 1) * n <= SLACK * (held + n)
        if not fits:
            batches.append([])
            held = 0
        batches[-1].append(examples[i])
        held += n
    return batches


def check_fits(shape: tuple[int, int], max_length: int, command: str = "rank") -> None:
    """ValueError, before anything is calibrated or allocated, when measuring a model of ``shape`` (layers, heads per
    layer) at ``max_length`` slots would not fit this machine's memory (every head mixes a dense (L, L) matrix)."""
    smaller = spell("max_length").removesuffix("=...")
    check_dense_fits(
        "the sensitivity ranking (it mixes every head with a dense constant matrix)",
        shape[0] * shape[1],
        max_length,
        MIXED_BYTES,
        f"{command} with {spell('method', 'variance')} (it reads the compact constants), or at a smaller {smaller}",
    )


def _embedding(source, name):
    """``(embed, what it is)``: ``embed(hidden (B, N, D), mask (B, N)) -> (B, E)`` sentence embeddings, made by
    ``source``'s sentence-transformers pipeline, else by mean pooling (logged, with why); ``name``: the source's, in
    what it is."""
    pipeline, why_not = sentence_pipeline(source)
    if pipeline is None:
        logger.info("sensitivity: mean pooling: %s", why_not)
        return mean_pooled, f"mean pooling ({name or 'the model'}: no sentence-transformers pipeline)"
    return pipeline, f"{pipeline.describe()} (the sentence-transformers files of {name})"


def _moved(mixed, embed, batches, below_blocks, below) -> float:
    """Sum over the examples of ``1 - cos`` between ``mixed``'s sentence embeddings (``embed``) and the source's, the
    blocks ``below_blocks`` skipped (returning ``below[b]`` on batch ``b``)."""
    moved = 0.0
    for b, (inputs, mask, reference) in enumerate(batches):
        with skipped(below_blocks, below[b] if below else None):
            pooled = embed(mixed(**inputs).last_hidden_state.float(), mask)  # (B, E)
        moved += float((1 - torch.nn.functional.cosine_similarity(pooled, reference, dim=-1)).sum())
    return moved


def sensitivity_ranking(model, tokenizer, corpus, constants: Constants, *, source_name=None, **options) -> Ranking:
    """Ranking ``sensitivity``: the heads whose replacement alone moves the sentence embeddings least come first.

    ``options``: :func:`sensitivity_scores`' (max_examples, batch_size, device, progress).
    """
    scores, meta = sensitivity_scores(model, tokenizer, corpus, constants, source_name=source_name, **options)
    order, ordered = order_by_scores(scores.tolist(), ascending=True)
    prov = {
        "papa_surgery_version": __version__,
        "score": SCORE,
        "constants_kind": constants.kind,
        **meta,
        "source_model": public_name(source_name or getattr(model.config, "_name_or_path", None) or None),
    }
    return Ranking("sensitivity", order, constants.num_layers, constants.num_heads, ordered, prov)
