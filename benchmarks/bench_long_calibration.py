"""Calibration straight into the compact structure at long L: peak memory and seconds per token vs a forward pass.

A ModernBERT-base-sized model (random weights, 22 layers x 12 heads, its 8,192 positions) calibrated at
``--max-length`` (default 8,192) on ``--documents`` long documents: the bundled WikiText excerpt's documents
(``documents:`` corpus, about 8,000 words each, cut at L tokens), tokenized with the embedded all-MiniLM-L6-v2's
WordPiece tokenizer (its ids fit ModernBERT's vocabulary; the weights are random anyway). Compared with a plain
forward pass of the same model (sdpa, then eager: calibration needs eager attention to see the probabilities) on
the same documents.

Each measurement runs in a fresh subprocess and reports that process's peak resident memory
(``resource.getrusage(RUSAGE_SELF).ru_maxrss``: everything the process held, weights included) and its wall time.
Calibration's time is split into its passes as the bars show them (layouts, the streaming pass, the residual's pass
when the layout has one, the variance pass).
What a dense calibration would hold is computed, not run: layers x heads x L^2 x 16 bytes (fp64 sums and squares).

Run: python benchmarks/bench_long_calibration.py [--max-length 8192] [--documents 2] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import resource
import subprocess
import sys
import time

import torch


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
    parser.add_argument("--max-length", type=int, default=8192)
    parser.add_argument("--documents", type=int, default=2)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--part", choices=("sdpa", "eager", "calibrate"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.part:
        print(json.dumps(_child(args)))
        return
    rows = []
    for part in ("sdpa", "eager", "calibrate"):
        cmd = [sys.executable, __file__, "--part", part, "--max-length", str(args.max_length),
               "--documents", str(args.documents), "--threads", str(args.threads)]  # fmt: skip
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode:
            rows.append({"part": part, "error": (done.stderr.strip().splitlines() or ["?"])[-1][:100]})
            continue
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
    base = next((r for r in rows if r["part"] == "sdpa" and "seconds" in r), None)
    dense = 22 * 12 * args.max_length**2 * 16
    print(f"ModernBERT-base size, L={args.max_length}, {args.documents} documents, {args.threads} threads")
    print(f"{'pass':<12}{'tokens':>8}{'s/token':>12}{'x sdpa':>9}{'peak RSS GB':>13}  result")
    for r in rows:
        if "error" in r:
            print(f"{r['part']:<12} failed: {r['error']}")
            continue
        per = r["seconds"] / r["tokens"]
        ratio = r["seconds"] / base["seconds"] if base else float("nan")
        print(f"{r['part']:<12}{r['tokens']:>8}{per:>12.4f}{ratio:>9.1f}{r['peak_bytes'] / 1e9:>13.2f}  {r['result']}")
    print(f"dense fp64 sums + squares would hold {dense / 1e9:.1f} GB")


if __name__ == "__main__":
    main()
