"""Calibration cost against a plain eager forward pass over the same batches (target: <= 1.2x).

Both sides tokenise the same examples with the same batch size; the baseline runs the model in eager attention
mode (what calibration needs to see the probabilities). Repeats alternate between the two and the median is kept.

Run: python benchmarks/bench_calibrate.py [--model PATH] [--examples 256] [--max-length 128] [--repeats 3]
"""

from __future__ import annotations

import argparse

import torch
from provenance import add_save_option, start_record
from timing import interleaved_medians
from transformers import AutoModel, AutoTokenizer

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.corpus import default_corpus
from papa_surgery.calibration.encoding import encode, model_inputs
from papa_surgery.models.sources import embedded_model_path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="default: the embedded all-MiniLM-L6-v2")
    parser.add_argument("--examples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_calibrate", args.save)
    path = args.model or embedded_model_path()
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(path)
    examples = list(default_corpus(max_examples=args.examples))
    batches = [examples[i : i + args.batch_size] for i in range(0, len(examples), args.batch_size)]

    def forward_only():
        with torch.inference_mode():
            for batch in batches:
                model(**model_inputs(model, encode(tok, batch, args.max_length)))

    def calibration():
        calibrate(model, tok, examples, max_length=args.max_length, batch_size=args.batch_size, progress=False)

    medians = interleaved_medians({"eager forward": forward_only, "calibrate": calibration}, args.repeats)
    base = medians["eager forward"]
    print(f"{len(examples)} examples, batch {args.batch_size}, L={args.max_length}, {torch.get_num_threads()} threads")
    for name, med in medians.items():
        print(f"  {name:14s} {med:7.2f} s   {med / base:5.2f}x the eager forward")
    record.finish()


if __name__ == "__main__":
    main()
