"""Tokenise a split once and serve the frozen backbone's hidden states to the probe.

The backbone forward dominates a probe's cost, so :class:`FeatureStore` runs it once per split (in
length-sorted batches, so little padding) and keeps every real token's hidden states of all layers
packed in one (T, Ly, H) tensor; each epoch's batches are then gathered from it. When that tensor
would exceed the memory budget the store falls back to running the backbone per batch.

Under ``torch.distributed`` (``accelerate launch``) each process runs the backbone on every
world_size-th extraction batch and the packed features are all-gathered, so every process holds the
same features as a single process would (same batches, same padding) and trains an identical probe.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from tqdm.auto import tqdm

from ..calibration.encoding import encode
from ..distributed import exchange
from ..hub_code.slots import compute_slots

IGNORE = -100


@dataclass
class Encoded:
    """One tokenisation of a split: per example, its real tokens only (no padding)."""

    ids: list[torch.Tensor]  # each (n_i,) long
    type_ids: list[torch.Tensor] | None  # each (n_i,) long
    slots: list[torch.Tensor]  # each (n_i,) long, in [0, L)
    labels: list  # int per example (sentence tasks) or an (n_i,) long tensor, IGNORE off first sub-tokens

    def __len__(self) -> int:
        return len(self.ids)

    @property
    def lengths(self) -> list[int]:
        return [len(x) for x in self.ids]


def _unpad(batch, max_length: int, sep_token_id: int | None) -> tuple[list, list | None, list]:
    mask = batch["attention_mask"].bool()  # (B, N)
    slots = compute_slots(batch["input_ids"], batch["attention_mask"], max_length, sep_token_id)  # (B, N)
    ids = [row[m] for row, m in zip(batch["input_ids"], mask, strict=False)]
    types = (
        [row[m] for row, m in zip(batch["token_type_ids"], mask, strict=False)] if "token_type_ids" in batch else None
    )
    return ids, types, [row[m] for row, m in zip(slots, mask, strict=False)]


def encode_split(
    tokenizer,
    texts: Sequence,
    labels: Sequence | None,
    kind: str,
    pairs: bool,
    max_length: int,
    sep_token_id: int | None,
    chunk: int = 2048,
) -> Encoded:
    """Tokenise a whole split for the slot layout of ``max_length`` slots.

    Sentence tasks go through ``papa_surgery.calibration.encoding.encode`` (pairs: each segment fits its half).
    Token tasks take word lists (``is_split_into_words``); each word's label sits on its first sub-token
    and every other position holds -100. Words cut off by truncation are dropped from training and scoring.
    """
    ids, types, slots, out_labels = [], [], [], []
    for start in range(0, len(texts), chunk):
        part = list(texts[start : start + chunk])
        if kind == "token":
            batch = _encode_words(tokenizer, part, max_length)
        else:
            batch = encode(tokenizer, part, max_length, pairs=pairs)
        i, t, s = _unpad(batch, max_length, sep_token_id)
        ids += i
        slots += s
        types = types + t if t is not None and types is not None else None
        if labels is None:
            continue
        if kind == "token":
            for b, tags in enumerate(labels[start : start + chunk]):
                word_ids = [w for w, m in zip(batch.word_ids(b), batch["attention_mask"][b], strict=False) if m]
                out_labels.append(_first_subtoken_labels(word_ids, tags))
        else:
            out_labels += list(labels[start : start + chunk])
    return Encoded(ids, types, slots, out_labels)


def _encode_words(tokenizer, words: list[list[str]], max_length: int):
    kwargs = dict(is_split_into_words=True, truncation=True, max_length=max_length, padding=True, return_tensors="pt")
    try:
        return tokenizer(words, **kwargs)
    except (ValueError, AssertionError) as err:  # byte-level BPE (RoBERTa) needs add_prefix_space for words
        if "add_prefix_space" not in str(err):
            raise
        fixed = type(tokenizer).from_pretrained(tokenizer.name_or_path, add_prefix_space=True)
        return fixed(words, **kwargs)


def _first_subtoken_labels(word_ids: list[int | None], tags: Sequence[int]) -> torch.Tensor:
    out, previous = [], None
    for w in word_ids:
        out.append(tags[w] if w is not None and w != previous else IGNORE)
        previous = w if w is not None else previous
    return torch.tensor(out, dtype=torch.long)  # (n_i,)


def backbone_of(model: nn.Module) -> nn.Module:
    """The encoder under any task head (``model.base_model``), in eval mode (no dropout; always run without grad).

    A PAPA model computes its slots in its own forward, which its ``base_model`` under a task head does not:
    for one, the encoder runs through ``papa_base_forward`` (``_PapaEncoder``).
    """
    base = getattr(model, "base_model", model)
    base.eval()
    if base is not model and hasattr(model, "papa_base_forward"):
        return _PapaEncoder(model)
    return base


class _PapaEncoder:
    """A PAPA task-head model's encoder, called with the batch's slots (``papa_base_forward``)."""

    def __init__(self, model: nn.Module):
        self.model, self.config = model, model.config

    def __call__(self, **inputs):
        return self.model.papa_base_forward(**inputs)


def token_ids(model: nn.Module, tokenizer) -> tuple[int | None, int]:
    """(separator, padding) ids for encoding and padding a split for ``model``.

    The separator is the PAPA config's middle separator when the model has one, else the tokenizer's; the
    padding id is the tokenizer's, else 0 (padding is masked out, so any id serves).
    """
    sep = getattr(model.config, "papa_sep_token_id", None)
    pad = tokenizer.pad_token_id
    return (sep if sep is not None else tokenizer.sep_token_id), (pad if pad is not None else 0)


def pad_batch(enc: Encoded, index: Sequence[int], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded (B, N) tensors of the examples ``index``: input_ids, attention_mask, slots (-1 pad)."""
    n = max(len(enc.ids[i]) for i in index)
    b = len(index)
    ids = torch.full((b, n), pad_id, dtype=torch.long)
    slots = torch.full((b, n), -1, dtype=torch.long)
    types = torch.zeros((b, n), dtype=torch.long) if enc.type_ids is not None else None
    for row, i in enumerate(index):
        k = len(enc.ids[i])
        ids[row, :k] = enc.ids[i]
        slots[row, :k] = enc.slots[i]
        if types is not None:
            types[row, :k] = enc.type_ids[i]
    out = {"input_ids": ids, "attention_mask": (slots >= 0).long(), "slots": slots}
    if types is not None:
        out["token_type_ids"] = types
    return out


@torch.inference_mode()
def hidden_states(backbone: nn.Module, batch: dict[str, torch.Tensor], device, stack: bool = True):
    """(B, N, Ly, H) hidden states of every layer (embeddings first) for a padded batch (a tuple of Ly
    (B, N, H) tensors when ``stack`` is False)."""
    inputs = {k: batch[k].to(device) for k in ("input_ids", "attention_mask", "token_type_ids") if k in batch}
    out = backbone(**inputs, output_hidden_states=True, return_dict=True)
    return torch.stack(out.hidden_states, dim=2) if stack else out.hidden_states  # (B, N, Ly, H)


def length_batches(lengths: Sequence[int], batch_size: int) -> list[list[int]]:
    """Indices sorted by length (stable) and cut into batches: deterministic and nearly padding-free."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + batch_size] for i in range(0, len(order), batch_size)]


class FeatureStore:
    """Hidden states of a split, cached (packed, real tokens only) when they fit ``cache_bytes``."""

    def __init__(
        self,
        model: nn.Module,
        enc: Encoded,
        pad_id: int,
        device,
        cache_bytes: float,
        batch_size: int = 64,
        progress: bool = True,
        desc: str = "features",
    ):
        self.backbone = backbone_of(model)
        self.enc, self.pad_id, self.device = enc, pad_id, device
        cfg = self.backbone.config
        self.num_layers, self.hidden = cfg.num_hidden_layers + 1, cfg.hidden_size
        tokens = sum(enc.lengths)
        self.cached = tokens * self.num_layers * self.hidden * 4 <= cache_bytes
        self.features = None
        if self.cached:
            self._extract(batch_size, progress, desc)

    def _extract(self, batch_size: int, progress: bool, desc: str) -> None:
        offsets = torch.tensor([0, *self.enc.lengths]).cumsum(0)  # (n+1,)
        packed = torch.zeros(int(offsets[-1]) + 1, self.num_layers, self.hidden)  # (T+1, Ly, H); last row = padding
        rank, world = dist_info()
        mine = length_batches(self.enc.lengths, batch_size)[rank::world]
        results = []
        for index in tqdm(mine, desc=desc, disable=not progress or rank != 0, leave=False):
            padded = pad_batch(self.enc, index, self.pad_id)
            real = padded["attention_mask"].bool()  # (B, N), right-padded
            rows = (offsets[index][:, None] + torch.arange(real.shape[1])[None, :])[real]  # (tokens,)
            layers = hidden_states(self.backbone, padded, self.device, stack=False)  # Ly x (B, N, H)
            real = real.to(self.device)
            if world > 1:
                results.append((rows, torch.stack([h[real] for h in layers], dim=1).float().cpu()))  # (tokens, Ly, H)
            else:
                for layer, h in enumerate(layers):
                    packed[rows, layer] = h[real].float().cpu()  # (tokens, H)
        if world > 1:  # an exchange, so a rank that failed above makes the others raise, not hang
            for rows, feats in (item for part in exchange(results) for item in part):
                packed[rows] = feats
        self.features, self.offsets = packed, offsets
        self.lengths = torch.tensor(self.enc.lengths, dtype=torch.long)  # (n,)
        self.slots = torch.cat([*self.enc.slots, torch.full((1,), -1, dtype=torch.long)])  # (T+1,)

    def batch(self, index: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(B, N, Ly, H) features and (B, N) slots (-1 = padding) of the examples ``index``, right-padded."""
        if not self.cached:
            padded = pad_batch(self.enc, index, self.pad_id)
            return hidden_states(self.backbone, padded, self.device).float(), padded["slots"].to(self.device)
        idx = torch.as_tensor(index, dtype=torch.long)
        lengths = self.lengths[idx]  # (B,)
        pos = torch.arange(int(lengths.max()))  # (N,)
        real = pos[None, :] < lengths[:, None]  # (B, N)
        rows = torch.where(real, self.offsets[idx][:, None] + pos[None, :], self.features.shape[0] - 1)  # (B, N)
        slots = torch.where(real, self.slots[rows], -1)  # (B, N)
        return self.features[rows].to(self.device), slots.to(self.device)


def dist_info() -> tuple[int, int]:
    """(rank, world size) of the running process group; (0, 1) without one."""
    from ..distributed import rank, world_size

    return rank(), world_size()


def iter_batches(store: FeatureStore, batches: Iterable[list[int]]):
    """Yield (index, features, slots) per batch."""
    for index in batches:
        feats, slots = store.batch(index)
        yield index, feats, slots
