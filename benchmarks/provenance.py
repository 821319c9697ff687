"""Benchmark results with their provenance: what was measured, where, with what, by which command.

``with recorded("bench_long", args.save) as record:`` (or ``record = start_record(...)`` ... ``record.finish()``) runs a
benchmark's body with its printed output teed into the record; ``record.add(row)`` adds a result row (a dict).
With ``--save`` (``add_save_option``), a completed run writes ``benchmarks/results/<name>.json`` (the rows, the
printed lines and the provenance: machine, CPU count, torch threads, torch / transformers / Python versions, the git
commit and whether the tree had changes, the command line, the date) and ``<name>.txt`` (the provenance as a
header, then exactly what was printed). The docs cite those files; a test checks that every cited file exists.
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
    """``--save [TAG]``: write the results and their provenance under ``benchmarks/results/`` (``<benchmark>.json``,
    or ``<benchmark>-<TAG>.json`` for one configuration of several: ``--save mpnet-fraction-0.5``)."""
    parser.add_argument(
        "--save", nargs="?", const="", default=None, metavar="TAG",
        help="write results/<benchmark>[-TAG].json and .txt (the results with their provenance)",
    )  # fmt: skip


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
    """The rows a benchmark adds, and what it printed (stdout is teed into it until :meth:`finish`)."""

    def __init__(self, name: str, save: str | bool | None):
        tag = save if isinstance(save, str) else ""
        self.name = f"{name}-{tag}" if tag else name
        self.save = save is not None and save is not False  # --save: "" (no tag) or a tag
        self.rows, self.printed = [], io.StringIO()
        self._stdout = sys.stdout
        sys.stdout = _Tee(self._stdout, self.printed)

    def add(self, row: dict) -> None:
        self.rows.append(row)

    def finish(self) -> None:
        """Stop teeing stdout; with ``save``, write ``results/<name>.json`` and ``.txt``."""
        sys.stdout = self._stdout
        if not self.save:
            return
        RESULTS.mkdir(exist_ok=True)
        facts = provenance()
        printed = self.printed.getvalue()
        data = {**facts, "rows": self.rows, "printed": printed.splitlines()}
        (RESULTS / f"{self.name}.json").write_text(json.dumps(data, indent=2, default=str) + "\n")
        header = "\n".join(f"# {key}: {value}" for key, value in facts.items())
        (RESULTS / f"{self.name}.txt").write_text(header + "\n\n" + printed)
        print(f"saved {RESULTS / self.name}.json and .txt")


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


def start_record(name: str, save: str | bool | None) -> Record:
    """A :class:`Record` of the benchmark ``name``: call ``record.finish()`` when it is done (nothing is written if
    it fails before)."""
    return Record(name, save)


@contextlib.contextmanager
def recorded(name: str, save: str | bool | None) -> Iterator[Record]:
    """Run a benchmark's body with its output teed into a :class:`Record`; with ``save``, write the result files
    when the body completes."""
    record = start_record(name, save)
    try:
        yield record
    except BaseException:
        record.save = False  # a failed run writes no results
        raise
    finally:
        record.finish()
