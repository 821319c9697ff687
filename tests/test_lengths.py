"""The default number of slots (``papa_surgery.workflow.lengths``): the length the source model itself uses."""

from __future__ import annotations

import json
import shutil
import types

import pytest
import torch
from conftest import cli

from papa_surgery.workflow.lengths import source_length


def _st_folder(folder, tmp_path, max_seq_length: int):
    """A copy of ``folder`` made a sentence-transformers model truncating at ``max_seq_length``."""
    out = shutil.copytree(folder, tmp_path / "st-model")
    (out / "modules.json").write_text(json.dumps([{"idx": 0, "name": "0", "path": "", "type": "x.Transformer"}]))
    (out / "sentence_bert_config.json").write_text(json.dumps({"max_seq_length": max_seq_length}))
    return out


def test_the_source_length_is_its_own_within_its_positions(tiny_folder, tmp_path):
    config = types.SimpleNamespace(model_type="bert", max_position_embeddings=96)
    st = _st_folder(tiny_folder("bert"), tmp_path, 40)
    assert source_length(config, types.SimpleNamespace(name_or_path=str(st), model_max_length=64)).length == 40
    tokenizer = types.SimpleNamespace(name_or_path=str(tiny_folder("bert")), model_max_length=64)
    assert (source_length(config, tokenizer).length, source_length(config, tokenizer).origin) == (
        64,
        "the tokenizer's model_max_length",
    )
    tokenizer.model_max_length = int(1e30)  # transformers' "no limit"
    assert source_length(config, tokenizer).length == 96
    tokenizer.model_max_length = 512
    capped = source_length(config, tokenizer)
    assert capped.length == 96 and "(512), within the 96 position embeddings" in capped.origin
    roberta = types.SimpleNamespace(model_type="roberta", max_position_embeddings=514, pad_token_id=1)
    assert source_length(roberta, types.SimpleNamespace(name_or_path=None, model_max_length=None)).length == 512


def test_convert_defaults_to_the_sources_length_and_an_explicit_one_still_wins(tiny_folder, tmp_path):
    st = _st_folder(tiny_folder("bert"), tmp_path, 40)
    args = ["convert", st, "--fraction", 0.5, "--kind", "identity", "--method", "first-to-last"]
    result = cli(*args, "--out", tmp_path / "own")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "own" / "config.json").read_text())["papa_max_length"] == 40
    assert json.loads((tmp_path / "own" / "sentence_bert_config.json").read_text())["max_seq_length"] == 40
    assert "Shorter than its source" not in (tmp_path / "own" / "README.md").read_text()
    result = cli(*args, "--max-length", 16, "--out", tmp_path / "short")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "short" / "config.json").read_text())["papa_max_length"] == 16
    card = (tmp_path / "short" / "README.md").read_text()
    assert "**Shorter than its source.** L = 16 is below the source's own length, 40" in card
    assert "inputs of 17 to 40 tokens, which the source takes, are refused" in card


@pytest.mark.real
def test_a_fraction_0_minilm_embeds_long_text_as_its_source_does(tmp_path):
    """The issue's case: a 200-token text through sentence-transformers and a feature-extraction pipeline."""
    st = pytest.importorskip("sentence_transformers")
    from transformers import pipeline

    from papa_surgery.models.sources import embedded_model_path

    result = cli("convert", "minilm", "--fraction", 0, "--kind", "identity", "--method", "first-to-last",
                 "--out", tmp_path / "drop-in")  # fmt: skip
    assert result.exit_code == 0, result.output
    text = " ".join(f"word{i % 50} is followed by another one" for i in range(40))
    source = st.SentenceTransformer(embedded_model_path(), device="cpu")
    papa = st.SentenceTransformer(str(tmp_path / "drop-in"), device="cpu", trust_remote_code=True)
    assert 200 < len(source.tokenizer(text)["input_ids"]) and papa.max_seq_length == source.max_seq_length == 256
    expected, got = source.encode([text], convert_to_tensor=True), papa.encode([text], convert_to_tensor=True)
    assert torch.allclose(got, expected, atol=1e-5), torch.nn.functional.cosine_similarity(got, expected)
    short = " ".join(f"word{i % 50}" for i in range(200))
    features = pipeline("feature-extraction", model=str(tmp_path / "drop-in"), trust_remote_code=True)
    reference = pipeline("feature-extraction", model=embedded_model_path())
    assert torch.allclose(torch.tensor(features(short)), torch.tensor(reference(short)), atol=1e-5)
