"""The number of slots L a run uses when none is given: the length the source model itself uses.

A converted model refuses inputs longer than L, and its sentence-transformers pipeline truncates at L. So the
drop-in default is the source's own length (a sentence-transformers model's ``max_seq_length``, else its
tokenizer's ``model_max_length``), kept within its position embeddings: the checkpoint then truncates where its
source did, and at fraction 0 it is its source, for every input the source takes.
"""

from __future__ import annotations

from dataclasses import dataclass

NO_LIMIT = 10**9  # tokenizers without a length say model_max_length = int(1e30)
FALLBACK = 512  # neither the tokenizer nor the positions say: BERT's length


@dataclass(frozen=True)
class SourceLength:
    """The length a source model uses, and where that number comes from (for messages and the recipe)."""

    length: int
    origin: str

    def as_dict(self) -> dict:
        return {"length": self.length, "from": self.origin}


def source_length(config, tokenizer=None, source=None) -> SourceLength:
    """The length the source model uses, within its position limit.

    Args:
        config: the source's config (its position limit).
        tokenizer: its tokenizer (``model_max_length``; ``name_or_path`` finds sentence-transformers files).
        source: the source's folder or Hub id when it is not the tokenizer's ``name_or_path``.
    """
    from ..conversion.st_files import sentence_transformers_max_length
    from ..models.loading import position_limit

    limit = position_limit(config)
    st_length = sentence_transformers_max_length(source or getattr(tokenizer, "name_or_path", None))
    tok_length = getattr(tokenizer, "model_max_length", None)
    if st_length:
        length, origin = st_length, "the sentence-transformers max_seq_length"
    elif isinstance(tok_length, int) and 0 < tok_length < NO_LIMIT:
        length, origin = tok_length, "the tokenizer's model_max_length"
    elif limit is not None:
        return SourceLength(limit, "the position embeddings")
    else:
        return SourceLength(FALLBACK, "no length recorded (the tokenizer has none, positions are relative)")
    if limit is not None and length > limit:
        return SourceLength(limit, f"{origin} ({length}), within the {limit} position embeddings")
    return SourceLength(int(length), origin)
