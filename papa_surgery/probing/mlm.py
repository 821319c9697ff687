"""Masked-LM scoring (paper sec. 5.5): negative log perplexity of masked tokens with the model's own MLM head.

``strategy="pseudo"`` (the default) is the pseudo-perplexity (Salazar et al. 2020): every non-special
token of an example is masked on its own, in a copy of the example, and scored given all the others;
it costs one forward pass per token. ``strategy="random"`` masks a seeded 15% of the tokens of each
example at once (one forward pass per example), the quick MLM-loss estimate. Either way the score is
minus the mean negative log-likelihood of the original tokens at the masked positions (the paper's
"negative log perplexity", higher is better). Positions whose original token is the unknown token are
never masked. Each text (a WikiText paragraph) is cut to the slot count (App. B: 128 tokens).
"""

from __future__ import annotations

import torch
from torch import nn
from tqdm.auto import tqdm

from .features import Encoded, length_batches, pad_batch, token_ids

MASK_PROB = 0.15


def require_mlm_head(model: nn.Module, tokenizer) -> None:
    """Raise a ``ValueError`` unless ``model`` has a masked-LM head and ``tokenizer`` a mask token."""
    if model.get_output_embeddings() is None:
        raise ValueError(
            f"task 'mlm' needs a model with a masked-LM head (AutoModelForMaskedLM), but {type(model).__name__} "
            f"has none; load the model or checkpoint with AutoModelForMaskedLM (a checkpoint saved without its "
            f"MLM head cannot be scored on 'mlm')"
        )
    if tokenizer.mask_token_id is None:
        raise ValueError(f"task 'mlm' needs a tokenizer with a mask token; {type(tokenizer).__name__} has none")


def mask_positions(enc: Encoded, tokenizer, seed: int) -> list[torch.Tensor]:
    """Per example, a bool (n_i,) tensor of the positions to mask (seeded, >= 1 per example when possible)."""
    generator = torch.Generator().manual_seed(seed)
    out = []
    for ids, candidates in zip(enc.ids, _candidates(enc, tokenizer), strict=True):
        chosen = (torch.rand(len(ids), generator=generator) < MASK_PROB) & candidates
        if not chosen.any() and candidates.any():
            pick = candidates.nonzero()[torch.randint(int(candidates.sum()), (1,), generator=generator)]
            chosen[pick] = True
        out.append(chosen)
    return out


def _candidates(enc: Encoded, tokenizer) -> list[torch.Tensor]:
    special = torch.tensor(sorted(set(tokenizer.all_special_ids)), dtype=torch.long)
    return [~torch.isin(ids, special) for ids in enc.ids]  # each (n_i,) bool


def _one_token_copies(enc: Encoded, tokenizer) -> tuple[Encoded, list[torch.Tensor]]:
    """Pseudo-perplexity: one copy of an example per maskable token, with that token alone to be masked."""
    import dataclasses

    rows, masks = [], []
    for i, candidates in enumerate(_candidates(enc, tokenizer)):
        for p in candidates.nonzero().squeeze(-1).tolist():
            rows.append(i)
            chosen = torch.zeros_like(candidates)
            chosen[p] = True
            masks.append(chosen)
    fields = {f.name: getattr(enc, f.name) for f in dataclasses.fields(enc)}
    copies = {
        k: [v[i] for i in rows] if isinstance(v, list) and len(v) == len(enc.ids) else v for k, v in fields.items()
    }
    return type(enc)(**copies), masks


@torch.inference_mode()
def masked_nll(
    model: nn.Module,
    tokenizer,
    enc: Encoded,
    seed: int,
    batch_size: int,
    device,
    progress: bool = True,
    strategy: str = "pseudo",
) -> tuple[float, int]:
    """(sum of masked-token NLL in nats, number of masked tokens); ``strategy`` is ``pseudo`` or ``random``."""
    model.eval()
    if strategy == "pseudo":
        enc, masks = _one_token_copies(enc, tokenizer)
    elif strategy == "random":
        masks = mask_positions(enc, tokenizer, seed)
    else:
        raise ValueError(f"unknown MLM strategy {strategy!r}; use 'pseudo' or 'random'")
    _, pad_id = token_ids(model, tokenizer)
    total, count = 0.0, 0
    for index in tqdm(length_batches(enc.lengths, batch_size), desc="mlm", disable=not progress, leave=False):
        batch = pad_batch(enc, index, pad_id)
        chosen = torch.zeros_like(batch["input_ids"], dtype=torch.bool)  # (B, N)
        for r, i in enumerate(index):
            chosen[r, : len(masks[i])] = masks[i]
        target = batch["input_ids"][chosen]  # (M,)
        inputs = batch["input_ids"].masked_fill(chosen, tokenizer.mask_token_id)
        kwargs = {"input_ids": inputs.to(device), "attention_mask": batch["attention_mask"].to(device)}
        if "token_type_ids" in batch:
            kwargs["token_type_ids"] = batch["token_type_ids"].to(device)
        logits = model(**kwargs).logits  # (B, N, V)
        logp = torch.log_softmax(logits[chosen.to(device)].float(), dim=-1)  # (M, V)
        total -= float(logp.gather(-1, target.to(device)[:, None]).sum())
        count += int(target.numel())
    return total, count
