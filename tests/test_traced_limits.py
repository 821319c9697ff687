"""An input longer than L through an exported graph says what eager mode says, or gives NaN (issue 23, item 12).

Eager mode raises a ``ValueError`` naming ``papa_max_length`` and the fix. ``torch.export`` keeps the check as a
runtime assertion with the same words (no token count: values are unknown while tracing). ONNX has no assertion op
and the dynamo exporter drops it, so the graph itself makes every output of an over-long example NaN (the other
examples of the batch are untouched): before, onnxruntime failed with ``GatherND ... invalid index``, or could have
returned plausible numbers.
"""

from __future__ import annotations

import pytest
import torch
from conftest import SENTENCES, Encoder, make_constants, onnx_session

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.surgery import convert

pytestmark = [pytest.mark.usefixtures("one_thread"), pytest.mark.slow]  # torch.export and ONNX

L = 24


def _model_and_batches(tiny):
    src, tok = tiny.model("bert", attn="sdpa"), tiny.tokenizer("bert")
    papa = convert(src, Constants(make_constants("random", 2, 4, L), "test", L), [[0, 1], [1, 2]], tokenizer=tok)
    first = tok(SENTENCES[:2], padding=True, return_tensors="pt")
    word = tok.convert_tokens_to_ids("the")
    long = torch.full((2, L + 6), word)
    long[:, 0], long[0, -1], long[1, 9] = tok.cls_token_id, tok.sep_token_id, tok.sep_token_id
    mask = torch.ones_like(long)
    mask[1, 10:] = 0  # the second example is short: it must come out untouched
    return Encoder(papa).eval(), first, long, mask


def test_torch_export_says_what_eager_says(tiny):
    model, first, long, mask = _model_and_batches(tiny)
    with pytest.raises(ValueError, match=rf"input has {L + 6} tokens .* papa_max_length={L} .* truncation=True"):
        model(long, mask)
    n = torch.export.Dim("length", max=L + 20)
    program = torch.export.export(model, (first["input_ids"], first["attention_mask"]), dynamic_shapes=({1: n}, {1: n}))
    with pytest.raises(Exception, match=rf"more tokens than the slots .* papa_max_length={L} .* truncation=True"):
        program.module()(long, mask)


def test_onnx_gives_nan_for_an_over_long_example_and_leaves_the_others(tiny, tmp_path):
    model, first, long, mask = _model_and_batches(tiny)
    session = onnx_session(model, first, tmp_path / "model.onnx", L + 20)
    got = torch.from_numpy(session.run(None, {"input_ids": long.numpy(), "attention_mask": mask.numpy()})[0])
    assert torch.isnan(got[0]).all()
    with torch.no_grad():
        alone = model(long[1:, :10], mask[1:, :10])[0]
    assert float((got[1, :10] - alone).abs().max()) <= 1e-4
