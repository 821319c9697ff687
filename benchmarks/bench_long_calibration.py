"""Calibration straight into the compact structure at long L: peak memory and seconds per token vs a forward pass.

A ModernBERT-base-sized model (random weights, 22 layers x 12 heads, its 8,192 positions) calibrated at each
``--max-length`` (default 2,048 and 8,192) on ``--documents`` long documents: the bundled WikiText excerpt's documents
(``documents:`` corpus, about 8,000 words each, cut at L tokens), tokenized with the embedded all-MiniLM-L6-v2's
WordPiece tokenizer (its ids fit ModernBERT's vocabulary; the weights are random anyway), with the defaults a user
gets (``papa_surgery.calibrate(..., max_length=L)``: the default compact layout, no residual, the variance from the
pass's own sums). Compared with a plain forward pass of the same model on the same documents: sdpa (what a user
runs) and eager (what calibration through forward hooks needed before it captured attention in blocks).

Each measurement runs in a fresh subprocess and reports that process's peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``: everything the process held, weights included) and its wall time.
What a dense calibration would hold is computed, not run: layers x heads x L^2 x 16 bytes (fp64 sums and squares).

Run: python benchmarks/bench_long_calibration.py [--max-length 2048 8192] [--documents 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch
from provenance import add_save_option, recorded


def _model(length: int):
    from transformers import ModernBertConfig, ModernBertModel

    torch.manual_seed(0)
    config = ModernBertConfig(max_position_embeddings=max(length, 8192), cls_token_id=101, sep_token_id=102,
                              pad_token_id=0, bos_token_id=101, eos_token_id=102)  # fmt: skip
    return ModernBertModel(config).eval()


def _child(args) -> dict:
    import papa_surgery
    from papa_surgery.calibration.corpus import load_corpus
    from papa_surgery.calibration.encoding import encode

    torch.set_num_threads(args.threads)
    model = _model(args.max_length)
    _, tok = papa_surgery.load("minilm")
    docs = list(load_corpus("documents:", max_examples=args.documents))
    tokens = sum(int(encode(tok, [d], args.max_length)["attention_mask"].sum()) for d in docs)
    start = time.perf_counter()
    if args.part == "calibrate":
        constants = papa_surgery.calibrate(model, tok, docs, max_length=args.max_length, batch_size=1,
                                           progress=False, storage="auto")  # fmt: skip
        kind = type(constants).__name__
    else:
        model.set_attn_implementation(args.part)
        with torch.no_grad():
            for d in docs:
                model(**encode(tok, [d], args.max_length))
        kind = "-"
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"part": args.part, "seconds": seconds, "tokens": tokens, "peak_bytes": peak, "result": kind}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-length", type=int, nargs="+", default=[2048, 8192])
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("sdpa", "eager", "calibrate"), help=argparse.SUPPRESS)
    add_save_option(parser)
    args = parser.parse_args()
    if args.part:
        args.max_length = args.max_length[0]
        print(json.dumps(_child(args)))
        return
    with recorded("bench_long_calibration", args.save) as record:
        run(args, record)


def run(args, record) -> None:
    print(f"ModernBERT-base size, {args.documents} documents, {args.threads} threads")
    print(f"{'L':>6}{'pass':>11}{'tokens':>8}{'s/token':>10}{'x sdpa':>8}{'peak RSS GB':>13}  result")
    for length in args.max_length:
        rows = []
        for part in ("sdpa", "eager", "calibrate"):
            cmd = [sys.executable, __file__, "--part", part, "--max-length", str(length),
                   "--documents", str(args.documents), "--threads", str(args.threads)]  # fmt: skip
            done = subprocess.run(cmd, capture_output=True, text=True)
            if done.returncode:
                rows.append({"part": part, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:100]})
                continue
            rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        base = next((r for r in rows if r["part"] == "sdpa" and "seconds" in r), None)
        for r in rows:
            if "error" in r:
                print(f"{length:>6}{r['part']:>11} failed: {r['error']}")
                continue
            per, ratio = r["seconds"] / r["tokens"], r["seconds"] / base["seconds"] if base else float("nan")
            record.add({"max_length": length, **r, "seconds_per_token": per, "ratio_to_sdpa": ratio})
            print(f"{length:>6}{r['part']:>11}{r['tokens']:>8}{per:>10.4f}{ratio:>8.2f}{r['peak_bytes'] / 1e9:>13.2f}"
                  f"  {r['result']}", flush=True)  # fmt: skip
        print(f"{'':>6} dense fp64 sums + squares would hold {22 * 12 * length**2 * 16 / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
