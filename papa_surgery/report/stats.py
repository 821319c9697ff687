"""Statistics of a sweep's results: means over seeds with 95% t-intervals, headline curves, relative drops.

Scores are averaged over seeds with a 95% confidence interval from the t-distribution (mean ± t * s / sqrt(n),
as the paper's figures show).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

from ..experiments.results import read_rows

GROUP_FIELDS = ("model", "task", "corpus", "kind", "method", "fraction")


METHOD_PREFERENCE = ("lambda", "variance", "first-to-last", "last-to-first", "random", "reversed-lambda")


def t_critical(df: int, confidence: float = 0.95) -> float:
    """Two-sided critical value of Student's t with ``df`` degrees of freedom (``scipy.stats.t``)."""
    if df < 1:
        raise ValueError("a confidence interval needs at least two seeds (one degree of freedom)")
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, df))


def load_results(path) -> list[dict]:
    """Rows of a results JSONL file (a torn last line of an interrupted sweep is skipped).

    Raises:
        FileNotFoundError: the file does not exist.
        ValueError: a line other than the last is not JSON.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"results file {str(path)!r} does not exist (write one with papa-surgery probe)")
    return read_rows(path)


def _corpus(row: dict) -> str:
    return str(row.get("corpus") or "task")


def group_key(row: dict) -> tuple:
    """The (model, task, corpus, kind, method, fraction) group of a results row or a summary entry."""
    key = tuple(_corpus(row) if f == "corpus" else row.get(f) for f in GROUP_FIELDS)
    return (*key[:-1], round(float(key[-1]), 6))


def summarize(rows) -> list[dict]:
    """Mean and 95% t-interval over seeds per (model, task, corpus, kind, method, fraction).

    A seed that appears twice in a group counts once (the last row wins). Returns one dict per group, in
    the order groups first appear: the group fields, ``kept_fraction``, ``metric``, ``n``, ``seeds``,
    ``scores``, ``mean``, ``std`` (sample), ``ci95`` (half-width; ``None`` for a single seed), ``low``, ``high``,
    ``sizes`` (the (training, evaluation) example counts of its rows) and ``one_class_seeds`` (seeds whose model
    predicted one class for every example: a degenerate model).
    """
    groups: dict[tuple, dict] = {}
    metric: dict[tuple, str] = {}
    sizes: dict[tuple, set] = {}
    one_class: dict[tuple, set] = {}
    for row in rows:
        if row.get("score") is None:
            continue
        key = group_key(row)
        groups.setdefault(key, {})[int(row.get("seed", 0))] = float(row["score"])
        metric[key] = row.get("metric")
        sizes.setdefault(key, set()).add((row.get("examples"), row.get("eval_examples")))
        if row.get("predicted_classes") == 1:
            one_class.setdefault(key, set()).add(int(row.get("seed", 0)))
    out = []
    for key, by_seed in groups.items():
        seeds = sorted(by_seed)
        scores = [by_seed[s] for s in seeds]
        n = len(scores)
        mean = statistics.fmean(scores)
        std = statistics.stdev(scores) if n > 1 else None
        ci = t_critical(n - 1) * std / math.sqrt(n) if n > 1 else None
        entry = dict(zip(GROUP_FIELDS, key, strict=True))
        entry.update(
            kept_fraction=round(1.0 - entry["fraction"], 6),
            metric=metric[key],
            n=n,
            seeds=seeds,
            scores=scores,
            mean=mean,
            std=std,
            ci95=ci,
            low=None if ci is None else mean - ci,
            high=None if ci is None else mean + ci,
            sizes=sorted(sizes[key], key=str),  # (training, evaluation) examples of its rows
            one_class_seeds=sorted(one_class.get(key, ())),  # seeds whose model predicted a single class
        )
        out.append(entry)
    return out


def ordered(values) -> list:
    seen = []
    for v in values:
        if v not in seen:
            seen.append(v)
    return seen


def prefer(values, order) -> str | None:
    values = list(values)
    for v in order:
        if v in values:
            return v
    return values[0] if values else None


def pick(summary: list[dict], **match) -> dict | None:
    """The first summary entry matching every given field (``None`` values are wildcards)."""
    for e in summary:
        if all(
            v is None or (round(e[k], 6) == round(v, 6) if k == "fraction" else e[k] == v) for k, v in match.items()
        ):
            return e
    return None


def main_curves(summary: list[dict]) -> list[dict]:
    """Entries of the headline curve per (model, task): average constants (else the first kind), the preferred
    method, the first corpus."""
    out = []
    for model in ordered(e["model"] for e in summary):
        for task in ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            kind = prefer((e["kind"] for e in sub), ("average",))
            method = prefer((e["method"] for e in sub if e["kind"] == kind), METHOD_PREFERENCE)
            corpus = prefer((e["corpus"] for e in sub), ("task",))
            out += [e for e in sub if e["kind"] == kind and e["method"] == method and e["corpus"] == corpus]
    return out


def relative_drops(rows) -> list[dict]:
    """Per model: mean original score over tasks and mean relative drop (orig - attention-free) / |orig| (Fig. 3).

    Uses the tasks that have both fraction 0 and fraction 1 (headline kind/method/corpus).
    """
    summary = main_curves(summarize(rows))
    out = []
    for model in ordered(e["model"] for e in summary):
        origs, drops, tasks = [], [], []
        for task in ordered(e["task"] for e in summary if e["model"] == model):
            sub = [e for e in summary if e["model"] == model and e["task"] == task]
            orig, free = pick(sub, fraction=0.0), pick(sub, fraction=1.0)
            if orig is None or free is None or orig["mean"] == 0:
                continue
            origs.append(orig["mean"])
            drops.append((orig["mean"] - free["mean"]) / abs(orig["mean"]))
            tasks.append(task)
        if tasks:
            out.append(
                dict(model=model, tasks=tasks, original=statistics.fmean(origs), relative_drop=statistics.fmean(drops))
            )
    return out
