"""A healing run's resume state: one safetensors file, replaced whole at every evaluation.

It holds the trained parameters, AdamW's moments and step counts, the scheduler's position, the history so far and
a key naming what the run is (the student's weights, the teacher, the corpus, every option, the process count).
The file is written beside the output under a hidden name and moved into place with one rename, so a run killed at
any moment leaves either the previous state or the new one, never half of one. A run whose key differs starts
afresh (and says why); the state is removed once the healed checkpoint is written. No pickle: tensors in
safetensors, the rest JSON in its metadata.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
from collections.abc import Iterator
from pathlib import Path

import torch

logger = logging.getLogger("papa_surgery")
SUFFIX = ".papa-heal-state.safetensors"


def state_path(out_dir: str | Path) -> Path:
    """Where the resume state of a run writing ``out_dir`` lives: a hidden file beside it."""
    out_dir = Path(out_dir)
    return out_dir.with_name(f".{out_dir.name}{SUFFIX}")


def run_key(*parts) -> str:
    """A digest of what identifies a run (JSON-able parts)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


class HealState:
    """The resume state at ``path`` for the run identified by ``key``."""

    def __init__(self, path: str | Path, key: str):
        self.path, self.key = Path(path), key

    def save(self, trainable, optimizer, scheduler, history: dict, step: int) -> None:
        """Replace the state with the one after ``step`` (rank 0 writes; every process holds the same values)."""
        from safetensors.torch import save_file

        from ..distributed import is_main_process
        from ..outputs.staging import staged_file

        if not is_main_process():
            return
        tensors, moments = {}, {}
        names = {id(p): name for name, p in trainable.parameters.items()}
        for name, p in trainable.parameters.items():
            tensors[f"param.{name}"] = p.detach().cpu().contiguous()
        for p, values in optimizer.state.items():
            for field in ("exp_avg", "exp_avg_sq"):
                tensors[f"{field}.{names[id(p)]}"] = values[field].detach().cpu().contiguous()
            moments[names[id(p)]] = float(values["step"])
        meta = {"key": self.key, "step": step, "moments": moments, "scheduler": scheduler.state_dict(),
                "history": history}  # fmt: skip
        with staged_file(self.path, overwrite=True) as tmp:
            save_file(tensors, str(tmp), metadata={"papa_heal_state": json.dumps(meta, default=float)})

    @staticmethod
    def is_state(path: str | Path) -> bool:
        """Whether ``path`` is a healing run's state file (a safetensors file with its metadata)."""
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                return "papa_heal_state" in (f.metadata() or {})
        except Exception:  # not a file, not safetensors: not a state
            return False

    @staticmethod
    def check_path(path: str | Path) -> None:
        """ValueError unless ``path`` is free for a state: nothing there yet, or a healing run's state (which is
        replaced at every evaluation, so nothing else may be)."""
        from ..failures import ArgumentError

        path = Path(path)
        if (path.exists() or path.is_symlink()) and not HealState.is_state(path):
            what = "a folder" if path.is_dir() else "a file that is not a healing run's state"
            raise ArgumentError(
                "state_path",
                f"{str(path)!r} is {what}; a state is replaced at every evaluation, so pass a path of its own (one "
                "that does not exist yet, or an earlier run's state)",
            )

    @staticmethod
    @contextlib.contextmanager
    def said_when_stopped(path: str | Path | None) -> Iterator[None]:
        """Within it, a run stopped by an error or an interrupt says where its resume state is kept, and how big it
        is (it is hidden beside the output: the user would not find it, or know to delete it)."""
        try:
            yield
        except BaseException:
            from ..distributed import is_main_process

            if path is not None and Path(path).is_file() and is_main_process():
                logger.warning(
                    "the resume state of this healing run is kept at %s (%.0f MB): the same command resumes from its "
                    "last evaluation; delete it to start afresh",
                    path,
                    Path(path).stat().st_size / 2**20,
                )
            raise

    def restore(self, trainable, optimizer, scheduler, history: dict) -> bool:
        """Load the saved state into the run if it is this run's; whether it was."""
        from safetensors import safe_open

        from ..distributed import broadcast_from_main

        if not broadcast_from_main(self.path.is_file()):
            return False
        with safe_open(str(self.path), framework="pt") as f:
            meta = json.loads((f.metadata() or {}).get("papa_heal_state", "{}"))
            if meta.get("key") != self.key:
                logger.warning("%s is the state of a healing run with other settings: starting afresh", self.path)
                return False
            tensors = {name: f.get_tensor(name) for name in f.keys()}
        params = trainable.parameters
        with torch.no_grad():
            for name, p in params.items():
                p.copy_(tensors[f"param.{name}"])
        by_id = {id(p): name for name, p in params.items()}
        for group in optimizer.param_groups:
            for p in group["params"]:
                name = by_id[id(p)]
                if name in meta["moments"]:
                    optimizer.state[p] = {
                        "step": torch.tensor(meta["moments"][name]),
                        "exp_avg": tensors[f"exp_avg.{name}"].to(p.device),
                        "exp_avg_sq": tensors[f"exp_avg_sq.{name}"].to(p.device),
                    }
        scheduler.load_state_dict(meta["scheduler"])
        for group, lr in zip(optimizer.param_groups, scheduler.get_last_lr(), strict=True):
            group["lr"] = lr  # the rate of the next step (loading the scheduler does not set it)
        history.update(meta["history"])
        history["resumed_from"] = int(meta["step"])
        return True

    def remove(self) -> None:
        from ..distributed import is_main_process

        if is_main_process() and self.is_state(self.path):  # never a file the run did not write
            self.path.unlink(missing_ok=True)
