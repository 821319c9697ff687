"""A task's splits as ``datasets.Dataset`` rows for ``transformers.Trainer``, in the model's slot layout.

Tokenisation is the probe's (``probe.features.encode_split``): pairs put each segment in its half of the
L slots, token tasks put each word's label on its first sub-token (-100 elsewhere). Rows hold real tokens
only; the collator pads each batch to its longest row.
"""

from __future__ import annotations

from datasets import Dataset
from transformers import DataCollatorForTokenClassification, DataCollatorWithPadding

from ..probing.features import encode_split
from ..tasks.registry import TOKEN


def task_dataset(tokenizer, split, task, max_length: int, sep_token_id: int | None) -> Dataset:
    """One split (``probe.data.Split``) as a Dataset with input_ids, attention_mask, token_type_ids, labels."""
    enc = encode_split(tokenizer, split.texts, split.labels, task.kind, task.pairs, max_length, sep_token_id)
    columns = {
        "input_ids": [x.tolist() for x in enc.ids],
        "attention_mask": [[1] * len(x) for x in enc.ids],
        "labels": [y.tolist() for y in enc.labels] if task.kind == TOKEN else [int(y) for y in enc.labels],
    }
    if enc.type_ids is not None:
        columns["token_type_ids"] = [x.tolist() for x in enc.type_ids]
    return Dataset.from_dict(columns)


def collator(tokenizer, task):
    """Pads a batch to its longest row (labels of token tasks with -100)."""
    if task.kind == TOKEN:
        return DataCollatorForTokenClassification(tokenizer)
    return DataCollatorWithPadding(tokenizer)
