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
