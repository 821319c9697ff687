"""Tokenise examples so they fit the slot layout (docs/design.md section 2).

Single sentences are truncated to ``max_length`` tokens as usual. For a pair, each segment must fit its
half of the layout (the middle separator sits at slot L/2), so each segment is cut on its own before the
tokenizer adds its special tokens; a plain ``truncation='longest_first'`` cannot promise that.
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import lru_cache

from transformers import BatchEncoding, PreTrainedTokenizerBase


@lru_cache(maxsize=32)
def _pair_layout(tokenizer: PreTrainedTokenizerBase) -> tuple[int, int, int]:
    """(special tokens before A, separators between A and B, special tokens after B) of a pair."""
    a = tokenizer("a", add_special_tokens=False)["input_ids"]
    b = tokenizer("b", add_special_tokens=False)["input_ids"]
    ids = tokenizer("a", "b")["input_ids"]
    start = _find(ids, a)
    b_start = _find(ids, b, start + len(a))
    return start, b_start - start - len(a), len(ids) - b_start - len(b)


def _find(seq: list[int], sub: list[int], start: int = 0) -> int:
    for i in range(start, len(seq) - len(sub) + 1):
        if seq[i : i + len(sub)] == sub:
            return i
    raise ValueError("could not locate a segment in the tokenizer's pair encoding")


def middle_separators(tokenizer: PreTrainedTokenizerBase) -> int:
    """How many separator tokens sit between the two segments of a pair (BERT 1, RoBERTa 2)."""
    return _pair_layout(tokenizer)[1]


def _cut(tokenizer: PreTrainedTokenizerBase, text: str, budget: int) -> str:
    """``text`` shortened at a token boundary so that it encodes to at most ``budget`` tokens."""
    enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    if len(enc["input_ids"]) <= budget:
        return text
    keep = max(budget, 0)
    while keep > 0:
        cut = text[: enc["offset_mapping"][keep - 1][1]]
        if len(tokenizer(cut, add_special_tokens=False)["input_ids"]) <= budget:
            return cut
        keep -= 1
    return ""


def encode(
    tokenizer: PreTrainedTokenizerBase,
    examples: Sequence[str] | Sequence[tuple[str, str]],
    max_length: int,
    pairs: bool = False,
    return_offsets_mapping: bool = False,
) -> BatchEncoding:
    """Tokenise a batch for the slot layout of ``max_length`` slots, padded to the batch's longest.

    Args:
        tokenizer: the source model's tokenizer.
        examples: strings, or ``(first, second)`` tuples when ``pairs``.
        max_length: L, the slot count.
        pairs: whether examples are sentence pairs.

    Returns:
        A ``BatchEncoding`` of PyTorch tensors.
    """
    if not pairs:
        return tokenizer(
            list(examples),
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
            return_offsets_mapping=return_offsets_mapping,
        )
    before, middle, after = _pair_layout(tokenizer)
    half = max_length // 2
    budget_a = half - before
    budget_b = max_length - half - middle - after
    if budget_a < 1 or budget_b < 1:
        # the smallest L with L // 2 >= before + 1 and L - L // 2 >= middle + after + 1
        need = max(2 * (before + 1), 2 * (middle + after + 1) - 1)
        raise ValueError(f"max_length={max_length} leaves no room for a sentence pair; use at least {need}")
    firsts = [_cut(tokenizer, a, budget_a) for a, _ in examples]
    seconds = [_cut(tokenizer, b, budget_b) for _, b in examples]
    return tokenizer(firsts, seconds, padding=True, return_tensors="pt", return_offsets_mapping=return_offsets_mapping)


def model_inputs(model, enc) -> dict:
    """The entries of ``enc`` that ``model.forward`` accepts (DistilBERT takes no token_type_ids...)."""
    import inspect

    params = inspect.signature(model.forward).parameters
    return {k: v for k, v in enc.items() if k in params and k != "offset_mapping"}
