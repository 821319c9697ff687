"""What a fine-tuning cell costs: peak memory while it runs, parameter counts and checkpoint size."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import torch


def _rss_bytes() -> int | None:
    """This process's resident memory now (Linux ``/proc``), else ``None``."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


class PeakMemory:
    """Peak memory of the code inside ``with``: CUDA's allocator peak on a GPU, else resident memory
    sampled every ``interval`` seconds (a process-wide peak, so it includes the model and data).

    After the block, ``mb`` is the peak in MiB and ``kind`` says which measure it is.
    """

    def __init__(self, device: torch.device, interval: float = 0.05):
        self.device, self.interval = torch.device(device), interval
        self.peak = 0
        self.kind = "cuda_allocated" if self.device.type == "cuda" else "cpu_rss"
        self._stop = threading.Event()
        self._thread = None

    def __enter__(self) -> PeakMemory:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        else:
            self.peak = _rss_bytes() or 0
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self) -> None:
        while not self._stop.wait(self.interval):
            self.peak = max(self.peak, _rss_bytes() or 0)

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            self.peak = torch.cuda.max_memory_allocated(self.device)
        else:
            self._stop.set()
            self._thread.join()
            self.peak = max(self.peak, _rss_bytes() or 0)

    @property
    def mb(self) -> float | None:
        return round(self.peak / 2**20, 1) if self.peak else None


def parameter_counts(model: torch.nn.Module) -> tuple[int, int]:
    """(trainable, total) parameters (tied weights counted once)."""
    seen, trainable, total = set(), 0, 0
    for p in model.parameters():
        if id(p) in seen:
            continue
        seen.add(id(p))
        total += p.numel()
        trainable += p.numel() if p.requires_grad else 0
    return trainable, total


def folder_bytes(folder: str | Path, pattern: str = "*.safetensors") -> int:
    """Bytes of a checkpoint folder's weight files."""
    return sum(p.stat().st_size for p in Path(folder).glob(pattern))
