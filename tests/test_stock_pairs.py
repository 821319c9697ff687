"""Whatever the checkpoint's own tokenizer produces at its ``model_max_length`` (= L) is a valid input (issue 23).

The stock ``tokenizer(a, b, truncation=True)`` cuts a pair to L tokens in all, not each segment to its half. The
slot layout places such pairs: the middle separator sits at L/2 when both segments fit their halves (the paper's
layout, unchanged) and otherwise moves just enough, to ``min(max(L/2, a), L - 1 - b)``. Checked with the tiny
BERT- and RoBERTa-style tokenizers, the real MiniLM tokenizer, and a ``text-classification`` pipeline with
``text_pair`` loaded from a saved checkpoint.
"""

from __future__ import annotations

import pytest
import torch
from conftest import make_constants

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code.slots import compute_slots

pytestmark = pytest.mark.usefixtures("one_thread")

L = 24
LONG = "the acting , costumes , music , cinematography and sound are all astounding given the production 's locales"
SHORT = "a fun ride ."
PAIRS = [(LONG, SHORT), (SHORT, LONG), (LONG, LONG), (SHORT, SHORT), (LONG + " " + LONG, "bleak")]


def expected_slots(tok, ids: list[int], length: int) -> list[int]:
    """The documented layout, written out for one example: first segment from 0, middle at
    min(max(L/2, a), L - 1 - b), the rest after it, the final separator at L - 1."""
    sep = tok.sep_token_id
    mid = ids.index(sep) if ids.count(sep) > 1 else None
    if mid is None:
        return list(range(len(ids) - 1)) + [length - 1]
    before, rest = mid, len(ids) - 1 - mid
    middle = min(max(length // 2, before), length - 1 - rest)
    return list(range(before)) + [middle + i for i in range(rest)] + [length - 1]


@pytest.mark.parametrize("model_type", ["bert", "roberta"])
def test_the_stock_tokenizer_at_its_own_length_gives_valid_pairs(tiny, model_type):
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    tok.model_max_length = L
    model = convert(
        src, Constants(make_constants("random", 2, 4, L), "test", L), [[0, 1], [1, 0], [1, 3]], tokenizer=tok
    )
    enc = tok([a for a, _ in PAIRS], [b for _, b in PAIRS], truncation=True, padding=True, return_tensors="pt")
    assert int(enc["attention_mask"].sum(-1).max()) == L  # the tokenizer filled every slot
    slots = compute_slots(enc["input_ids"], enc["attention_mask"], L, tok.sep_token_id)
    for b in range(len(PAIRS)):
        real = enc["attention_mask"][b].bool()
        got = slots[b][real].tolist()
        assert got == expected_slots(tok, enc["input_ids"][b][real].tolist(), L)
        assert len(set(got)) == len(got) and got[-1] == L - 1 and all(0 <= s < L for s in got)
    with torch.no_grad():
        batch_out = model(**enc).last_hidden_state
        for b in range(len(PAIRS)):  # each example alone gives what it gives in the batch
            alone = tok(*PAIRS[b], truncation=True, return_tensors="pt")
            real = enc["attention_mask"][b].bool()
            assert float((model(**alone).last_hidden_state[0] - batch_out[b][real]).abs().max()) <= 1e-5


def test_pairs_that_fit_their_halves_keep_the_papers_layout(tiny):
    tok = tiny.tokenizer("bert")
    enc = tok(SHORT, "bleak and desperate", return_tensors="pt")
    ids = enc["input_ids"][0].tolist()
    mid = ids.index(tok.sep_token_id)
    slots = compute_slots(enc["input_ids"], None, L, tok.sep_token_id)[0].tolist()
    assert slots[mid] == L // 2 and slots[:mid] == list(range(mid)) and slots[-1] == L - 1


def test_only_second_truncation_fails_in_the_tokenizer_only_when_the_first_segment_alone_is_too_long(tiny):
    """Why ``truncation='only_second'`` can error: the tokenizer cannot cut the second segment enough when the
    first one alone fills L (the source's tokenizer does the same at its own length). Otherwise its output runs."""
    src, tok = tiny.model("bert"), tiny.tokenizer("bert")
    tok.model_max_length = L
    model = convert(src, Constants(make_constants("random", 2, 4, L), "test", L), [[0, 1]], tokenizer=tok)
    enc = tok(SHORT, LONG, truncation="only_second", return_tensors="pt")
    assert enc["input_ids"].shape[1] == L
    with torch.no_grad():
        model(**enc)
    with pytest.raises(Exception, match="too short to respect the provided max_length"):
        tok(LONG + " " + LONG, SHORT, truncation="only_second")


def test_a_pipeline_with_text_pair_on_long_pairs_from_a_saved_checkpoint(tiny, tmp_path):
    from transformers import pipeline

    src, tok = tiny.model("bert", head="AutoModelForSequenceClassification"), tiny.tokenizer("bert")
    papa = convert(src, Constants(make_constants("random", 2, 4, L), "test", L), [[0, 1], [1, 2]], tokenizer=tok)
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    classify = pipeline("text-classification", model=str(out), trust_remote_code=True, device="cpu")
    assert classify.tokenizer.model_max_length == L
    results = classify([{"text": a, "text_pair": b} for a, b in PAIRS], truncation=True)
    assert len(results) == len(PAIRS) and all(0.0 <= r["score"] <= 1.0 for r in results)


@pytest.mark.real
def test_the_real_minilm_tokenizer_at_its_length(minilm, tmp_path):
    src, tok = minilm
    length = 64
    tok.model_max_length = length
    constants = Constants.from_kind("toeplitz", 6, 12, length)
    papa = convert(src, constants, [[layer, h] for layer in range(6) for h in range(0, 12, 2)], tokenizer=tok)
    long = " ".join([LONG] * 4)
    pairs = [(long, SHORT), (SHORT, long), (long, long), (SHORT, SHORT)]
    enc = tok([a for a, _ in pairs], [b for _, b in pairs], truncation=True, padding=True, return_tensors="pt")
    slots = compute_slots(enc["input_ids"], enc["attention_mask"], length, tok.sep_token_id)
    for b in range(len(pairs)):
        real = enc["attention_mask"][b].bool()
        assert slots[b][real].tolist() == expected_slots(tok, enc["input_ids"][b][real].tolist(), length)
    with torch.no_grad():
        out = papa(**enc).last_hidden_state
    assert torch.isfinite(out).all()
