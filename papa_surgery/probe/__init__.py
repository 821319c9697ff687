"""Probing (paper sec. 3.3): score a frozen encoder on a task with the paper's probe.

A leaf package: it knows nothing of ranking or conversion. Entry point: :func:`probe`.

    from papa_surgery.probe import probe
    result = probe(model, tokenizer, "sst2", data_dir="../shared/data", max_train_examples=2000)
"""

from .data import Split, load_split
from .heads import SentenceProbe, TokenProbe, build_head
from .run import FeatureCache, probe, slot_count
from .tasks import TASKS, HubSource, LocalSource, Task, get_task

__all__ = [
    "FeatureCache",
    "TASKS",
    "HubSource",
    "LocalSource",
    "SentenceProbe",
    "Split",
    "Task",
    "TokenProbe",
    "build_head",
    "get_task",
    "load_split",
    "probe",
    "slot_count",
]
