"""How ``sharpen`` searches each layer's exponent: walking out from 1 against trying every exponent of the grid.

Per model: the average calibrated as ``convert`` calibrates it with the defaults (the default corpus, offline the
bundled WikiText-2 excerpt; the source's own L), heads ranked by variance; then, per fraction, ``sharpen`` with
``search="grid"`` and ``search="walk"``: the exponents each chose, the trials each made, whether every layer's grid
scores have one minimum along the grid (where the walk must find the grid's choice), and the seconds of each fit
next to the calibration's (the issue's cost target: average + sharpen within 2x the average's).

Run: python benchmarks/bench_sharpen_search.py [--models minilm,/path/to/all-mpnet-base-v2] [--fractions 1]
     [--threads 2] [--save [TAG]]
"""

from __future__ import annotations

import argparse
import os
import time
import warnings

import torch
from provenance import add_save_option, start_record


def one_minimum(scores: dict[str, float], grid: list[float]) -> bool:
    """Whether the scores fall to one lowest exponent and rise after it, along the grid."""
    values = [scores[str(p)] for p in grid]
    low = values.index(min(values))
    return values[: low + 1] == sorted(values[: low + 1], reverse=True) and values[low:] == sorted(values[low:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="minilm", help="comma-separated: minilm, or local model folders")
    parser.add_argument("--fractions", default="1")
    parser.add_argument("--threads", type=int, default=2)
    add_save_option(parser)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")

    import papa_surgery
    from papa_surgery.calibration.coverage import CoverageWarning
    from papa_surgery.models.sources import resolve_model
    from papa_surgery.workflow import open_corpus

    warnings.simplefilter("ignore", CoverageWarning)
    record = start_record("bench_sharpen_search", args.save)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads", flush=True)
    for name in map(resolve_model, args.models.split(",")):
        source, tok = papa_surgery.load(name)
        corpus = open_corpus(None)
        start = time.perf_counter()
        average = papa_surgery.calibrate(source, tok, corpus, progress=False)
        calibration = time.perf_counter() - start
        ranking = papa_surgery.rank("variance", constants=average)
        print(f"{os.path.basename(name)}: L={average.max_length}, calibration {calibration:.0f} s", flush=True)
        for fraction in [float(f) for f in args.fractions.split(",")]:
            heads = ranking.select(fraction)
            fits = {}
            for search in ("grid", "walk"):
                start = time.perf_counter()
                fitted = papa_surgery.sharpen(source, tok, corpus, average, heads, search=search, progress=False)
                fits[search] = (fitted.metadata["sharpened"], time.perf_counter() - start)
            (grid, grid_s), (walk, walk_s) = fits["grid"], fits["walk"]
            row = {
                "model": os.path.basename(name),
                "fraction": fraction,
                "calibration_s": round(calibration, 1),
                "grid_s": round(grid_s, 1),
                "walk_s": round(walk_s, 1),
                "grid_trials": sum(map(len, grid["trials"].values())),
                "walk_trials": sum(map(len, walk["trials"].values())),
                "same_exponents": grid["exponents"] == walk["exponents"],
                "one_minimum_every_layer": all(one_minimum(s, grid["grid"]) for s in grid["trials"].values()),
                "exponents_grid": grid["exponents"],
                "exponents_walk": walk["exponents"],
                "loss_average": grid["loss_average"],
                "loss_grid": grid["loss_sharpened"],
                "loss_walk": walk["loss_sharpened"],
            }
            record.add(row)
            print(
                f"  fraction {fraction}: grid {row['grid_trials']} trials {grid_s:.0f} s "
                f"({(calibration + grid_s) / calibration:.2f}x the average's cost), walk {row['walk_trials']} trials "
                f"{walk_s:.0f} s ({(calibration + walk_s) / calibration:.2f}x); same exponents: "
                f"{row['same_exponents']}; one minimum in every layer: {row['one_minimum_every_layer']}\n"
                f"    grid {grid['exponents']}\n    walk {walk['exponents']}\n"
                f"    objective: average {grid['loss_average']:.5f}, grid {grid['loss_sharpened']:.5f}, "
                f"walk {walk['loss_sharpened']:.5f}",
                flush=True,
            )
            for layer, scores in grid["trials"].items():
                print(f"    layer {layer}: " + " ".join(f"{p}:{v:.5f}" for p, v in scores.items()), flush=True)
    record.finish()


if __name__ == "__main__":
    main()
