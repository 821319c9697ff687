"""Short real inputs through the real clients: all-MiniLM-L6-v2 at its default L=256, source vs fraction 0.5 and 1.

Two measurements, each side by side (interleaved medians, ``timing.interleaved_medians``):

encode   ``SentenceTransformer(folder).encode`` of 1,000 real short sentences (the 872 SST-2 dev sentences, then
         SST-2 train's first ones; the bundled WikiText excerpt without ``../shared/data``), batch 32: sentences per
         second and the speed-up of each converted model over the source.
forward  ``AutoModel`` forward of the 16 sentences ``scripts/demo.sh`` times, padded to the longest, as the demo
         measures it: milliseconds per forward.

The converted models are made as a user makes them (``papa_surgery.calibrate`` on the default corpus at the source's
own length, the ``variance`` ranking, ``convert``, ``save``) and loaded from their folders. ``--threads`` sets torch's
threads; quote numbers only from a quiet machine.

Run: python benchmarks/bench_short_inputs.py [--repeats 5] [--threads 2] [--sentences 1000] [--max-examples 600]
"""

from __future__ import annotations

import argparse
import csv
import functools
import sys
import tempfile
from pathlib import Path

import torch
from provenance import add_save_option, recorded
from timing import interleaved_medians

import papa_surgery

DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
FRACTIONS = (0.5, 1.0)


def short_sentences(count: int) -> tuple[list[str], str]:
    """``count`` real short sentences: SST-2 dev, then train; else the bundled WikiText excerpt's lines."""
    rows = []
    for split in ("dev", "train"):
        path = DATA / "glue" / "sst2" / f"{split}.tsv"
        if path.exists():
            with open(path, encoding="utf-8") as f:
                rows += [row["sentence"].strip() for row in csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE)]
    if rows:
        return rows[:count], f"SST-2 dev (+ train) from {DATA}"
    from papa_surgery.calibration.corpus import default_corpus_path

    lines = [ln.strip() for ln in default_corpus_path().read_text(encoding="utf-8").splitlines() if ln.strip()]
    return lines[:count], "the bundled WikiText-2 excerpt"


def checkpoints(folder: Path, max_examples: int) -> dict[str, Path]:
    """The source's folder and a converted checkpoint per fraction, made as a user makes them."""
    from papa_surgery.models.sources import embedded_model_path

    model, tok = papa_surgery.load("minilm")
    constants = papa_surgery.calibrate(model, tok, max_examples=max_examples, progress=False)
    ranking = papa_surgery.rank("variance", constants=constants)
    out = {"source": Path(embedded_model_path())}
    for fraction in FRACTIONS:
        papa = papa_surgery.convert(model, constants, ranking, fraction, tokenizer=tok)
        out[f"fraction {fraction}"] = papa_surgery.save(papa, folder / f"f{fraction}", tokenizer=tok, card=False)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--max-examples", type=int, default=600, help="calibration examples (the demo's 600)")
    add_save_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with recorded("bench_short_inputs", args.save) as record:
        run(args, record)


def run(args, record) -> None:
    from demo import SENTENCES
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    texts, where = short_sentences(args.sentences)
    with tempfile.TemporaryDirectory() as tmp:
        folders = checkpoints(Path(tmp), args.max_examples)
        clients = {name: SentenceTransformer(str(path), device="cpu", trust_remote_code=True)
                   for name, path in folders.items()}  # fmt: skip
        calls = {name: functools.partial(m.encode, texts, batch_size=32) for name, m in clients.items()}
        encode = interleaved_medians(calls, args.repeats)
        tok = AutoTokenizer.from_pretrained(folders["source"])
        enc = tok(SENTENCES, padding=True, truncation=True, max_length=128, return_tensors="pt")
        models = {n: AutoModel.from_pretrained(path, trust_remote_code=True).eval() for n, path in folders.items()}
        with torch.inference_mode():
            calls = {name: functools.partial(m, **enc) for name, m in models.items()}
            forward = interleaved_medians(calls, 10 * args.repeats)
    tokens = sum(len(tok(t)["input_ids"]) for t in texts) / len(texts)
    print(f"all-MiniLM-L6-v2, L=256, torch {torch.__version__}, {args.threads} threads, {args.repeats} repeats")
    print(f"encode: {len(texts)} sentences of {where} (mean {tokens:.1f} tokens), batch 32")
    print(f"  {'model':<14}{'sentences/s':>12}{'seconds':>10}{'speed-up':>10}")
    for name, seconds in encode.items():
        print(f"  {name:<14}{len(texts) / seconds:>12.1f}{seconds:>10.2f}{encode['source'] / seconds:>9.3f}x")
        record.add({"measure": "encode", "model": name, "seconds": seconds, "speedup": encode["source"] / seconds})
    print(f"forward: AutoModel on the demo's {len(SENTENCES)} sentences, padded to {enc['input_ids'].shape[1]} tokens")
    print(f"  {'model':<14}{'ms':>10}{'speed-up':>10}")
    for name, seconds in forward.items():
        print(f"  {name:<14}{seconds * 1000:>10.2f}{forward['source'] / seconds:>9.3f}x")
        record.add({"measure": "forward", "model": name, "seconds": seconds, "speedup": forward["source"] / seconds})


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))  # the demo's sentences
    main()
