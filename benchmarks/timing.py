"""Side-by-side timing shared by the benchmarks: interleaved repeats, the median of each."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable


def interleaved_medians(calls: dict[str, Callable[[], object]], repeats: int) -> dict[str, float]:
    """Median seconds of each call over ``repeats`` rounds that run every call once, after one warm-up each.

    Alternating the calls within each round spreads any drift in the machine's load over all of them alike,
    so their ratios stay fair on a busy machine.
    """
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(repeats):
        for name, call in calls.items():
            start = time.perf_counter()
            call()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(ts) for name, ts in times.items()}
