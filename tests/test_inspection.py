"""What a checkpoint holds and whether it would load (papa_surgery.conversion.inspection)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from conftest import CallCounter, cli  # noqa: F401
from fake_hub import build_tiny_checkpoint

REPO_ROOT = Path(__file__).resolve().parents[1]


def _break(folder: Path, how: str) -> None:
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    if how == "out of range":
        config["papa_constant_heads"] = [[0, 1], [7, 0]]
    elif how == "duplicate":
        config["papa_constant_heads"] = [[0, 1], [0, 1], [1, 0]]
    elif how == "max_length":
        config["papa_max_length"] = 32
    elif how == "null":
        config["papa_constant_heads"] = None
    elif how == "missing slots.py":
        (folder / "slots.py").unlink()
    config_path.write_text(json.dumps(config))


@pytest.mark.parametrize("how", ["out of range", "duplicate", "max_length", "null", "missing slots.py"])
def test_inspect_and_push_refuse_a_checkpoint_that_cannot_load(tmp_path, how, monkeypatch):
    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    assert cli("inspect", folder).exit_code == 0
    _break(folder, how)
    result = cli("inspect", folder)
    assert result.exit_code == 1 and "would not load" in result.output, result.output
    from papa_surgery.conversion.hub import validate_checkpoint

    with pytest.raises(ValueError, match="would not load"):
        validate_checkpoint(folder)
