"""Constants files (papa_surgery.calibration.constants): checked by identity, never silently wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import CallCounter, cli  # noqa: F401

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_constants_are_checked_by_identity_not_by_folder_name(tiny, corpus, tmp_path, calibrations):
    first = tiny.save("bert", tmp_path / "x1" / "model")
    other_weights = tiny.save("bert", tmp_path / "x2" / "model", seed=1)
    consts = tmp_path / "c.safetensors"
    assert cli("calibrate", first, "--corpus", corpus, "--max-length", 16, "--out", consts).exit_code == 0
    result = cli("convert", other_weights, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 1 and "other attention weights" in result.output, result.output
    other_family = tiny.save("electra", tmp_path / "x3" / "model")
    result = cli("convert", other_family, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 1 and "model_type" in result.output, result.output
    renamed = tiny.save("bert", tmp_path / "copy-of-x1")  # the same weights under another name: accepted
    result = cli("convert", renamed, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "o")
    assert result.exit_code == 0, result.output


def test_non_finite_variance_is_refused(tmp_path):
    import torch
    from safetensors.torch import save_file

    from papa_surgery.calibration.constants import Constants

    values = torch.full((2, 4, 8, 8), 1 / 8)
    variance = torch.zeros(2, 4, dtype=torch.float64)
    variance[0, 1] = float("nan")
    with pytest.raises(ValueError, match="NaN"):
        Constants(values, "average", 8, variance=variance)
    path = tmp_path / "c.safetensors"
    meta = {"format": "papa-constants", "kind": "average", "max_length": "8", "pairs": "false", "provenance": "{}"}
    save_file({"values": values, "variance": variance}, str(path), metadata=meta)
    with pytest.raises(ValueError, match=r"c\.safetensors.*NaN"):
        Constants.load(path)


def test_a_constants_file_keeps_its_kind_in_the_checkpoint(tiny_folder, corpus, tmp_path):
    """``convert --constants FILE`` records the file's kind (config, recipe, card), not the --kind default; a --kind
    the file is not is refused before anything is written, and a trained kind is fitted from an average file."""
    import json

    source = tiny_folder("bert")
    files = {kind: tmp_path / f"{kind}.safetensors" for kind in ("toeplitz", "average")}
    for kind, path in files.items():
        result = cli("calibrate", source, "--kind", kind, "--corpus", corpus, "--max-length", 16, "--out", path)
        assert result.exit_code == 0, result.output
    out = tmp_path / "toeplitz-ckpt"
    assert cli("convert", source, "--fraction", 1, "--constants", files["toeplitz"], "--out", out).exit_code == 0
    assert json.loads((out / "config.json").read_text())["papa_kind"] == "toeplitz"
    assert json.loads((out / "papa_recipe.json").read_text())["kind"] == "toeplitz"
    assert "toeplitz" in (out / "README.md").read_text().lower()
    for asked, file in (("average", "toeplitz"), ("sharpened", "toeplitz"), ("identity", "average")):
        refused = tmp_path / f"refused-{asked}"
        args = ("--fraction", 1, "--constants", files[file], "--kind", asked, "--out", refused)
        result = cli("convert", source, *args)
        assert result.exit_code == 2 and f"holds {file} constants, not {asked}" in result.output, result.output
        assert "--kind" in result.output and not refused.exists()
    fitted = tmp_path / "sharpened-ckpt"
    args = ("--fraction", 1, "--constants", files["average"], "--kind", "sharpened", "--corpus", corpus)
    assert cli("convert", source, *args, "--out", fitted).exit_code == 0
    recipe = json.loads((fitted / "papa_recipe.json").read_text())
    assert recipe["kind"] == "sharpened" and recipe["sharpened"]["from_kind"] == "average"
