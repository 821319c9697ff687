"""Whether dense (L, L)-per-head work fits this machine, checked before it starts.

Dense constants cost L^2 values per layer and head, and a pass that averages them over a corpus holds several such
tensors at once (fp64 sums and squares, per-cell counts, the coverage fill's copies: measured 55 bytes a cell at its
peak for a tiny ModernBERT at L = 2,048). At a long L that is more memory than any machine has (a ModernBERT-base at
L = 8,192: 22 x 12 x 8,192^2 cells, a terabyte), and the allocator's own error, or the kernel's OOM killer, would
say nothing of why. So each dense step is checked against this machine's memory first, with the fix named.
"""

from __future__ import annotations

import os
from pathlib import Path

from .. import registry
from ..failures import spell

# Peak bytes per (layer, head, i, j) cell, measured with /usr/bin/time on a tiny ModernBERT at L = 2,048 (rounded
# up): a dense pass over a corpus (calibration, the analyses, distillation's start), and data-free matrices.
CORPUS_PASS = 64
DATA_FREE = 8


def memory_bytes() -> int | None:
    """This machine's memory as a process sees it: the physical memory, or a smaller cgroup limit (containers)."""
    try:
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # not a POSIX system
        return None
    for limit in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            text = Path(limit).read_text().strip()
        except OSError:
            continue
        if text.isdigit():
            total = min(total, int(text))
    return total


def check_dense_fits(what: str, heads: int, max_length: int, per_cell: int, fix: str) -> None:
    """ValueError, before anything is allocated, when dense (L, L) work of ``per_cell`` bytes a cell for ``heads``
    heads would not fit this machine's memory; ``what`` says what the work is, ``fix`` what to do instead."""
    have = memory_bytes()
    cells = heads * max_length**2
    if have is None or cells * per_cell <= have:
        return
    fits = int((have / (heads * per_cell)) ** 0.5)
    raise ValueError(
        f"{what} at L={max_length} needs dense (L, L) matrices for {heads} heads: about "
        f"{cells * per_cell / 1e9:,.0f} GB, more than this machine's {have / 1e9:.0f} GB (dense fits up to about "
        f"L={fits} here); {fix}"
    )


def check_kind_fits(kind: registry.Kind, shape: tuple[int, int], max_length: int) -> None:
    """:func:`check_dense_fits` for making constants of ``kind`` as dense matrices for a model of ``shape`` (layers,
    heads per layer), with the fix each kind has."""
    if kind.made == registry.DATA_FREE:
        what, per_cell = f"building {kind.name} constants", DATA_FREE
        fix = f"build them in the compact structure ({spell('storage', 'compact')}: O(L) values per head)"
    elif kind.made == registry.CALIBRATED:
        what, per_cell = "calibrating the average", CORPUS_PASS
        fix = f"calibrate into the compact structure ({spell('storage', 'compact')}, the default above L=512)"
    else:  # the analyses average, and distillation trains, dense matrices
        what, per_cell = f"making {kind.name} constants", CORPUS_PASS
        smaller = spell("max_length").removesuffix("=...")
        fix = f"use a smaller {smaller}, or the average (it calibrates into the compact structure) or a data-free kind"
    check_dense_fits(what, shape[0] * shape[1], max_length, per_cell, fix)
