"""Load a task's split, from the Hub (default) or from local files in their standard formats.

Local formats (``--data-dir``, laid out like ``../shared/data``): GLUE TSV with or without a header,
the MultiNLI CSV, CoNLL-2003 space-separated columns (IOB2), CoNLL-U and raw WikiText token files.
Every path raises a ``ValueError`` naming the file and the fix for a missing split, a missing column
or a label outside the task's label set.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from ..failures import ArgumentError, spell
from .registry import MLM, TOKEN, Task, get_task


@dataclass
class Split:
    """One split of a task.

    ``texts``: str per example (sentence / mlm), ``(str, str)`` (pairs) or a list of words (token tasks).
    ``labels``: an int per example, a list of ints per example (token tasks), or ``None`` (mlm).
    """

    texts: list
    labels: list | None
    source: str

    def __len__(self) -> int:
        return len(self.texts)

    def head(self, n: int | None) -> Split:
        """The first ``n`` examples (all when ``n`` is None)."""
        if n is None or n >= len(self):
            return self
        return Split(self.texts[:n], None if self.labels is None else self.labels[:n], f"{self.source}[:{n}]")


def load_split(
    task: str | Task, split: str, data_dir: str | Path | None = None, max_examples: int | None = None
) -> Split:
    """Read ``split`` ("train" or "eval") of ``task``.

    Args:
        task: a registered task name or :class:`Task`.
        split: "train" or "eval".
        data_dir: a local folder laid out like ``../shared/data`` (``glue/sst2/train.tsv``, ...); ``None``
            loads the Hub dataset through ``datasets.load_dataset``.
        max_examples: keep only the first examples (as ``run_glue``'s ``--max_train_samples``).
    """
    task = get_task(task)
    if split not in task.local.files and split not in task.hub.splits:
        raise ValueError(f"task {task.name!r} has no {split!r} split (it has {', '.join(task.hub.splits)})")
    out = _load_local(task, split, Path(data_dir)) if data_dir is not None else _load_hub(task, split)
    if len(out) == 0:
        raise ValueError(f"{out.source}: no examples for task {task.name!r} split {split!r}")
    return out.head(max_examples)


# ---------------------------------------------------------------------------------------------- labels
def _label_id(value, task: Task, where: str) -> int:
    """Label name or index -> index in ``task.label_names``."""
    names = task.label_names
    if isinstance(value, str):
        value = value.strip()
        if value in names:
            return names.index(value)
        if value.lstrip("-").isdigit():
            value = int(value)
    if isinstance(value, int) and 0 <= value < len(names):
        return value
    raise ValueError(
        f"{where}: label {value!r} is outside the label set of task {task.name!r} "
        f"({', '.join(names)} or their indices 0..{len(names) - 1})"
    )


# ---------------------------------------------------------------------------------------------- local
def _local_path(task: Task, split: str, data_dir: Path) -> Path:
    rel = task.local.files.get(split)
    if rel is None:
        raise ValueError(f"task {task.name!r} has no local {split!r} split")
    for candidate in (data_dir / rel, data_dir / Path(rel).name):
        if candidate.is_file():
            return candidate
    raise ValueError(
        f"task {task.name!r}: the {split!r} split is missing from {data_dir}: expected {data_dir / rel} "
        f"(or {Path(rel).name} directly inside {data_dir}); point {spell('data_dir')} at a folder laid out like "
        f"../shared/data, or leave it out to use the Hub dataset {task.hub.path!r}"
    )


def _load_local(task: Task, split: str, data_dir: Path) -> Split:
    if not data_dir.is_dir():
        raise ArgumentError("data_dir", f"{data_dir} is not a folder")
    path = _local_path(task, split, data_dir)
    return READERS[task.local.reader](task, path, **task.local.options)


def _read_glue_tsv(task: Task, path: Path, header: bool, text: tuple, label) -> Split:
    with open(path, encoding="utf-8-sig", newline="") as f:
        rows = [line.rstrip("\r\n").split("\t") for line in f if line.strip()]
    if not rows:
        raise ValueError(f"{path} is empty; expected {'a header line and ' if header else ''}one example per line")
    if header:
        columns = rows.pop(0)
        missing = [c for c in (*text, label) if c not in columns]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing} for task {task.name!r}; the header has {columns}")
        idx = [columns.index(c) for c in text]
        label_idx = columns.index(label)
    else:
        idx, label_idx = list(text), label
    width = max(*idx, label_idx) + 1
    texts, labels = [], []
    for n, row in enumerate(rows, start=2 if header else 1):
        if len(row) < width:
            raise ValueError(f"{path}:{n}: expected at least {width} tab-separated columns, got {len(row)}")
        parts = [row[i].strip() for i in idx]
        texts.append(parts[0] if len(parts) == 1 else tuple(parts))
        labels.append(_label_id(row[label_idx], task, f"{path}:{n}"))
    return Split(texts, labels, str(path))


def _read_mnli_csv(task: Task, path: Path, text: tuple, label: str, skip_labels: tuple = ()) -> Split:
    with open(path, encoding="utf-8", newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in (*text, label) if c not in (reader.fieldnames or [])]
        if missing:
            raise ValueError(f"{path}: missing column(s) {missing}; the header has {reader.fieldnames}")
        texts, labels = [], []
        for n, row in enumerate(reader, start=2):
            if row[label] in skip_labels:
                continue
            texts.append(tuple(row[c].strip() for c in text))
            labels.append(_label_id(row[label], task, f"{path}:{n}"))
    return Split(texts, labels, str(path))


def _sentences(path: Path, sep: str | None, skip):
    """Yield (line number, [columns per token]) per blank-line-separated sentence."""
    rows, start = [], None
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            line = line.rstrip("\r\n")
            if not line.strip():
                if rows:
                    yield start, rows
                rows = []
                continue
            if skip(line):
                continue
            if not rows:
                start = n
            rows.append((n, line.split(sep)))
    if rows:
        yield start, rows


def _read_columns(task: Task, path: Path, column: int, sep: str | None, skip, keep) -> Split:
    texts, labels = [], []
    for _, rows in _sentences(path, sep, skip):
        words, tags = [], []
        for n, cols in rows:
            if not keep(cols):
                continue
            if len(cols) <= column:
                raise ValueError(
                    f"{path}:{n}: expected at least {column + 1} columns for task {task.name!r}, got {len(cols)}"
                )
            words.append(cols[0] if sep is None else cols[1])
            tags.append(_label_id(cols[column], task, f"{path}:{n}"))
        if words:
            texts.append(words)
            labels.append(tags)
    return Split(texts, labels, str(path))


def _read_conll(task: Task, path: Path, column: int) -> Split:
    return _read_columns(task, path, column, None, lambda line: line.startswith("-DOCSTART-"), lambda cols: True)


def _read_conllu(task: Task, path: Path, column: int) -> Split:
    # Multiword-token ranges (1-2) and empty nodes (8.1) carry no UPOS of their own.
    return _read_columns(task, path, column, "\t", lambda line: line.startswith("#"), lambda cols: cols[0].isdigit())


def _read_wikitext(task: Task, path: Path) -> Split:
    with open(path, encoding="utf-8") as f:
        texts = [_detok(line) for line in f if line.strip() and not line.strip().startswith("=")]
    return Split(texts, None, str(path))


def _detok(line: str) -> str:
    """Undo WikiText's ``@-@`` style number/hyphen splitting."""
    return line.strip().replace(" @-@ ", "-").replace(" @,@ ", ",").replace(" @.@ ", ".")


READERS = {
    "glue_tsv": _read_glue_tsv,
    "mnli_csv": _read_mnli_csv,
    "conll": _read_conll,
    "conllu": _read_conllu,
    "wikitext": _read_wikitext,
}


# ---------------------------------------------------------------------------------------------- hub
def _load_hub(task: Task, split: str) -> Split:
    import datasets

    hub = task.hub
    name = hub.splits[split]
    source = f"{hub.path}{':' + hub.config if hub.config else ''}:{name}"
    ds = datasets.load_dataset(hub.path, hub.config, split=name)
    fields = [*hub.text_fields, *([hub.label_field] if hub.label_field else [])]
    missing = [c for c in fields if c not in ds.column_names]
    if missing:
        raise ValueError(f"{source}: missing column(s) {missing}; it has {ds.column_names}")
    if task.kind == MLM:
        texts = [_detok(t) for t in ds[hub.text_fields[0]] if t.strip() and not t.strip().startswith("=")]
        return Split(texts, None, source)
    feature = ds.features[hub.label_field]
    feature = getattr(feature, "feature", feature)  # Sequence(ClassLabel) -> ClassLabel
    names = getattr(feature, "names", None)

    def to_id(value, n):
        if names is not None and isinstance(value, int) and value >= 0:
            value = names[value]
        return _label_id(value, task, f"{source} row {n}")

    if task.pairs:
        texts = list(zip(ds[hub.text_fields[0]], ds[hub.text_fields[1]], strict=False))
    else:
        texts = list(ds[hub.text_fields[0]])
    raw = ds[hub.label_field]
    keep = [i for i, v in enumerate(raw) if not (isinstance(v, int) and v < 0)]  # GLUE test: -1
    texts = [texts[i] for i in keep]
    if task.kind == TOKEN:
        labels = [[to_id(v, i) for v in raw[i]] for i in keep]
    else:
        labels = [to_id(raw[i], i) for i in keep]
    return Split(texts, labels, source)


def task_split(task, split: str, data_dir, max_examples=None) -> Split:
    """:func:`load_split`, with the fix named when the Hub dataset cannot be reached (offline, no network)."""
    from ..options import spell

    task = get_task(task)
    try:
        return load_split(task, split, data_dir, max_examples)
    except OSError as err:  # ConnectionError, offline mode
        if data_dir is not None:
            raise
        raise ValueError(
            f"task {task.name!r}: the Hub dataset could not be reached ({str(err).splitlines()[0]}); pass "
            f"{spell('data_dir')} with local files (e.g. {spell('data_dir', '../shared/data')})"
        ) from None
