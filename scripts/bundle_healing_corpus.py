"""Write papa_surgery/data/ud_ewt_train_sentences.txt (with the excerpt, the default healing corpus) from UD EWT.

The sentences of the English Web Treebank's training split (UD v2.16; weblogs, newsgroups, emails, reviews and
answers; CC BY-SA 4.0, Silveira et al. 2014), read from the ``# text =`` lines of ``en_ewt-ud-train.conllu`` in the
shared data folder: those of three words or more, each once, shuffled with seed 0 (the file's order is the order
healing holds out every k-th line from). benchmarks/results/bench_heal-heal-corpus-ewt.txt measured healing on it.

Run: python scripts/bundle_healing_corpus.py [--data ../shared/data]
"""

from __future__ import annotations

import argparse
import hashlib
from pathlib import Path

from papa_surgery.calibration.corpus import distinct_shuffled, healing_corpus_path

ROOT = Path(__file__).resolve().parents[1]
TEXT = "# text = "
SHA256 = "3fb78e2b55482c8ee00caa653af436c88c9e5bc9a73ce26e4ae3ddc79d2b7e7b"  # en_ewt-ud-train.conllu of UD v2.16


def ewt_sentences(data: Path) -> list[str]:
    """The EWT training sentences, as the bundled file holds them (papa_surgery/data/NOTICE.md says where from)."""
    source = data / "ud_ewt" / "en_ewt-ud-train.conllu"
    if hashlib.sha256(source.read_bytes()).hexdigest() != SHA256:
        raise SystemExit(f"{source} is not UD v2.16's en_ewt-ud-train.conllu (sha256 {SHA256}), which NOTICE.md names")
    with open(source, encoding="utf-8") as f:
        return distinct_shuffled(line[len(TEXT) :] for line in f if line.startswith(TEXT))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", default=str(ROOT.parent / "shared" / "data"))
    args = parser.parse_args()
    lines, target = ewt_sentences(Path(args.data)), healing_corpus_path()
    target.write_text("\n".join(lines) + "\n", encoding="utf-8")
    print(f"wrote {target} ({len(lines):,} sentences)")


if __name__ == "__main__":
    main()
