"""Distilled constants: deterministic, backbone untouched, better than the average on its objective, round trip."""

from __future__ import annotations

import warnings

import pytest
import torch
from conftest import SENTENCES

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.coverage import CoverageWarning
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.healing.distillation import distill, distillation_loss

pytestmark = pytest.mark.usefixtures("one_thread")

L = 32
HEADS = [[0, 0], [0, 2], [1, 0], [1, 1], [1, 2], [1, 3]]


@pytest.fixture(scope="module")
def average(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        return calibrate(model, tok, SENTENCES, max_length=L, progress=False)


def _distill(tiny, average, **kwargs):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    options = {"steps": 15, "batch_size": 4, "lr": 0.05, "progress": False, **kwargs}
    return model, tok, distill(model, tok, SENTENCES, average, HEADS, **options)


def test_deterministic_and_backbone_untouched(tiny, average):
    model, _, first = _distill(tiny, average)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    _, _, second = _distill(tiny, average)
    assert first.kind == "distilled" and torch.equal(first.values, second.values)
    _, _, third = _distill(tiny, average, seed=1, lr=0.1)
    assert not torch.equal(first.values, third.values)
    model2, tok, _ = _distill(tiny, average)  # a fresh copy: distilling changes none of its weights
    fresh = tiny.model("bert")
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in model2.state_dict().items())
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in before.items())
    assert (first.values >= 0).all()
    # Heads not being made constant keep their average matrices.
    assert torch.equal(first.values[0, 1], average.values[0, 1]) and torch.equal(
        first.values[0, 3], average.values[0, 3]
    )
    assert not torch.equal(first.values[1, 0], average.values[1, 0])


def test_improves_the_objective_over_the_average(tiny, average):
    model, tok, distilled = _distill(tiny, average, steps=30)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        start = distillation_loss(model, tok, SENTENCES, average, HEADS)
        end = distillation_loss(model, tok, SENTENCES, distilled, HEADS)
    assert end < 0.9 * start, (start, end)
    info = distilled.metadata["distilled"]
    assert info["from_kind"] == "average" and info["steps"] == 30 and info["heads"] == HEADS


def test_round_trip_through_save_and_fresh_load(tiny, average, tmp_path):
    from transformers import AutoModel

    model, tok, distilled = _distill(tiny, average)
    papa = convert(model, distilled, HEADS, tokenizer=tok, kind="distilled")
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, recipe={"test": True})
    attn = papa.config._attn_implementation
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation=attn).eval()
    enc = tok(["the movie was good", "a film"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(loaded(**enc)[0], papa(**enc)[0], atol=1e-6, rtol=0)
    assert loaded.config.papa_kind == "distilled"


def test_bad_options(tiny, average):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with pytest.raises(ValueError, match="objective"):
        distill(model, tok, SENTENCES, average, HEADS, objective="nope", progress=False)
    with pytest.raises(ValueError, match="steps"):
        distill(model, tok, SENTENCES, average, HEADS, steps=0, progress=False)


def test_public_api_and_calibrate_points_to_distill(tiny):
    import papa_surgery

    assert papa_surgery.distill is distill
    with pytest.raises(ValueError, match="papa_surgery.distill"):
        papa_surgery.calibrate(tiny.model("bert"), tiny.tokenizer("bert"), SENTENCES, kind="distilled")
