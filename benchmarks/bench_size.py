"""Checkpoint size of a converted BERT-base-sized model against its source (random weights, built from a config).

Prints, for L=128 and L=512, fractions 0.5 and 1, constants in fp32 and fp16, the size of ``model.safetensors``
side by side with the source's, for the default storage (``auto``: dense up to L=128, compact above) and for dense
matrices. Targets (issue 11): fraction 1 at L=512 at most 0.92x the source; L=128 at 0.89x or better.
The values of the constants do not change their size; toeplitz constants stand in for calibrated ones.

Run: python benchmarks/bench_size.py [--lengths 128 512] [--threads N]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from transformers import BertConfig, BertModel
from transformers.utils import logging as hf_logging

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.finetuning.cost import folder_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lengths", type=int, nargs="+", default=[128, 512])
    parser.add_argument("--threads", type=int, default=None)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_size", args.save)
    hf_logging.disable_progress_bar()  # transformers' per-save bar would split the table
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    source = BertModel(BertConfig()).eval()  # BERT-base: 12 layers, 12 heads, hidden 768
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        source.save_pretrained(root / "source")
        base = folder_bytes(root / "source")
        print(f"source (fp32): {base / 2**20:.1f} MiB")
        print(f"{'L':>4} {'fraction':>8} {'dtype':>5} {'storage':>8} {'size MiB':>9} {'x source':>9} {'fit s':>6}")
        for length in args.lengths:
            constants = Constants.from_kind("toeplitz", 12, 12, length)
            for fraction in (0.5, 1.0):
                per_layer = round(12 * fraction)
                heads = [[layer, h] for layer in range(12) for h in range(per_layer)]
                for dtype in ("fp32", "fp16"):
                    storages = ("auto",) if length <= 128 else ("auto", "dense")
                    for storage in storages:
                        start = time.perf_counter()
                        papa = convert(source, constants, heads, fraction=fraction, dtype=dtype, storage=storage)
                        fit = time.perf_counter() - start
                        name = f"L{length}-f{fraction}-{dtype}-{storage}"
                        out = save_checkpoint(papa, root / name, recipe={"benchmark": name}, card=False)
                        size = folder_bytes(out)
                        label = storage if storage != "auto" else ("auto:" + ("dense" if length <= 128 else "cmp"))
                        print(
                            f"{length:>4} {fraction:>8g} {dtype:>5} {label:>8} {size / 2**20:>9.1f} "
                            f"{size / base:>8.3f}x {fit:>6.1f}",
                            flush=True,
                        )
    record.finish()


if __name__ == "__main__":
    main()
