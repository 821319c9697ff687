"""Writing a constants file: one safetensors file, staged and checked, for dense and structured constants alike."""

from __future__ import annotations

from pathlib import Path

from safetensors.torch import save_file

from ..outputs.overwrite import check_file
from ..outputs.staging import staged_file


def write_constants_file(path: str | Path, overwrite: bool, tensors: dict, meta: dict) -> Path:
    """Write a constants safetensors file atomically: an existing file is replaced only when it is a constants file
    papa-surgery wrote, checked again at the end (it may have changed meanwhile; ``papa_surgery.outputs``)."""
    path = check_file(path, overwrite, "constants", argument="path")

    def check(target: Path) -> None:
        check_file(target, overwrite, "constants", argument="path")

    with staged_file(path, overwrite, check=check) as tmp:
        save_file(tensors, str(tmp), metadata=meta)
    return path
