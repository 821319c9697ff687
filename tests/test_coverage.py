"""Slot coverage: a short corpus warns once, empty cells are filled from the measured head, rows never empty."""

from __future__ import annotations

import warnings

import pytest
import torch

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.constants import Constants
from papa_surgery.calibration.coverage import CoverageWarning, covered_length, fill_uncovered, special_slots
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.recipe import build_recipe
from papa_surgery.conversion.surgery import convert

pytestmark = pytest.mark.usefixtures("one_thread")

L = 64
# Six words a line: with [CLS] and [SEP], 8 tokens, so slots 0-6 and 63 are reached.
LINES = [
    "the movie was good and fun",
    "a film that is not bad",
    "it is the best of all",
    "this was one of the worst",
] * 3


def _words(tok, n: int) -> str:
    """A single sentence of exactly ``n`` tokens with the tokenizer's specials (one vocabulary word per token)."""
    vocab = [w for w in ("the", "movie", "was", "good", "a", "film", "it", "is") if w in tok.get_vocab()]
    return " ".join(vocab[i % len(vocab)] for i in range(n - 2))


def _calibrate(tiny, pairs=False):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        constants = calibrate(model, tok, LINES, max_length=L, pairs=False, batch_size=4, progress=False)
    return model, tok, constants, [w for w in caught if issubclass(w.category, CoverageWarning)]


def test_short_corpus_warns_once_with_covered_length_and_fix(tiny):
    _, tok, constants, caught = _calibrate(tiny)
    covered = len(tok(LINES[0])["input_ids"])
    assert covered_length(constants.counts) == covered == 8
    assert len(caught) == 1
    message = str(caught[0].message)
    assert f"covers only {covered} of the {L} slots" in message
    assert "max_length=8" in message and "longer examples" in message  # in the Python API's words


def test_converting_calibrated_constants_does_not_warn_again_but_a_loaded_file_does(tiny, tmp_path):
    model, tok, constants, _ = _calibrate(tiny)
    heads = [[0, 0], [1, 2]]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convert(model, constants, heads, tokenizer=tok)
        convert(model, Constants.load(constants.save(tmp_path / "c.safetensors")), heads, tokenizer=tok)
    assert len([w for w in caught if issubclass(w.category, CoverageWarning)]) == 1


def test_a_corpus_that_reaches_every_slot_does_not_warn(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    lines = [_words(tok, 16), "a film"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", CoverageWarning)
        constants = calibrate(model, tok, lines, max_length=16, progress=False)
    assert covered_length(constants.counts) == 16


def test_fill_keeps_covered_cells_and_marks_the_rest(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        raw = calibrate(model, tok, LINES, max_length=L, progress=False, fill=False)
        filled = calibrate(model, tok, LINES, max_length=L, progress=False)
    covered = raw.counts > 0
    assert torch.equal(filled.values[..., covered], raw.values[..., covered])
    assert torch.equal(filled.filled_cells, ~covered) and raw.filled_cells is None
    assert (raw.values[..., ~covered] == 0).all() and (filled.values[..., ~covered] > 0).all()
    assert filled.summary()["coverage"]["filled_cells"] == int((~covered).sum())
    # Filled once: filling again changes nothing, and the fill itself is idempotent.
    assert filled.fill() is filled
    from papa_surgery.calibration.coverage import fill_uncovered

    assert torch.equal(fill_uncovered(filled.values, filled.counts, False), filled.values)


def test_fill_is_the_measured_toeplitz_profile_and_special_slot_attention():
    """A head whose covered cells follow offset profile t and special columns s is extended by exactly that."""
    length = 12
    idx = torch.arange(length)
    t = torch.rand(2 * length - 1, generator=torch.Generator().manual_seed(0)) + 0.1
    truth = t[idx[None, :] - idx[:, None] + length - 1].clone()  # (L, L) Toeplitz
    truth[:, 0], truth[:, -1] = 0.5, 0.25  # attention to [CLS] and the final separator
    truth[0, 1:-1], truth[-1, 1:-1] = 0.125, 0.0625  # what the special rows give body slots
    counts = torch.zeros(length, length)
    reached = [0, 1, 2, 3, 4, 5, length - 1]  # examples of up to 7 tokens
    counts[torch.tensor(reached)[:, None], torch.tensor(reached)[None, :]] = 3.0
    values = torch.where(counts > 0, truth, 0.0)[None, None]
    filled = fill_uncovered(values, counts, pairs=False)[0, 0]
    covered_offsets = {j - i for i in reached[1:-1] for j in reached[1:-1]}
    body = range(1, length - 1)
    check = [(i, j) for i in body for j in body if counts[i, j] == 0 and j - i in covered_offsets]
    assert check and all(torch.isclose(filled[i, j], truth[i, j]) for i, j in check)
    assert torch.allclose(filled[1:-1, 0], truth[1:-1, 0]) and torch.allclose(filled[1:-1, -1], truth[1:-1, -1])
    assert torch.allclose(filled[0, 1:-1], truth[0, 1:-1]) and torch.allclose(filled[-1, 1:-1], truth[-1, 1:-1])
    # Offsets no example reached take the nearest measured offset's value.
    far = max(covered_offsets)
    assert torch.isclose(filled[1, length - 2], truth[1, 1 + far])
    assert special_slots(length, pairs=True) == (0, length // 2, length - 1)


def test_long_input_through_the_converted_checkpoint_has_full_rows(tiny, tmp_path):
    """Calibrated on 8-token lines at L=64, a 50-token input has every real token's constant row summing to 1."""
    from transformers import AutoModel

    model, tok, constants, _ = _calibrate(tiny)
    heads = [[layer, head] for layer in range(2) for head in range(4)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        papa = convert(model, constants, heads, tokenizer=tok, fraction=1.0)
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, recipe=build_recipe(papa, constants))
    assert "8 of 64 slots" in (out / "README.md").read_text()  # the card states the covered length
    loaded = AutoModel.from_pretrained(out, trust_remote_code=True, attn_implementation="eager").eval()
    enc = tok([_words(tok, 50), "a film"], padding=True, return_tensors="pt")
    assert int(enc["attention_mask"][0].sum()) == 50
    with torch.no_grad():
        attentions = loaded(**enc, output_attentions=True).attentions
    real = enc["attention_mask"].bool()
    for a in attentions:  # (B, H, N, N), every head constant
        sums = a.sum(-1)  # (B, H, N)
        assert torch.allclose(sums[real[:, None, :].expand_as(sums)], torch.tensor(1.0), atol=1e-5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        raw = calibrate(model, tok, LINES, max_length=L, progress=False, fill=False)
        empty = convert(model, raw, heads, tokenizer=tok)  # convert fills files written without filling
    assert torch.equal(
        empty.state_dict()["encoder.layer.0.attention.self.papa_constants"],
        papa.state_dict()["encoder.layer.0.attention.self.papa_constants"],
    )


def test_nearest_measured_offset_takes_the_nearer_neighbour_and_the_lower_on_a_tie():
    """An unmeasured offset borrows the nearest measured one's value (the lower on a tie), in O(L log L)."""
    from papa_surgery.calibration.coverage import nearest_measured

    totals = torch.tensor([0.0, 2.0, 0.0, 0.0, 0.0, 5.0, 0.0, 0.0])
    profile = torch.arange(8.0)[None, :] * torch.tensor([[1.0], [10.0]])  # (2, 8)
    got = nearest_measured(profile, totals)
    assert got[0].tolist() == [1, 1, 1, 1, 5, 5, 5, 5]  # offset 3 is 2 from both: the lower (1) wins
    assert torch.equal(got[1], got[0] * 10)
    g = torch.Generator().manual_seed(0)
    for _ in range(50):  # the quadratic definition it replaced
        totals = (torch.rand(30, generator=g) > 0.7).double()
        if not totals.any():
            continue
        measured = totals.nonzero().squeeze(-1)
        want = measured[(torch.arange(30)[:, None] - measured[None, :]).abs().argmin(-1)]
        assert torch.equal(nearest_measured(torch.arange(30.0), totals), torch.arange(30.0)[want])
