"""The results file of a sweep: one JSON line per scored cell, appended and flushed as cells finish.

Probe and fine-tuning rows may share a file: the row's ``protocol`` is part of its resume key.

Shared by ``sweep`` (resume: skip cells already in the file) and ``report`` (tables and figures).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..failures import on_command_line, spell
from ..outputs.overwrite import RESULT_FIELDS
from ..registry import split_healed

logger = logging.getLogger("papa_surgery")

TASK_CORPUS = "task"  # the task's own training texts, labels unused (paper 4.1)
KEY_FIELDS = (*RESULT_FIELDS, "corpus")
DEFAULT_PROTOCOL = "probe"  # rows written before fine-tuning existed are probe rows


def protocol(row: dict) -> str:
    """How a row's score was made: ``probe`` (frozen backbone, the paper's) or ``finetune`` (end to end)."""
    return str(row.get("protocol") or DEFAULT_PROTOCOL)


def cell_key(row: dict) -> tuple:
    """The resume key of a results row: (model, task, fraction, kind, method, seed, corpus, protocol)."""
    corpus = row.get("corpus") or TASK_CORPUS
    return (
        str(row["model"]),
        str(row["task"]),
        round(float(row["fraction"]), 6),
        str(row["kind"]),
        str(row["method"]),
        int(row["seed"]),
        str(corpus),
        protocol(row),
    )


@dataclass(frozen=True)
class Cell:
    """One cell of a sweep: the model, task, conversion (fraction, kind, method, corpus), seed and protocol.

    A results row is a cell's fields plus what scoring it measured; ``key`` is the resume key of both.
    """

    model: str
    task: str
    fraction: float
    kind: str
    method: str
    seed: int
    corpus: str = TASK_CORPUS
    protocol: str = DEFAULT_PROTOCOL

    @property
    def key(self) -> tuple:
        return cell_key(self.fields())

    def fields(self) -> dict:
        """The cell as the leading fields of its results row."""
        return asdict(self)

    def with_protocol(self, name: str) -> Cell:
        return replace(self, protocol=name)

    def describe(self) -> str:
        """A short label for progress bars."""
        return f"{self.task} {self.kind}/{self.method} f={self.fraction:g} seed={self.seed}"


@contextlib.contextmanager
def locked(path: str | Path):
    """Hold an exclusive lock on the results file while a sweep reads and appends to it.

    A second sweep on the same file waits (and says so), then sees the first one's rows and skips them:
    no cell is run or written twice. A results file this sweep created is removed when it ends still empty (a sweep
    that failed before its first row leaves no empty results file; folders it made for it stay).
    (No lock where ``fcntl`` is missing.)
    """
    try:
        import fcntl
    except ImportError:  # pragma: no cover - Windows
        yield
        return
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        handle, created = _open_results(path)
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            logger.warning("%s: another sweep is writing to it; waiting for it to finish", path)
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        if _same_file(path, handle):
            break
        handle.close()  # the sweep it waited for removed the empty file it had made: lock the file there now
    try:
        yield
    finally:
        if created and _same_file(path, handle) and os.fstat(handle.fileno()).st_size == 0:
            path.unlink(missing_ok=True)  # before the lock goes: a sweep waiting on this file then makes its own
        fcntl.flock(handle.fileno(), fcntl.LOCK_UN)
        handle.close()


def _open_results(path: Path):
    """(handle for appending, whether this call created the file): created only by an exclusive create, so a file
    that appeared meanwhile (or a link) is never counted as this sweep's."""
    while True:
        try:
            return open(path, "x", encoding="utf-8"), True
        except FileExistsError:
            pass
        try:
            return open(path, "a", encoding="utf-8"), False
        except FileNotFoundError:
            if path.is_symlink():  # "a" follows the link, "x" refuses it: a link to nothing
                raise ValueError(f"{path} is a symbolic link to {path.resolve()}, which does not exist") from None


def _same_file(path: Path, handle) -> bool:
    """Whether ``path`` (followed, as appends follow it) is still the file ``handle`` has open."""
    try:
        return os.stat(path).st_ino == os.fstat(handle.fileno()).st_ino
    except FileNotFoundError:
        return False


def check_options(rows: list[dict], cell: Cell, options: dict, path) -> None:
    """ValueError when ``path`` holds rows of the same model, task and protocol made with other score-changing
    options."""
    if isinstance(options.get("heal_options"), dict):  # as rows record them, whoever called
        options = {**options, "heal_options": _resolved_heal_options(options["heal_options"])}
    for row in rows:
        if (row.get("model"), row.get("task"), protocol(row)) != (cell.model, cell.task, cell.protocol):
            continue
        recorded = row.get("options")
        if not isinstance(recorded, dict):
            continue  # written before rows recorded their options: cannot be compared
        if split_healed(str(row.get("kind", "")))[0] == "sharpened" and "sharpen_search" not in recorded:
            recorded = {**recorded, "sharpen_search": "walk"}  # fitted before rows recorded it: the default was walk
        if isinstance(recorded.get("heal_options"), dict):  # a field it lacks: its default then, as now
            recorded = {**recorded, "heal_options": _resolved_heal_options(recorded["heal_options"])}
        for name, value in options.items():
            if name in recorded and recorded[name] != value:
                made, run = _difference(name, recorded[name], value)
                raise ValueError(
                    f"{path} holds {cell.task} results of {cell.model} made with {made} (this run: {run}); resume "
                    f"with the same options, or write to another {spell('out')}"
                )


def resolve_heal_options(options: dict) -> dict:
    """Healing options with every field, the defaults filled in and resolved (the learning rate ``None`` stands for,
    the evaluation interval), sorted by name: what rows record, so that a resumed sweep compares like with like
    however many fields either run spelled out. Fields this version does not know (a row of another version) and
    the teacher (a sweep's is its source) are left out."""
    import dataclasses

    from ..options import HealOptions

    known = {f.name for f in dataclasses.fields(HealOptions)} - {"teacher"}
    heal = HealOptions(**{k: v for k, v in options.items() if k in known})
    resolved = {**heal.kwargs(), "lr": heal.learning_rate(), "eval_every": heal.evaluation_interval()}
    return {k: resolved[k] for k in sorted(resolved)}


# How the command line spells a key of a dict-valued option (``heal_options["steps"]`` is ``--heal-steps``).
OPTION_PREFIXES = {"heal_options": "heal_", "distill_options": "distill_"}


def _difference(name: str, recorded, value) -> tuple[str, str]:
    """The recorded and this run's setting of option ``name`` as the user spells them: for a dict-valued option,
    its first key that differs (``--heal-steps 3`` / ``4``; in Python ``heal_options['steps']=3`` / ``4``)."""
    if not (isinstance(recorded, dict) and isinstance(value, dict)):
        return spell(name, recorded), str(value)
    key = next(k for k in sorted({*recorded, *value}, key=str) if recorded.get(k) != value.get(k))
    before, now = recorded.get(key, "unset"), value.get(key, "unset")
    if on_command_line() and name in OPTION_PREFIXES:
        return spell(OPTION_PREFIXES[name] + str(key), before), str(now)
    return f"{name}[{key!r}]={before!r}", repr(now)


def _resolved_heal_options(options: dict) -> dict:
    """:func:`resolve_heal_options`, or ``options`` unchanged where they are not valid options of this version."""
    try:
        return resolve_heal_options(options)
    except (TypeError, ValueError):
        return options


def read_rows(path: str | Path, repair: bool = False) -> list[dict]:
    """Rows of a results file; a torn last line (a sweep killed mid-write) is dropped (and cut off if ``repair``).

    Raises:
        ValueError: a malformed line anywhere but at the end.
    """
    path = Path(path)
    if not path.is_file():
        return []
    data = path.read_bytes()
    lines = data.split(b"\n")
    rows, good_end, offset = [], 0, 0
    for i, line in enumerate(lines):
        end = offset + len(line) + 1
        if line.strip():
            try:
                rows.append(json.loads(line.decode("utf-8")))
                good_end = min(end, len(data))
            except (UnicodeDecodeError, json.JSONDecodeError) as err:
                if any(x.strip() for x in lines[i + 1 :]):
                    what = (
                        f"is not valid UTF-8 (byte {err.start + 1})"
                        if isinstance(err, UnicodeDecodeError)
                        else "is not JSON"
                    )
                    raise ValueError(
                        f"{path}: line {i + 1} {what}; fix or remove that line (a results file holds one JSON row "
                        "per line)"
                    ) from None
                logger.warning("%s: dropping a torn last line (an interrupted write)", path)
                if repair:
                    with open(path, "r+b") as f:
                        f.truncate(good_end)
                break
        offset = end
    return rows


def is_row(row) -> bool:
    """Whether a parsed line is a results row (has every key field but the corpus)."""
    return isinstance(row, dict) and all(k in row for k in RESULT_FIELDS)


def append_row(path: Path, row: dict) -> None:
    """Append one row and flush it to disk, so an interrupted sweep loses at most the cell it was running."""
    line = json.dumps(row, default=_json_default, allow_nan=True)
    with open(path, "a", encoding="utf-8") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


def _json_default(value):
    if hasattr(value, "item"):
        return value.item()
    return str(value)
