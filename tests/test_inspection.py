"""What a checkpoint holds and whether it would load (papa_surgery.conversion.inspection)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner
from conftest import CallCounter, cli  # noqa: F401
from fake_hub import build_tiny_checkpoint

from papa_surgery.cli import main
from papa_surgery.conversion.description import format_description, head_grid_lines
from papa_surgery.conversion.inspection import describe

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


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder, _, _ = build_tiny_checkpoint(tmp_path_factory.mktemp("inspect") / "tiny-papa")
    return folder


@pytest.fixture
def folder(built, tmp_path):
    return Path(shutil.copytree(built, tmp_path / "tiny-papa"))


def test_the_head_grid_keeps_two_digit_heads_apart():
    """12 heads: the header reads 0 ... 11 as twelve columns ("91011" ran together), each mark under its head."""
    grid = [[h % 5 == 0 for h in range(12)], [h == 11 for h in range(12)]]
    lines = head_grid_lines({"num_heads": 12, "grid": grid})
    header = lines[0].split()
    assert header == ["layer", *map(str, range(12))]
    for layer, line in enumerate(lines[1:]):
        assert line.split() == [str(layer), *("C" if c else "." for c in grid[layer])]
        for head in range(12):  # every mark ends where its head number ends
            end = _column_ends(lines[0])[head]
            assert line[end - 1] == ("C" if grid[layer][head] else ".")


def _column_ends(header: str) -> list[int]:
    ends, inside = [], False
    for i, char in enumerate(header + " "):
        if char != " " and not inside:
            inside = True
        elif char == " " and inside:
            inside = False
            ends.append(i)
    return ends[1:]  # after "layer"


@pytest.mark.parametrize("keep", [0.5, 20])
def test_a_truncated_weights_file_is_named(folder, keep):
    weights = folder / "model.safetensors"
    size = weights.stat().st_size
    with weights.open("r+b") as f:
        f.truncate(int(size * keep) if keep < 1 else keep)  # cut in the data, or in the header
    d = describe(folder)
    assert any(f"{weights} cannot be read, it is truncated or damaged" in p for p in d["problems"]), d["problems"]
    result = CliRunner().invoke(main, ["inspect", str(folder)])
    assert result.exit_code == 1 and "model.safetensors cannot be read" in result.output, result.output
    assert "would not load" in result.output and "Error while deserializing" in result.output


def test_inspect_says_what_the_constants_were_calibrated_on_in_plain_words(folder):
    text = format_description(describe(folder))
    assert "calibrated on   single sentences (one segment per input" in text
    config = json.loads((folder / "config.json").read_text())
    config["papa_calibrated_on"] = "pairs"
    (folder / "config.json").write_text(json.dumps(config))
    assert "calibrated on   sentence pairs (a pair's middle separator at slot 8)" in format_description(
        describe(folder)
    )
    recipe = json.loads((folder / "papa_recipe.json").read_text())
    recipe["corpus"] = {"description": None, "examples": None, "pairs": False}
    config["papa_kind"] = "identity"
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "papa_recipe.json").write_text(json.dumps(recipe))
    text = format_description(describe(folder))
    assert "calibrated on   no corpus: identity constants are made without data" in text and "None" not in text
