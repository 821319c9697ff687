"""What healing minimises: how far the converted model's outputs are from its source's on the same batch.

Two terms, label-free (the source's own outputs are the targets):

- **hidden states** (``layers``: every layer's, ``last``: the last layer's only): the mean squared error over real
  tokens, divided by the source's variance at that layer, so each layer weighs alike whatever its scale; with
  ``layers`` every layer gets a direct signal, not only the gradient that survives the layers above it;
- **sentence embedding** (``embedding``): ``1 - cos`` between the two models' sentence embeddings made by the
  source's sentence-transformers pipeline (:mod:`.sentence`: its pooling, Dense layers and normalisation), i.e.
  what ``SentenceTransformer.encode`` returns, averaged over the batch.

``auto`` (the default) is ``layers+embedding`` for a sentence-transformers source and ``layers`` otherwise.

Under ``torch.distributed`` each process computes its share of the loss of the global batch (token and example
counts, and the targets' variance, are those of all processes' batches together), so summed gradients equal a
single process's on the whole batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..registry import HEAL_OBJECTIVES as OBJECTIVES


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def hidden_error(outputs, targets, mask: torch.Tensor, objective: str, across_processes: bool = False) -> torch.Tensor:
    """Mean squared hidden-state error over real tokens, relative to the targets' variance (mean over layers).

    ``outputs`` and ``targets`` are ``hidden_states`` tuples (embeddings first); ``objective`` is ``"layers"``
    (every layer after the embeddings) or ``"last"``. With ``across_processes`` (under ``torch.distributed``) the
    token count and the targets' variance are those of every process's batch together, and the value returned is
    this process's share: the shares add up to the loss of the whole global batch.
    """
    pairs = list(zip(outputs[1:], targets[1:], strict=True)) if objective == "layers" else [(outputs[-1], targets[-1])]
    real = mask.bool()  # (B, N)
    errors, stats = [], []
    for out, target in pairs:
        kept = target[real]  # (tokens, D)
        errors.append((out[real] - kept).pow(2).sum())
        kept = kept.double()
        stats.append(torch.stack([kept.new_tensor(kept.numel()), kept.sum(), kept.pow(2).sum()]))
    stats = torch.stack(stats)  # (terms, 3): values, their sum, their sum of squares
    if across_processes and _distributed():
        torch.distributed.all_reduce(stats)
    count, total, squares = stats.unbind(-1)
    variance = (squares / count - (total / count) ** 2).clamp_min(1e-12)
    return (torch.stack(errors) / (count * variance).to(errors[0].dtype)).mean()


def embedding_error(student, teacher, across_processes: bool = False) -> torch.Tensor:
    """``1 - cos`` of (B, E) sentence embeddings, averaged over the (global) batch; this process's share."""
    cosine = torch.nn.functional.cosine_similarity(student, teacher.to(student.dtype), dim=-1)  # (B,)
    count = torch.tensor(float(cosine.shape[0]), dtype=torch.float64, device=cosine.device)
    if across_processes and _distributed():
        torch.distributed.all_reduce(count)
    return (1 - cosine).sum() / count.to(cosine.dtype)


@dataclass(frozen=True)
class Objective:
    """A resolved objective: which hidden states, and the sentence embedding's weight and pipeline.

    Build it with :meth:`resolve`; call it on the two models' outputs for a batch.
    """

    name: str
    hidden: str | None  # "layers", "last" or None
    embedding_weight: float = 0.0
    pipeline: object = None  # a SentencePipeline when the embedding term is on

    @classmethod
    def resolve(cls, name: str, pipeline=None, embedding_weight: float = 1.0, why_not: str = "") -> Objective:
        """The objective ``name`` (``OBJECTIVES``) for a source whose pipeline is ``pipeline`` (``None``: none).

        ``auto`` drops the embedding term when there is no pipeline; asking for ``embedding`` without one is a
        ``ValueError`` saying why (``why_not``).
        """
        from ..failures import ArgumentError

        if name not in OBJECTIVES:
            raise ArgumentError("objective", f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
        if name == "auto":
            name = "layers+embedding" if pipeline is not None else "layers"
        terms = name.split("+")
        if "embedding" in terms and pipeline is None:
            raise ArgumentError(
                "objective", f"{name!r} matches the sentence-transformers embedding, but {why_not or 'there is none'}"
            )
        hidden = next((t for t in terms if t in ("layers", "last")), None)
        weight = float(embedding_weight) if "embedding" in terms else 0.0
        return cls(name, hidden, weight, pipeline if weight else None)

    @property
    def needs_hidden_states(self) -> bool:
        return self.hidden is not None

    def __call__(self, outputs, targets, mask: torch.Tensor, across_processes: bool = False):
        """``(loss, parts)``: this process's share of the loss and the value of each term (floats, for logs).

        ``outputs``/``targets``: the student's and the teacher's ``hidden_states`` tuples for the batch.
        """
        loss, parts = 0.0, {}
        if self.hidden is not None:
            term = hidden_error(outputs, targets, mask, self.hidden, across_processes)
            loss, parts["hidden"] = term, term.detach()
        if self.embedding_weight:
            term = embedding_error(self.pipeline(outputs[-1], mask), self.pipeline(targets[-1], mask), across_processes)
            loss, parts["embedding"] = loss + self.embedding_weight * term, term.detach()
        return loss, parts

    def describe(self) -> str:
        """The objective in words, for recipes and cards."""
        words = {"layers": "every layer's hidden states", "last": "the last hidden states"}
        parts = [f"{words[self.hidden]} (variance-normalised MSE)"] if self.hidden else []
        if self.embedding_weight:
            parts.append(f"{self.embedding_weight:g} x the sentence embedding (1 - cos; {self.pipeline.describe()})")
        return " + ".join(parts)
