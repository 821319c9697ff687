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
        out.append((text, " ".join(reversed(text.split()))[:40]) if pairs else text)
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
    """With a range sketch as wide as L the two-pass reconstruction is exact: every part matches ``compact_parts``."""
    dense, structured, layout = _both(tiny, pairs, band=3, rank=2, sketch=SketchSizes(L))
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
    """With the default range sketch (k = 2r+1 columns) the rebuilt matrices' error stays within 1.5x of
    ``compact_parts``' own (truncated SVD and completion rounds on the exact residual). An empirical margin for this
    seeded draw, guided by Halko et al. 2011 (Thm 10.5), who bound the untruncated range finder's expected error by
    (1 + r/(k-r-1))^1/2 = 1.41 times the best rank-r tail at this k: a tiny random model's flat spectrum is near that
    worst case (measured 1.04-1.38x at ranks 1, 3 and 6, where the single-pass sketch this replaced measured
    1.5-1.7x); real attention decays faster."""
    rank = 3
    dense, structured, layout = _both(tiny, False, band=2, rank=rank, sketch=None)
    for layer in range(dense.num_layers):
        exact = dense.values[layer].double()
        best = rebuild(compact_parts(dense.values[layer], layout, torch.float64), layout).double()
        got = rebuild(structured.layer_parts(layer, range(dense.num_heads)), layout).double()
        err_best = (best - exact).flatten(1).norm(dim=-1)  # (H,)
        err_got = (got - exact).flatten(1).norm(dim=-1)
        assert (err_got <= 1.5 * err_best + 1e-6).all(), (err_got, err_best)


def test_variance_equals_dense_when_the_structure_is_exact(tiny):
    """The variance pass measures the deviation from the stored constants: with a full-rank residual those are the
    per-cell means, and it equals the dense path's variance."""
    dense, structured, _ = _both(tiny, False, band=2, rank=L, sketch=SketchSizes(L))
    assert torch.allclose(structured.variance.double(), dense.variance.double(), rtol=1e-4, atol=1e-9)


def test_structured_constants_save_load_and_convert(tiny, tmp_path):
    """A file round trip keeps every part; convert stores the calibrated parts as they are (no dense rebuild)."""
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.surgery import convert
    from papa_surgery.hub_code.compact_constants import COMPACT_PARTS
    from papa_surgery.hub_code.modeling_papa import attention_modules

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    layout = layout_for("compact", L, False, 3, 2)
    structured = calibrate_structured(model, tok, load_corpus(_corpus()), layout, batch_size=4, progress=False)
    loaded = Constants.load(structured.save(tmp_path / "c.safetensors"))
    assert (
        type(loaded) is type(structured) and loaded.layout == layout and loaded.filled_cells == structured.filled_cells
    )
    for name in COMPACT_PARTS:
        assert torch.equal(loaded.parts[name], structured.parts[name])
    assert torch.equal(loaded.variance, structured.variance) and loaded.summary()["storage"]["rank"] == 2
    heads = [[0, 1], [1, 0], [1, 2]]
    papa = convert(model, loaded, heads, tokenizer=tok)
    assert (papa.config.papa_compact_band, papa.config.papa_compact_rank) == (3, 2)
    for layer, module in enumerate(attention_modules(papa)):
        want = loaded.layer_parts(layer, [h for ly, h in heads if ly == layer])
        for name in COMPACT_PARTS:
            assert torch.equal(getattr(module, name), want[name])
    with pytest.raises(ValueError, match="compact_rank=2, not 5"):
        convert(model, loaded, heads, tokenizer=tok, compact_rank=5)
    # dense storage asked for: the matrices the parts stand for, rebuilt (clamped at 0 as dense constants are)
    dense = convert(model, loaded, heads, tokenizer=tok, storage="dense")
    for layer, module in enumerate(attention_modules(dense)):
        want = rebuild(loaded.layer_parts(layer, [h for ly, h in heads if ly == layer]), layout).clamp_min(0)
        assert torch.equal(module.papa_constants, want)


def test_calibrate_picks_the_structured_path(tiny):
    """storage='compact' (and 'auto' above 512 slots) calibrate into structure; 'auto' at small L stays dense."""
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.calibration.structured_constants import StructuredConstants

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    examples = _corpus()[:4]
    dense = calibrate(model, tok, examples, max_length=L, batch_size=4, progress=False, storage="auto")
    compact = calibrate(model, tok, examples, max_length=L, batch_size=4, progress=False, storage="compact",
                        compact_band=2, compact_rank=1)  # fmt: skip
    assert isinstance(dense, Constants) and isinstance(compact, StructuredConstants)
    assert (compact.layout.band, compact.layout.rank) == (2, 1)


LONG = 2048


def test_long_modernbert_calibrates_and_converts_without_dense_matrices(tiny, tmp_path, monkeypatch):
    """L = 2,048 on a tiny ModernBERT: calibrate (auto storage) into structure, convert, save, reload.

    Nothing of size (L, L) per head exists in the constants (dense sums would be 2 x 8 heads x 32 MB in fp64)."""
    import transformers

    from papa_surgery.calibration import into_structure
    from papa_surgery.calibration.structured_constants import StructuredConstants
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.surgery import convert

    model, tok = tiny.model("modernbert", max_position_embeddings=4096), tiny.tokenizer("modernbert")
    g = torch.Generator().manual_seed(0)
    docs = [" ".join(WORDS[int(t)] for t in torch.randint(0, len(WORDS), (n,), generator=g)) for n in (2100, 1500)]
    made = []

    class Recorded(into_structure.StructuredAccumulator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(into_structure, "StructuredAccumulator", Recorded)
    constants = calibrate(model, tok, docs, max_length=LONG, batch_size=1, progress=False, storage="auto")
    state = sum(t.numel() * t.element_size() for t in vars(made[0]).values() if isinstance(t, torch.Tensor))
    assert isinstance(constants, StructuredConstants)
    heads = constants.num_layers * constants.num_heads
    assert max(t[0, 0].numel() for t in constants.parts.values()) < LONG * LONG // 8
    assert constants.coverage[0] == 2 and constants.coverage[LONG - 2] == 1  # the longer document was cut at L
    assert state < heads * LONG * LONG * 8 / 10  # the whole state: under 1/10 of one fp64 (L, L) sum per head
    papa = convert(model, constants, [[0, 0], [0, 1], [1, 0], [1, 1], [1, 2], [1, 3]], tokenizer=tok)
    ids = tok([docs[1]], truncation=True, max_length=LONG, return_tensors="pt")
    with torch.no_grad():
        out = papa(**ids).last_hidden_state
    assert torch.isfinite(out).all() and out.shape[1] == ids["input_ids"].shape[1]
    folder = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    again = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True).eval()
    with torch.no_grad():
        assert torch.allclose(again(**ids).last_hidden_state, out, atol=1e-5)


def test_cli_storage_options_reach_calibration(source, corpus, tmp_path):
    """``calibrate --storage compact --compact-band --compact-rank`` writes structured constants, and ``convert
    --constants`` stores them with that layout."""
    import json

    from conftest import cli

    from papa_surgery.calibration.constants import Constants

    out = tmp_path / "c.safetensors"
    args = ["--corpus", corpus, "--max-length", 32, "--storage", "compact", "--compact-band", 2, "--compact-rank", 1]
    result = cli("calibrate", source, *args, "--out", out)
    assert result.exit_code == 0, result.output
    constants = Constants.load(out)
    assert (constants.layout.band, constants.layout.rank) == (2, 1)
    ckpt = tmp_path / "ckpt"
    result = cli("convert", source, "--constants", out, "--fraction", 1, "--method", "variance", "--out", ckpt)
    assert result.exit_code == 0, result.output
    config = json.loads((ckpt / "config.json").read_text())
    assert (config["papa_compact_band"], config["papa_compact_rank"]) == (2, 1)


def test_a_range_sketch_narrower_than_the_rank_is_refused(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    layout = layout_for("compact", L, False, 2, 3)
    with pytest.raises(ValueError, match="needs at least rank 3 columns; got 2"):
        calibrate_structured(model, tok, load_corpus(_corpus()[:2]), layout, progress=False, sketch=SketchSizes(2))


def _hooks_only(monkeypatch):
    """Calibrate through forward hooks on eager attention (whole (B, H, N, N) matrices), as a family outside
    transformers' attention interface does, instead of ``papa_capture``'s blocks."""
    import dataclasses

    from papa_surgery.calibration import into_structure

    real = into_structure.get_family
    monkeypatch.setattr(into_structure, "get_family", lambda m: dataclasses.replace(real(m), style="override"))


@pytest.mark.parametrize(("model_type", "pairs", "padding"), [("modernbert", False, "left"), ("bert", True, "right")])
def test_blocks_captured_equal_whole_eager_matrices(tiny, monkeypatch, model_type, pairs, padding):
    """``papa_capture`` (blocks of rows, a local layer's window only) and the eager matrices give the same parts and
    variance (ModernBERT's local layers, pairs, both padding sides), with and without a residual."""
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type, padding_side=padding)
    corpus = load_corpus(_corpus(pairs), pairs=pairs)
    for band, rank in ((3, 0), (2, 2)):
        layout = layout_for("compact", L, pairs, band, rank)
        made = [calibrate_structured(model, tok, corpus, layout, pairs, batch_size=4, progress=False)]
        with monkeypatch.context() as patch:
            _hooks_only(patch)
            made.append(calibrate_structured(model, tok, corpus, layout, pairs, batch_size=4, progress=False))
        captured, eager = made
        for name in captured.parts:
            assert torch.allclose(captured.parts[name], eager.parts[name], atol=1e-6), (band, rank, name)
        assert torch.allclose(captured.variance, eager.variance, rtol=1e-5, atol=1e-10)


@pytest.mark.parametrize(("model_type", "pairs"), [("modernbert", False), ("bert", True)])
def test_variance_from_the_sums_equals_the_variance_pass(tiny, model_type, pairs):
    """Without a residual the first pass's sums and squares give the variance; it equals the pass that measures
    (A - C~)^2 cell by cell over every real entry (local windows and pairs included)."""
    from papa_surgery.calibration import into_structure

    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    corpus = load_corpus(_corpus(pairs), pairs=pairs)
    acc_made = []

    class Recorded(into_structure.StructuredAccumulator):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            acc_made.insert(0, self)

    for band in (0, 3):
        layout = layout_for("compact", L, pairs, band, 0)
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(into_structure, "StructuredAccumulator", Recorded)
            constants = calibrate_structured(model, tok, corpus, layout, pairs, batch_size=4, progress=False)
        measured = into_structure._Deviation(acc_made[0], constants.parts)
        into_structure._run(model, tok, corpus, layout, pairs, 4, None, False, "variance", measured)
        assert torch.allclose(constants.variance, measured.result(), rtol=1e-4, atol=1e-9), band
