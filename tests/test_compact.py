"""Compact constants: exact for structured matrices, what the model computes with, fresh-process round trips, size."""

from __future__ import annotations

import dataclasses
import json
import sys

import pytest
import torch
from test_checkpoint import LOADER, floor_python, fresh_python, loader_job

from papa_surgery.calibration.compaction import compact_parts, compacted, layout_for
from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.inspection import describe
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code.compact_constants import CompactLayout, constants_of, rebuild
from papa_surgery.hub_code.modeling_papa import attention_modules

pytestmark = pytest.mark.usefixtures("one_thread")

L = 48
HEADS = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]  # layer 0 mixed, layer 1 attention-free


def _random_constants(layers=2, heads=4, length=L, seed=0) -> Constants:
    g = torch.Generator().manual_seed(seed)
    return Constants(torch.rand(layers, heads, length, length, generator=g) + 0.01, "average", length)


@pytest.mark.parametrize("kind", ["toeplitz", "identity", "uniform", "zeros"])
def test_structured_kinds_compact_exactly(kind):
    values = Constants.from_kind(kind, 1, 2, L).values[0]  # (2, L, L)
    layout = layout_for("compact", L, pairs=False, band=2, rank=0)
    assert torch.allclose(compacted(values, layout), values, atol=1e-6)


def _cell_by_cell(parts: dict, length: int, band: int, special: tuple, clamped: bool = False) -> torch.Tensor:
    """The matrices the compact parts stand for, read one cell at a time from the storage's definition (no
    shared code with ``rebuild``): a special slot's column, else its row, else the band, else profile + u . v;
    clamped at 0 for checkpoints of format 1."""
    heads = parts["papa_constants_profile"].shape[0]
    out = torch.zeros(heads, length, length, dtype=torch.float64)
    for h in range(heads):
        for i in range(length):
            for j in range(length):
                if j in special:
                    value = parts["papa_constants_cols"][h, i, special.index(j)]
                elif i in special:
                    value = parts["papa_constants_rows"][h, special.index(i), j]
                elif abs(j - i) <= band:
                    value = parts["papa_constants_band"][h, i, j - i + band]
                else:
                    u, v = parts["papa_constants_u"][h, i], parts["papa_constants_v"][h, j]
                    value = parts["papa_constants_profile"][h, j - i + length - 1] + float((u * v).sum())
                out[h, i, j] = max(float(value), 0.0) if clamped else float(value)
    return out


@pytest.mark.parametrize("clamped", [False, True], ids=["format2", "format1"])
@pytest.mark.parametrize("pairs", [False, True])
def test_rebuild_equals_an_independent_cell_by_cell_reading(pairs, clamped):
    length, band, rank = 12, 2, 3
    layout = dataclasses.replace(layout_for("compact", length, pairs=pairs, band=band, rank=rank), clamped=clamped)
    g = torch.Generator().manual_seed(1)
    parts = {name: torch.randn(shape, generator=g) for name, shape in layout.shapes(2).items()}  # negatives too
    expected = _cell_by_cell(parts, length, band, layout.special, clamped)
    assert (expected < 0).any() != clamped  # format 2 keeps negative cells, format 1 clamps them
    assert torch.allclose(rebuild(parts, layout).double(), expected, atol=1e-5)
    # and compaction of real-looking constants stores what it claims: exact where it says so
    values = _random_constants(1, 2, length).values[0]
    stored = compact_parts(values, layout)
    got = _cell_by_cell(stored, length, band, layout.special)
    exact = (layout.offsets().abs() <= band) | torch.isin(torch.arange(length), torch.tensor(layout.special))[:, None]
    exact = exact | torch.isin(torch.arange(length), torch.tensor(layout.special))[None, :]
    assert torch.allclose(got[:, exact], values.double()[:, exact], atol=1e-6)


def test_full_rank_is_exact_and_a_low_rank_is_not():
    values = _random_constants().values[0]
    exact = compacted(values, layout_for("compact", L, pairs=True, band=3, rank=L))
    assert torch.allclose(exact, values, atol=1e-5)
    lossy = compacted(values, layout_for("compact", L, pairs=True, band=3, rank=2))
    assert not torch.allclose(lossy, values, atol=1e-2)
    layout = layout_for("compact", L, pairs=True, band=3, rank=2)
    kept = lossy[:, list(layout.special), :]  # special rows (and columns) and the band are stored exactly
    assert torch.allclose(kept, values[:, list(layout.special), :], atol=1e-6)
    assert torch.allclose(lossy.diagonal(dim1=-2, dim2=-1), values.diagonal(dim1=-2, dim2=-1), atol=1e-6)


def test_auto_storage_is_dense_up_to_128_and_compact_above():
    assert layout_for("auto", 128, False) is None and layout_for("dense", 512, False) is None
    assert layout_for("auto", 512, True) == CompactLayout(512, 16, 16, (0, 256, 511))
    # above L=512 (calibrated into the structure) no residual; long L: the diagonal, so the constants stay smaller
    # than the query/key weights they replace
    assert layout_for("auto", 2048, False) == CompactLayout(2048, 16, 0, (0, 2047))
    assert layout_for("auto", 2048, False, fitted=True) == CompactLayout(2048, 16, 16, (0, 2047))  # dense: free
    assert layout_for("auto", 2048, False, rank=4) == CompactLayout(2048, 16, 4, (0, 2047))
    assert layout_for("auto", 8192, False) == CompactLayout(8192, 0, 0, (0, 8191))
    assert layout_for("compact", 8192, False, band=8) == CompactLayout(8192, 8, 0, (0, 8191))
    with pytest.raises(ValueError, match="storage"):
        layout_for("tiny", 512, False)
    with pytest.raises(ValueError, match="band"):
        layout_for("compact", 16, False, band=16)


def test_the_model_computes_with_the_compacted_matrices(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = _random_constants()
    papa = convert(model, constants, HEADS, tokenizer=tok, storage="compact", compact_band=4, compact_rank=3)
    dense = convert(model, constants, HEADS, tokenizer=tok, storage="dense")
    layout = CompactLayout.from_config(papa.config)
    assert (layout.band, layout.rank) == (4, 3) and dense.config.papa_compact_band is None
    for layer, module in enumerate(attention_modules(papa)):
        heads = sorted(h for lay, h in HEADS if lay == layer)
        assert torch.equal(constants_of(module), compacted(constants.values[layer, heads], layout))
    enc = tok(["the movie was good and fun", "a film"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert not torch.allclose(papa(**enc)[0], dense(**enc)[0], atol=1e-4)  # lossy here: random matrices
    with pytest.raises(ValueError, match="trainable"):
        convert(model, constants, HEADS, tokenizer=tok, storage="compact", trainable_constants=True)


def test_eager_forwards_reuse_the_rebuilt_matrices_until_a_part_changes(tiny):
    from papa_surgery.hub_code.compact_constants import COMPACT_PARTS, rebuild

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    papa = convert(model, _random_constants(), HEADS, tokenizer=tok, storage="compact", compact_band=4, compact_rank=3)
    module = attention_modules(papa)[1]
    first = constants_of(module)
    assert constants_of(module) is first  # kept: no rebuild per forward
    with torch.no_grad():
        module.papa_constants_profile.mul_(2.0)  # an in-place change (what a weight load does)
    changed = constants_of(module)
    assert changed is not first and not torch.equal(changed, first)
    layout = CompactLayout.from_config(papa.config)
    assert torch.equal(changed, rebuild({n: getattr(module, n) for n in COMPACT_PARTS}, layout))
    papa.to(torch.float64)  # new tensors: rebuilt again, from the converted parts
    assert constants_of(module) is not changed


def _jobs(tiny, tmp_path):
    jobs = []
    for model_type in ("bert", "mpnet", "deberta-v2", "roberta"):
        tok, src = tiny.tokenizer(model_type), tiny.model(model_type)
        layers, heads = len(attention_modules(src)), 4
        for dtype in ("fp32", "fp16"):
            consts = _random_constants(layers, heads)
            papa = convert(
                src, consts, HEADS, tokenizer=tok, storage="compact", compact_band=4, compact_rank=3, dtype=dtype
            )
            name = f"{model_type}-{dtype}"
            out = save_checkpoint(papa, tmp_path / name, tokenizer=tok, recipe={"test": True}, card=False)
            assert describe(out)["problems"] == []
            jobs.append(loader_job(papa, tok, "AutoModel", out, name, tmp_path))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    return jobs


@pytest.mark.slow  # slow tier: more fresh-process loads
def test_compact_checkpoints_load_in_a_fresh_process_without_the_library(tiny, tmp_path):
    jobs = _jobs(tiny, tmp_path)
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path, python=sys.executable)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]
    assert len([ln for ln in result.stdout.splitlines() if ln.count(" ") == 2]) == len(jobs)


@pytest.mark.slow  # slow tier: more fresh-process loads
def test_compact_checkpoints_load_on_the_oldest_supported_transformers(tiny, tmp_path):
    python = floor_python()
    if python is None:
        pytest.skip("no floor interpreter: scripts/test.sh makes .venv-floor (or set PAPA_FLOOR_PYTHON)")
    _jobs(tiny, tmp_path)
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path, python=python)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]


def test_compact_checkpoint_is_much_smaller_inspects_and_plots(tiny, tmp_path):
    from papa_surgery.report import plot_constants

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    length = 256
    constants = _random_constants(length=length)
    every = [[layer, head] for layer in range(2) for head in range(4)]
    sizes = {}
    for storage in ("dense", "compact"):
        papa = convert(model, constants, every, tokenizer=tok, storage=storage, fraction=1.0)
        out = save_checkpoint(papa, tmp_path / storage, tokenizer=tok, recipe={"test": True})
        sizes[storage] = (out / "model.safetensors").stat().st_size
        d = describe(out)
        assert d["problems"] == [] and all(s == [4, length, length] for s in d["constants"].values())
    dense_constants = 8 * length * length * 4  # bytes of the dense fp32 matrices
    # Default band 16 and rank 16 keep under a third of L*L values per head at L=256 (wide margin).
    assert sizes["dense"] - sizes["compact"] > 0.6 * dense_constants
    assert "compact (band 16, rank 16)" in describe(tmp_path / "compact")["constants_storage"]
    assert (tmp_path / "compact" / "papa_constants.png").stat().st_size > 0
    assert plot_constants(tmp_path / "compact", tmp_path / "fig.png").is_file()


def test_compact_parts_have_the_declared_shapes():
    layout = layout_for("compact", L, pairs=False, band=5, rank=7)
    parts = compact_parts(_random_constants().values[1], layout, torch.float16)
    assert {k: tuple(v.shape) for k, v in parts.items()} == layout.shapes(4)
    assert all(v.dtype == torch.float16 for v in parts.values())


@pytest.mark.parametrize("model_type", ["bert", "mpnet"])
def test_compact_constants_export_with_dynamic_shapes(tiny, model_type):
    """The rebuild is pure tensor arithmetic: torch.export traces it (interface and override families)."""
    from test_clients import exported_and_eager

    tok, src = tiny.tokenizer(model_type), tiny.model(model_type)
    papa = convert(src, _random_constants(), HEADS, tokenizer=tok, storage="compact", compact_band=4, compact_rank=3)
    got, expected = exported_and_eager(papa, tok)
    assert float((got - expected).abs().max()) <= 1e-5


def test_single_input_mass_is_each_rows_sum_over_an_inputs_slots():
    from papa_surgery.calibration.compaction import single_input_mass
    from papa_surgery.hub_code.slots import compute_slots

    c = _random_constants(length=12).values[0]  # (4, 12, 12)
    lengths = torch.arange(1, 13)
    slots = compute_slots(None, (torch.arange(12)[None, :] < lengths[:, None]).long(), 12)  # (n, 12), -1 padding
    mass = single_input_mass(c)  # (4, n, q)
    for n in lengths.tolist():
        held = slots[n - 1][slots[n - 1] >= 0]
        assert torch.allclose(mass[:, n - 1, :], c[:, :, held].sum(-1), atol=1e-6), n


def test_a_row_whose_residual_cancels_its_mass_keeps_none_and_stays_finite(tiny, monkeypatch):
    """The residual is fitted to cells, not to the sums rows are divided by: a row whose mass on short inputs' slots
    is tiny (its mass sits at a slot few inputs reach) got a sum near or below 0 there, and renormalising blew it up
    (all-MiniLM-L6-v2's average at L=256: NaN from 215 tokens). Such a row is stored without its residual (profile,
    band and special slots: no negative cell, so renormalised it is a distribution), and the outputs stay finite."""
    from papa_surgery.calibration import compaction
    from papa_surgery.calibration.compaction import short_rows

    length, row = 64, 30
    g = torch.Generator().manual_seed(0)
    values = torch.softmax(torch.randn(2, 4, length, length, generator=g) * 2, -1)
    values[0, 1, row] = 1e-7
    values[0, 1, row, 55] = 1.0  # the row's mass sits at slot 55: inputs of 33 to 57 tokens see almost none of it
    constants = Constants(values, "average", length)
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    every = [[layer, h] for layer in range(2) for h in range(4)]
    layout = layout_for("compact", length, False, band=4, rank=4)
    with monkeypatch.context() as patch:  # fitted to the cells alone, the crafted row loses its mass
        patch.setattr(compaction, "short_rows", lambda dense, rebuilt: torch.zeros(dense.shape[:2], dtype=torch.bool))
        unguarded = rebuild(compact_parts(values[0], layout), layout)
    assert short_rows(values[0], unguarded)[1, row]
    papa = convert(model, constants, every, tokenizer=tok, storage="compact", compact_band=4, compact_rank=4)
    dense = convert(model, constants, every, tokenizer=tok, storage="dense")
    for layer, module in enumerate(attention_modules(papa)):  # a row keeps half its mass, or has no negative cell
        stored = constants_of(module)
        assert (stored[short_rows(values[layer], stored)] >= 0).all(), layer
    ids = torch.randint(5, len(tok), (1, 45), generator=g)
    with torch.no_grad():
        out, reference = papa(input_ids=ids)[0], dense(input_ids=ids)[0]
    assert torch.isfinite(out).all() and out.abs().max() < 10 * reference.abs().max()


@pytest.mark.real
def test_minilm_compact_at_its_own_length_is_finite_on_its_longest_inputs(minilm):
    """all-MiniLM-L6-v2, the average over the bundled corpus at its own L=256, every head constant, stored compact as
    ``auto`` stores it: one head's row for slot 211 summed below 0 over inputs of 215 tokens and more (NaN there)."""
    import warnings

    from papa_surgery.calibration.average import calibrate
    from papa_surgery.calibration.corpus import bundled_corpus
    from papa_surgery.calibration.coverage import CoverageWarning

    model, tok = minilm
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        constants = calibrate(model, tok, list(bundled_corpus()), max_length=256, progress=False)
    every = [[layer, h] for layer in range(6) for h in range(12)]
    papa = convert(model, constants, every, tokenizer=tok)
    dense = convert(model, constants, every, tokenizer=tok, storage="dense")
    assert papa.config.papa_compact_rank == 16
    text = " ".join(["the quick brown fox jumps over the lazy dog near the river bank"] * 30)
    for n in (200, 215, 256):
        enc = tok([text], truncation=True, max_length=n, return_tensors="pt")
        with torch.no_grad():
            out, reference = papa(**enc)[0][0], dense(**enc)[0][0]
        assert torch.isfinite(out).all(), n
        assert torch.nn.functional.cosine_similarity(out, reference, dim=-1).min() > 0.98, n


@pytest.mark.real
def test_minilm_calibrated_into_the_structure_is_finite_at_every_length(minilm_path, tmp_path):
    """all-MiniLM-L6-v2's average calibrated straight into the compact structure at L=512 (``--storage compact``):
    its residual, unlike a fitted one's, was never judged against the sums rows are divided by, and some rows summed
    to about 0 over the slots of inputs of 146 to 300 tokens: NaN from layer 1 on, exit 0, no warning. Such rows
    now keep no residual, and the checkpoint is finite at every length."""
    from conftest import cli
    from transformers import AutoModel, AutoTokenizer

    out = tmp_path / "m"
    result = cli("convert", minilm_path, "--max-length", 512, "--kind", "average", "--corpus", "documents:",
                 "--max-examples", 16, "--storage", "compact", "--fraction", 1, "--out", out)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert describe(out)["constants_storage"] == "compact (band 16, rank 16)"  # a residual, calibrated
    model = AutoModel.from_pretrained(out, trust_remote_code=True).eval()
    tok = AutoTokenizer.from_pretrained(out)
    text = " ".join(["The quick brown fox jumps over the lazy dog."] * 80)
    with torch.no_grad():
        for n in range(3, 513):
            ids = tok([text], return_tensors="pt", truncation=True, max_length=n)
            assert torch.isfinite(model(**ids).last_hidden_state).all(), n
