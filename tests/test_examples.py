"""The examples' own helpers (examples/demo.py)."""

from __future__ import annotations

from pathlib import Path

from conftest import CallCounter, cli  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_demo_times_both_models_warm_and_interleaved_with_medians():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", REPO_ROOT / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    log, now = [], [0.0]

    def clock():
        return now[0]

    def model(name, cost):
        def run():
            log.append(name)
            now[0] += cost.pop(0) if cost else 1.0

        return run

    costs = {"source": [9, 9, 3, 1, 2], "papa": [9, 9, 1, 5, 2]}  # two warm-up calls each, then 3 timed
    result = demo.time_interleaved(
        {"source": model("source", costs["source"]), "papa": model("papa", costs["papa"])},
        repeats=3,
        warmup=2,
        clock=clock,
    )
    assert log == ["source", "papa"] * 5  # warm-up for both first, then alternating timed calls
    assert result == {"source": 2, "papa": 2}  # medians, not the first (cold) or the best call
    assert "time_interleaved(" in demo.COMPARE.split("def time_interleaved", 1)[1]


def test_demo_says_slower_when_the_converted_model_is_slower():
    import importlib.util

    spec = importlib.util.spec_from_file_location("demo", REPO_ROOT / "examples" / "demo.py")
    demo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(demo)
    assert demo.speed_words(1.19) == "1.19x faster"
    assert demo.speed_words(0.67) == "1.49x slower"  # never "0.67x faster"
    assert demo.speed_words(1.001) == "as fast"
