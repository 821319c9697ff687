"""The probe on the real all-MiniLM-L6-v2 and real SST-2 (a CPU-sized slice)."""

from __future__ import annotations

import pytest
from conftest import needs_shared_data, shared_data_dir

from papa_surgery.probing import probe

DATA = shared_data_dir()
MAJORITY_BASELINE = 444 / 872  # SST-2 dev: 444 positive of 872


@pytest.mark.real
@needs_shared_data("glue", "sst2")
def test_minilm_sst2_far_above_majority_and_reproducible(minilm):
    model, tokenizer = minilm
    first = probe(model, tokenizer, "sst2", data_dir=DATA, seed=0, max_train_examples=2000, progress=False)
    assert first["examples"] == 2000 and first["eval_examples"] == 872 and first["cached"]
    assert first["score"] > MAJORITY_BASELINE + 0.2, first
    again = probe(model, tokenizer, "sst2", data_dir=DATA, seed=0, max_train_examples=2000, progress=False)
    assert again["score"] == first["score"]
