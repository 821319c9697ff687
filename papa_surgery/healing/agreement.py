"""How close a converted model is to its source: the healing objective and plain agreement measures.

:class:`HeldOut` measures a student against its teacher on held-out examples (the teacher's outputs computed once):
the objective, the mean cosine of the last hidden states per real token, and the mean cosine of the sentence
embeddings (the source's sentence-transformers pipeline, else mean pooling). Under ``torch.distributed`` each process
measures its share of the examples and the sums are added up, so every process gets the same numbers.

:func:`embeddings` and :func:`neighbour_overlap` are the retrieval-side measures the healing benchmark reports.
"""

from __future__ import annotations

import torch

from ..calibration.encoding import encode, model_inputs


def _distributed() -> bool:
    return torch.distributed.is_available() and torch.distributed.is_initialized()


def mean_pooled(hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """(B, D) mean of the real tokens' (B, N, D) hidden states."""
    m = mask.to(hidden.dtype).unsqueeze(-1)  # (B, N, 1)
    return (hidden * m).sum(1) / m.sum(1).clamp_min(1.0)


class HeldOut:
    """Held-out examples and the teacher's outputs on them, to measure students against.

    Args:
        teacher: the source model (run once here, in eval mode, without gradients).
        tokenizer, max_length, pairs: how examples are encoded (the slot layout).
        examples: the held-out examples (strings, or pairs).
        objective: the healing :class:`~.objective.Objective` (its pipeline also makes the sentence embeddings).
        batch_size: examples per forward pass.
    """

    def __init__(self, teacher, tokenizer, examples, max_length: int, pairs: bool, objective, batch_size: int = 32):
        from ..distributed import rank, world_size

        self.objective = objective
        self.examples = len(examples)
        shard = [examples[i : i + batch_size] for i in range(0, len(examples), batch_size)][rank() :: world_size()]
        self.batches = []
        with torch.no_grad():
            for batch in shard:
                enc = encode(tokenizer, batch, max_length, pairs=pairs)
                inputs = model_inputs(teacher, enc)
                targets = teacher(**inputs, output_hidden_states=True).hidden_states
                self.batches.append((inputs, targets))

    def embed(self, hidden: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        pipeline = self.objective.pipeline
        return pipeline(hidden, mask) if pipeline is not None else mean_pooled(hidden, mask)

    def measure(self, model) -> dict:
        """``{"loss", "token_cosine", "sentence_cosine", "worst_sentence_cosine"}`` of ``model`` on the examples."""
        sums = torch.zeros(5, dtype=torch.float64)  # loss x examples, token cos sum, tokens, sentence cos sum, count
        worst = torch.tensor([2.0], dtype=torch.float64)
        device = next(model.parameters()).device
        with torch.no_grad():
            for inputs, targets in self.batches:
                inputs = {k: v.to(device) for k, v in inputs.items()}
                targets = tuple(t.to(device) for t in targets)
                outputs = model(**inputs, output_hidden_states=True).hidden_states
                mask = inputs["attention_mask"]
                loss, _ = self.objective(outputs, targets, mask)
                real = mask.bool()
                token = torch.nn.functional.cosine_similarity(outputs[-1], targets[-1], dim=-1)[real]
                a, b = self.embed(outputs[-1], mask), self.embed(targets[-1], mask)
                sentence = torch.nn.functional.cosine_similarity(a, b, dim=-1)  # (B,)
                size = real.shape[0]
                sums += torch.tensor(
                    [float(loss) * size, float(token.sum()), token.numel(), float(sentence.sum()), size],
                    dtype=torch.float64,
                )
                worst = torch.minimum(worst, sentence.min().double().cpu().reshape(1))
        if _distributed():
            torch.distributed.all_reduce(sums)
            torch.distributed.all_reduce(worst, op=torch.distributed.ReduceOp.MIN)
        count = max(float(sums[4]), 1.0)
        return {
            "loss": float(sums[0]) / count,
            "token_cosine": float(sums[1]) / max(float(sums[2]), 1.0),
            "sentence_cosine": float(sums[3]) / count,
            "worst_sentence_cosine": float(worst[0]),
        }


def embeddings(model, tokenizer, texts, max_length: int, pipeline=None, batch_size: int = 64, pairs: bool = False):
    """``(sentence embeddings (n, E), token states [(N_i, D)])`` of ``texts``: the pipeline's, else mean pooling."""
    sentences, tokens = [], []
    device = next(model.parameters()).device
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            enc = encode(tokenizer, texts[i : i + batch_size], max_length, pairs=pairs).to(device)
            hidden = model(**model_inputs(model, enc)).last_hidden_state  # (B, N, D)
            mask = enc["attention_mask"]
            sentences.append(pipeline(hidden, mask) if pipeline is not None else mean_pooled(hidden, mask))
            tokens.extend(h[m.bool()] for h, m in zip(hidden, mask, strict=True))
    return torch.cat(sentences), tokens


def neighbour_overlap(reference: torch.Tensor, other: torch.Tensor, k: int = 10) -> float:
    """Mean share of each item's ``k`` nearest neighbours (cosine, itself excluded) that two embeddings agree on."""

    def neighbours(x: torch.Tensor) -> torch.Tensor:
        x = torch.nn.functional.normalize(x.float(), dim=-1)
        sim = x @ x.T  # (n, n)
        sim.fill_diagonal_(-float("inf"))
        return sim.topk(k, dim=-1).indices  # (n, k)

    a, b = neighbours(reference), neighbours(other)
    shared = (a.unsqueeze(-1) == b.unsqueeze(-2)).any(-1).sum(-1)  # (n,)
    return float(shared.float().mean() / k)
