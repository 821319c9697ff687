"""Benchmark results with their provenance: what was measured, where, with what, by which command.

``with recorded("bench_long", args) as record:`` runs a benchmark's body with its printed output teed into the
record; ``record.add(row)`` adds a result row (a dict). With ``--save`` (``add_save_option``), leaving the block
writes ``benchmarks/results/<name>.json`` (the rows and the provenance: machine, CPU count, torch threads, torch /
transformers / Python versions, the git commit and whether the tree had changes, the command line, the date) and
``<name>.txt`` (the provenance as a header, then exactly what was printed). The docs cite those files; a test checks
that every cited file exists.
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import io
import json
import os
import platform
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def add_save_option(parser) -> None:
    """``--save``: write the results and their provenance under ``benchmarks/results/``."""
    parser.add_argument("--save", action="store_true", help="write results/<benchmark>.json and .txt (provenance)")


def provenance() -> dict:
    """Where and with what a benchmark ran."""
    import torch
    import transformers

    root = Path(__file__).resolve().parents[1]

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=False)
        return done.stdout.strip()

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else None
    return {
        "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
        "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        "commit": git("rev-parse", "--short", "HEAD") or None,
        "tree_changed": bool(git("status", "--porcelain", "--untracked-files=no")),
        "machine": {
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "memory_gb": None if memory is None else round(memory / 1e9, 1),
        },
        "torch_threads": torch.get_num_threads(),
        "versions": {
            "torch": torch.__version__,
            "transformers": transformers.__version__,
            "python": sys.version.split()[0],
        },
    }


class Record:
    """The rows a benchmark adds, and what it printed."""

    def __init__(self, name: str):
        self.name, self.rows, self.printed = name, [], io.StringIO()

    def add(self, row: dict) -> None:
        self.rows.append(row)


class _Tee(io.TextIOBase):
    def __init__(self, *streams):
        self.streams = streams

    def write(self, text: str) -> int:
        for stream in self.streams:
            stream.write(text)
        return len(text)

    def flush(self) -> None:
        for stream in self.streams:
            stream.flush()


@contextlib.contextmanager
def recorded(name: str, save: bool) -> Iterator[Record]:
    """Run a benchmark's body with its output teed into a :class:`Record`; with ``save``, write the result files."""
    record = Record(name)
    stdout = sys.stdout
    sys.stdout = _Tee(stdout, record.printed)
    try:
        yield record
    finally:
        sys.stdout = stdout
    if save:
        RESULTS.mkdir(exist_ok=True)
        facts = provenance()
        (RESULTS / f"{name}.json").write_text(json.dumps({**facts, "rows": record.rows}, indent=2) + "\n")
        header = "\n".join(f"# {key}: {value}" for key, value in facts.items())
        (RESULTS / f"{name}.txt").write_text(header + "\n\n" + record.printed.getvalue())
        print(f"saved {RESULTS / name}.json and .txt")
