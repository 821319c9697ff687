"""Which columns of a table hold a corpus's text, and whether a .tsv file is a table at all."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from ..failures import on_command_line, spell

TEXT_COLUMNS = ("text", "sentence", "content", "document")
PAIR_COLUMNS = (("sentence1", "sentence2"), ("premise", "hypothesis"), ("question", "sentence"), ("text_a", "text_b"))


def text_columns(column_names: Iterable[str], pairs: bool, columns: Iterable[str] | None) -> tuple[str, ...]:
    """The column(s) of ``column_names`` holding the text (``columns`` if given, else a usual name); ValueError."""
    names = list(column_names)
    if columns:
        cols = tuple(columns)
        missing = [c for c in cols if c not in names]
        if missing:
            raise ValueError(f"corpus has no column {missing[0]!r}; its columns are {names}")
        if len(cols) != (2 if pairs else 1):
            raise ValueError(f"{spell('pairs', True)} needs two columns, a single corpus one; got {list(cols)}")
        return cols
    candidates = PAIR_COLUMNS if pairs else tuple((c,) for c in TEXT_COLUMNS)
    for cols in candidates:
        if all(c in names for c in cols):
            return cols
    want = "two text columns (e.g. sentence1, sentence2)" if pairs else f"a text column ({', '.join(TEXT_COLUMNS)})"
    how = "rename the column(s) in the file" if on_command_line() else "name them with columns=[...]"
    raise ValueError(f"corpus needs {want}; its columns are {names}: {how}")


def is_table(path: Path) -> bool:
    """A .tsv whose first line is a header: more fields than a pair, or a usual text column's name (GLUE's files).
    Other .tsv files are text: one example per line, a TAB between a pair's sentences."""
    if path.suffix != ".tsv":
        return False
    with path.open(encoding="utf-8", errors="replace") as f:
        fields = f.readline().rstrip("\r\n").split("\t")
    return len(fields) > 2 or any(f in TEXT_COLUMNS or any(f in p for p in PAIR_COLUMNS) for f in fields)
