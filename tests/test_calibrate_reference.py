"""Calibration equals a brute-force reference on every family, not only the BERT-likes.

The reference shares nothing with the library's accumulation: one example at a time, the probabilities the
model itself returns with ``output_attentions=True`` (eager), and a Python loop over (i, j) that adds
A[i, j] into cell (slot_i, slot_j). MPNet (relative position bias) and DeBERTa v1/v2 (disentangled
attention) return their probabilities only when asked, through code paths of their own; the modern
encoders (rotary positions, ModernBERT's sliding windows, EuroBERT's grouped-query attention) through the
attention interface's eager function.
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILY_TYPES, MODERN_TYPES, PAIRS, SENTENCES

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.encoding import encode, model_inputs
from papa_surgery.hub_code.slots import compute_slots

L = 32


@torch.no_grad()
def brute_force_average(model, tokenizer, examples, max_length: int, pairs: bool):
    """(layers, heads, L, L) mean of A over the examples' real (slot_i, slot_j) cells, and the (L, L) counts."""
    layers, heads = model.config.num_hidden_layers, model.config.num_attention_heads
    sums = torch.zeros(layers, heads, max_length, max_length, dtype=torch.float64)
    counts = torch.zeros(max_length, max_length, dtype=torch.float64)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        for example in examples:
            enc = encode(tokenizer, [example], max_length, pairs=pairs)
            slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)[0]
            attentions = model(**model_inputs(model, enc), output_attentions=True).attentions
            assert len(attentions) == layers
            cells = slots.tolist()
            for layer, a in enumerate(attentions):  # a: (1, H, N, N)
                for i, si in enumerate(cells):
                    for j, sj in enumerate(cells):
                        sums[layer, :, si, sj] += a[0, :, i, j].double()
            for si in cells:
                for sj in cells:
                    counts[si, sj] += 1
    finally:
        model.set_attn_implementation(previous)
    return torch.where(counts > 0, sums / counts.clamp_min(1), 0.0), counts


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pairs"])
@pytest.mark.parametrize("model_type", ["mpnet", "deberta", "deberta-v2", *MODERN_TYPES])
def test_calibration_equals_brute_force_reference(tiny, model_type, pairs):
    assert model_type in FAMILY_TYPES
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    examples = PAIRS if pairs else SENTENCES
    constants = calibrate(model, tok, examples, max_length=L, pairs=pairs, batch_size=3, progress=False, fill=False)
    reference, counts = brute_force_average(model, tok, examples, L, pairs)
    assert torch.equal(constants.counts, counts)
    assert torch.allclose(constants.values.double(), reference, atol=1e-6, rtol=0)
    assert (counts > 0).sum() > 4 * len(examples)  # several slots per example, not only the separators


def test_the_reference_sees_a_wrong_slot(tiny):
    """The comparison can fail: shifting every example's slots by one breaks it."""
    model, tok = tiny.model("mpnet"), tiny.tokenizer("mpnet")
    constants = calibrate(model, tok, SENTENCES, max_length=L, progress=False, fill=False)
    reference, _ = brute_force_average(model, tok, SENTENCES, L, pairs=False)
    shifted = torch.roll(reference, shifts=1, dims=-1)
    assert not torch.allclose(constants.values.double(), shifted, atol=1e-6)
