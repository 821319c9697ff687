"""Labelled tasks, shared by probing, fine-tuning and the lambda ranking: the registry, data loading, metrics.

A task is data (lm-evaluation-harness style): where its splits live, which fields hold text and labels, its
metric and the paper's probe hyperparameters (App. B). ``get_task("sst2")``; ``load_split(task, "train",
data_dir)``; ``score(metric, labels, predictions)``.
"""

from .data import Split, load_split, task_split
from .metrics import score
from .registry import MLM, SENTENCE, TASKS, TOKEN, HubSource, LocalSource, Task, get_task

__all__ = [
    "MLM",
    "SENTENCE",
    "TASKS",
    "TOKEN",
    "HubSource",
    "LocalSource",
    "Split",
    "Task",
    "get_task",
    "load_split",
    "score",
    "task_split",
]
