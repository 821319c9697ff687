"""Speed and size of a converted BERT-base-sized model against its source (random weights).

Prints, measured side by side in one run (interleaved repeats, median of each):
- forward time at n=128, batch 16 on CPU with sdpa: source vs fraction 1.0 and 0.5 (target: >= 1.15x faster at
  1.0, the FLOP limit is ~1.21x; not slower at 0.5);
- checkpoint size at L=128: fraction 1.0 with fp32 constants (target <= 0.92x the source) and fp16 (<= 0.90x).

Run: python benchmarks/bench_convert.py [--repeats 7] [--threads N]
"""

from __future__ import annotations

import argparse
import functools
import tempfile
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from timing import interleaved_medians
from transformers import BertConfig, BertModel

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.finetuning.cost import folder_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--threads", type=int, default=None)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_convert", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    config = BertConfig(attn_implementation="sdpa")  # BERT-base: 12 layers, 12 heads, hidden 768
    source = BertModel(config).eval()
    heads_all = [[layer, h] for layer in range(12) for h in range(12)]
    constants = Constants.from_kind("toeplitz", 12, 12, args.length)
    models = {
        "source (sdpa)": source,
        "fraction 1.0": convert(source, constants, heads_all),
        "fraction 0.5": convert(source, constants, [[layer, h] for layer in range(12) for h in range(6)]),
    }
    ids = torch.randint(1000, 30000, (args.batch, args.length))
    ids[:, 0], ids[:, -1] = 101, 102
    mask = torch.ones_like(ids)
    with torch.inference_mode():
        medians = interleaved_medians(
            {name: functools.partial(m, input_ids=ids, attention_mask=mask) for name, m in models.items()},
            args.repeats,
        )
    base = medians["source (sdpa)"]
    print(f"forward, batch {args.batch} x n={args.length}, {torch.get_num_threads()} threads, median of {args.repeats}")
    for name, med in medians.items():
        print(f"  {name:16s} {med * 1000:8.1f} ms   speed-up vs source {base / med:5.3f}x")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        source.save_pretrained(tmp / "source")
        src_size = folder_bytes(tmp / "source")
        print(f"checkpoint size at L={args.length} (safetensors bytes)")
        print(f"  {'source':16s} {src_size / 2**20:8.1f} MiB")
        for dtype in ("fp32", "fp16"):
            papa = convert(source, constants, heads_all, dtype=dtype)
            save_checkpoint(papa, tmp / dtype, card=False)
            size = folder_bytes(tmp / dtype)
            print(f"  {'1.0, ' + dtype:16s} {size / 2**20:8.1f} MiB   ratio {size / src_size:5.3f}x")
    record.finish()


if __name__ == "__main__":
    main()
