"""Side-by-side timing shared by the benchmarks: interleaved repeats, the median of each."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(
    calls: dict[str, Callable[[], object]], repeats: int, clock: Callable[[], float] = time.perf_counter
) -> dict[str, float]:
    """Median seconds of each call over ``repeats`` rounds that run every call once, after one warm-up each.

    Alternating the calls within each round spreads any drift in the machine's load over all of them alike,
    so their ratios stay fair on a busy machine. ``clock`` is wall time by default; ``time.thread_time`` (with
    torch on one thread) counts only the CPU time the calls themselves get, for comparisons on a crowded machine.
    """
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = clock()
            call()
            times[name].append(clock() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}
