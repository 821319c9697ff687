"""What ``papa-surgery convert`` costs with its defaults against the convert issue 32 started from (target: <= 2x).

Today's defaults make sharpened constants (the average plus a fitted exponent per head) and, at a fraction strictly
between 0 and 1, rank the heads by sensitivity (each head made constant alone, run on the corpus). Before issue 32
``convert`` made average constants ranked by variance, which costs the calibration alone: that is the baseline here
(``--kind average --method variance``). Both are the command a user types, run as a fresh process each (imports,
model loading and writing the checkpoint included), with no ``--max-length`` (the source's own) and the default
corpus. Repeats alternate between the two; the median wall time of each is kept. The seconds of each progress bar
the command shows (calibrate, sensitivity, sharpness) are printed beside it, from the last repeat.

Time it on a quiet machine: nothing else running on the cores.

Run: python benchmarks/bench_convert_cost.py [--model minilm] [--fractions 0.5,1] [--repeats 1]
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from provenance import add_save_option, start_record

SETUPS = {"before issue 32": ["--kind", "average", "--method", "variance"], "defaults": []}
# a finished tqdm bar: "calibrate: 100%|####| 94/94 [01:11<00:00, ...]"
_BAR = re.compile(r"(\w[\w ]*): 100%\|[^|]*\|\s*\d+/\d+ \[(?:(\d+):)?(\d+):(\d+)<")


def _bars(stderr: str) -> dict[str, int]:
    """Seconds of each progress bar that finished, by its name (the last report of each)."""
    out = {}
    for line in stderr.replace("\r", "\n").splitlines():
        if m := _BAR.search(line):
            hours, minutes, seconds = (int(g or 0) for g in m.groups()[1:])
            if m.group(1) not in ("Loading weights", "Writing model shards"):
                out[m.group(1)] = hours * 3600 + minutes * 60 + seconds
    return out


def _convert(model: str, fraction: float, extra: list[str], out: Path) -> tuple[float, dict[str, int]]:
    """Wall seconds of one ``convert`` in a fresh process, and its progress bars' seconds."""
    shutil.rmtree(out, ignore_errors=True)
    cli = [sys.executable, "-m", "papa_surgery", "convert", model, "--fraction", str(fraction), "--out", str(out)]
    start = time.perf_counter()
    done = subprocess.run([*cli, *extra], capture_output=True, text=True, env=os.environ)
    wall = time.perf_counter() - start
    if done.returncode != 0:
        sys.exit(f"{' '.join(cli + extra)} failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return wall, _bars(done.stderr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="minilm", help="what convert takes: a name, a folder or a Hub id")
    parser.add_argument("--fractions", default="0.5,1")
    parser.add_argument("--repeats", type=int, default=1)
    add_save_option(parser)
    args = parser.parse_args()
    record = start_record("bench_convert_cost", args.save)
    print(f"papa-surgery convert {args.model}, median wall of {args.repeats} fresh process(es) each")
    with tempfile.TemporaryDirectory() as tmp:
        for fraction in (float(f) for f in args.fractions.split(",")):
            walls: dict[str, list[float]] = {name: [] for name in SETUPS}
            bars: dict[str, dict[str, int]] = {}
            for _ in range(args.repeats):  # alternate: drift in the machine's load falls on both alike
                for name, extra in SETUPS.items():
                    wall, bars[name] = _convert(args.model, fraction, extra, Path(tmp) / "out")
                    walls[name].append(wall)
            base = statistics.median(walls["before issue 32"])
            for name, extra in SETUPS.items():
                wall = statistics.median(walls[name])
                phases = ", ".join(f"{bar} {s} s" for bar, s in bars[name].items())
                flags = " ".join(extra) or "(no flags)"
                print(f"fraction {fraction:g}  {name:15s} {wall:6.0f} s  {wall / base:4.2f}x   {flags}; {phases}")
                record.add({"fraction": fraction, "setup": name, "flags": extra, "wall_s": wall, "bars_s": bars[name]})
    record.finish()


if __name__ == "__main__":
    main()
