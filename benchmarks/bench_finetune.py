"""Training throughput of a converted BERT-base-sized model against its source (random weights, CPU).

Prints, measured side by side in one run (interleaved repeats, median of each): examples per second of a
full fine-tuning step (forward, backward, AdamW update) with the stock sequence-classification head at
n=128, batch 16, sdpa: the source vs fraction 1.0 and 0.5, and the FLOP limit of each ratio.

FLOP limit: per layer and token a BERT layer costs 2*(4 D^2) for Q, K, V, O, 2*(8 D^2) for the FFN and
2*(2 n D) for Q K^T and A V. A constant head needs no Q or K projection and no Q K^T, only A V, so at
fraction 1 a layer costs 2*(2 D^2 + 8 D^2 + n D); backward costs about twice the forward for both, so the
training limit equals the forward one: (24 D^2 + 4 n D) / (20 D^2 + 2 n D) = 1.21x at D=768, n=128.

Run: python benchmarks/bench_finetune.py [--repeats 5] [--threads N]
"""

from __future__ import annotations

import argparse
import functools

import torch
from provenance import add_save_option, start_record
from timing import interleaved_medians
from transformers import BertConfig, BertForSequenceClassification

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.surgery import convert


def flop_limit(fraction: float, d: int = 768, n: int = 128) -> float:
    """Source FLOPs / converted FLOPs per layer and token (matmuls only; see the module docstring)."""
    source = 24 * d * d + 4 * n * d
    saved = fraction * (4 * d * d + 2 * n * d)  # Q and K projections, and Q K^T, of the constant heads
    return source / (source - saved)


def train_step(model, batch: dict, optimizer) -> None:
    model(**batch).loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_finetune", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = BertConfig(attn_implementation="sdpa", num_labels=2)  # BERT-base: 12 layers, 12 heads, hidden 768
    source = BertForSequenceClassification(config)
    constants = Constants.from_kind("toeplitz", 12, 12, args.length)
    models = {"source (sdpa)": (source, 0.0)}
    for fraction in (1.0, 0.5):
        heads = [[layer, h] for layer in range(12) for h in range(round(12 * fraction))]
        models[f"fraction {fraction}"] = (convert(source, constants, heads), fraction)
    ids = torch.randint(1000, 30000, (args.batch, args.length))
    ids[:, 0], ids[:, -1] = 101, 102
    batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": torch.randint(0, 2, (args.batch,))}
    steps = {}
    for name, (model, _) in models.items():
        model.train()
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=2e-5)
        steps[name] = functools.partial(train_step, model, batch, optimizer)  # the warm-up allocates AdamW state
    medians = interleaved_medians(steps, args.repeats)
    base = medians["source (sdpa)"]
    print(
        f"training step (fwd+bwd+AdamW), batch {args.batch} x n={args.length}, "
        f"{torch.get_num_threads()} threads, median of {args.repeats}"
    )
    for name, med in medians.items():
        limit = flop_limit(models[name][1], n=args.length)
        print(
            f"  {name:16s} {med * 1000:8.1f} ms  {args.batch / med:6.1f} examples/s   "
            f"speed-up vs source {base / med:5.3f}x   (FLOP limit {limit:5.3f}x)"
        )
    record.finish()


if __name__ == "__main__":
    main()
