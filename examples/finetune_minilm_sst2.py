"""Fine-tune the real all-MiniLM-L6-v2 on SST-2 at fractions 0, 0.5 and 1, probe it too, and report both with cost.

Run from the repository root (CPU; about 15 minutes on 2 cores with the defaults):

    HF_HUB_OFFLINE=1 .venv/bin/python examples/finetune_minilm_sst2.py [--train-examples 2000] [--epochs 1]

The same as the CLI:

    papa-surgery finetune minilm --task sst2 --data-dir ../shared/data --fractions 0,0.5,1 --seeds 1 \\
        --max-train-examples 2000 --epochs 1 --lr 1e-4 --max-length 64 --out results.jsonl
    papa-surgery probe minilm --task sst2 --data-dir ../shared/data --fractions 0,0.5,1 --seeds 1 \\
        --max-train-examples 2000 --max-length 64 --out results.jsonl
    papa-surgery report results.jsonl --out report/

The data are ../shared/data/glue/sst2 (``PAPA_SHARED_DATA`` overrides the data root). Constants are calibrated
on the task's own unlabelled training sentences; at 0.5 the heads with the lowest attention variance are made
constant. Each fine-tuning cell loads the converted model with ``AutoModelForSequenceClassification`` and
trains it end to end with ``transformers.Trainer``; the cost columns compare each fraction with fraction 0.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from papa_surgery.experiments import SweepConfig, run_sweep
from papa_surgery.experiments.jobs import FinetuneJob
from papa_surgery.experiments.results import read_rows
from papa_surgery.models.sources import EMBEDDED_HUB_ID, embedded_model_path
from papa_surgery.report import table_finetuned, write_report

REPO = Path(__file__).resolve().parents[1]
DATA = Path(os.environ.get("PAPA_SHARED_DATA", REPO.parent / "shared" / "data"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train-examples", type=int, default=2000)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--lr", type=float, default=1e-4)
    parser.add_argument("--seeds", type=int, default=1)
    parser.add_argument("--out", default="finetune-minilm-sst2")
    args = parser.parse_args()

    out = Path(args.out)
    results = out / "results.jsonl"
    common = dict(
        model=embedded_model_path(),
        label=EMBEDDED_HUB_ID,
        tasks=("sst2",),
        fractions=(0.0, 0.5, 1.0),
        seeds=args.seeds,
        data_dir=str(DATA),
        max_length=64,  # SST-2's sequence length in the paper's App. B
        max_train_examples=args.train_examples,
    )
    tuned = SweepConfig(**common, epochs=args.epochs, lr=args.lr)
    run_sweep(tuned, results, job=FinetuneJob(tuned))
    run_sweep(SweepConfig(**common), results)  # the paper's probe, for comparison
    write_report(results, out / "report", overwrite=True)  # its own report, made again from the resumed results
    print(f"\nSST-2 dev accuracy, {args.train_examples} training examples, {args.seeds} seed(s)\n")
    print(table_finetuned(read_rows(results)))
    print(f"\nreport: {out / 'report' / 'report.md'}")


if __name__ == "__main__":
    main()
