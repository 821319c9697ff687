"""Calibration straight into the compact structure equals dense calibration followed by compaction."""

from __future__ import annotations

import pytest
import torch

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.compaction import compact_parts, layout_for
from papa_surgery.calibration.corpus import load_corpus
from papa_surgery.calibration.into_structure import calibrate_structured
from papa_surgery.calibration.structured import SketchSizes
from papa_surgery.hub_code.compact_constants import rebuild

pytestmark = pytest.mark.usefixtures("one_thread")

L = 48
WORDS = "the cat sat on a mat while dogs ran off into the night and it was a very good movie indeed".split()


def _corpus(pairs: bool = False, n: int = 14):
    """Examples of many lengths, some shorter than L (so coverage fill runs), none reaching slot L - 8."""
    g = torch.Generator().manual_seed(1)
    out = []
    for i in range(n):
        k = 3 + int(torch.randint(0, 32 if i % 3 else 12, (1,), generator=g))
        text = " ".join(WORDS[int(t)] for t in torch.randint(0, len(WORDS), (k,), generator=g))
        out.append((text, " ".join(reversed(text.split()))[: 40]) if pairs else text)
    return out


def _both(tiny, pairs, band, rank, sketch, model_type="bert"):
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    examples = _corpus(pairs)
    dense = calibrate(model, tok, examples, max_length=L, pairs=pairs, batch_size=4, progress=False)
    layout = layout_for("compact", L, pairs, band, rank)
    corpus = load_corpus(examples, pairs=pairs)
    structured = calibrate_structured(model, tok, corpus, layout, pairs, batch_size=4, progress=False, sketch=sketch)
    return dense, structured, layout


@pytest.mark.parametrize("pairs", [False, True])
def test_full_sketch_equals_dense_calibration_then_compact_parts(tiny, pairs):
    """With sketches as wide as L the single-pass reconstruction is exact: every part matches ``compact_parts``."""
    dense, structured, layout = _both(tiny, pairs, band=3, rank=2, sketch=SketchSizes(L, L))
    assert dense.counts.min() == 0  # some cells were filled: the fill rules are exercised
    for layer in range(dense.num_layers):
        want = compact_parts(dense.values[layer], layout, torch.float64)
        got = structured.layer_parts(layer, range(dense.num_heads))
        for name in ("papa_constants_band", "papa_constants_rows", "papa_constants_cols", "papa_constants_profile"):
            # the dense path rounds each cell's mean to float32 before compaction: 1e-7 relative
            assert torch.allclose(got[name].double(), want[name], atol=2e-6, rtol=0), name
        low_want = want["papa_constants_u"] @ want["papa_constants_v"].transpose(-1, -2)
        low_got = got["papa_constants_u"].double() @ got["papa_constants_v"].double().transpose(-1, -2)
        assert torch.allclose(low_got, low_want, atol=2e-5, rtol=0)
        assert torch.allclose(rebuild(got, layout), rebuild(want, layout).float(), atol=2e-5)
    assert structured.filled_cells == int((dense.counts == 0).sum())
    assert torch.equal(structured.coverage, dense.coverage)


def test_default_sketch_is_close_to_the_best_rank(tiny):
    """With the default sketch (k = 2r+1, l = 2k+1) the rebuilt matrices' error stays within 2x of
    ``compact_parts``' own (truncated SVD and completion rounds on the exact residual). Tropp et al. 2017 (Thm 4.3)
    bound the expected squared error of the sketch's reconstruction by (1 + r/(k-r-1)) (1 + k/(l-k-1)) = 4 times the
    best rank-r tail at these sizes: 2x in norm. A tiny random model's flat spectrum is near that worst case
    (measured 1.5-1.7x); real attention decays faster."""
    rank = 3
    dense, structured, layout = _both(tiny, False, band=2, rank=rank, sketch=None)
    for layer in range(dense.num_layers):
        exact = dense.values[layer].double()
        best = rebuild(compact_parts(dense.values[layer], layout, torch.float64), layout).double()
        got = rebuild(structured.layer_parts(layer, range(dense.num_heads)), layout).double()
        err_best = (best - exact).flatten(1).norm(dim=-1)  # (H,)
        err_got = (got - exact).flatten(1).norm(dim=-1)
        assert (err_got <= 2.0 * err_best + 1e-6).all(), (err_got, err_best)


def test_variance_equals_dense_when_the_structure_is_exact(tiny):
    """The variance pass measures the deviation from the stored constants: with a full-rank residual those are the
    per-cell means, and it equals the dense path's variance."""
    dense, structured, _ = _both(tiny, False, band=2, rank=L, sketch=SketchSizes(L, L))
    assert torch.allclose(structured.variance.double(), dense.variance.double(), rtol=1e-4, atol=1e-9)
