"""Compact constants applied from their structure equal the dense rebuild of the same matrices (issue 21).

``hub_code/structured_constants.py`` computes ``C_S X`` from the compact parts (offset profile by FFT, residual,
band, special rows and columns) without forming ``C_S``; below the measured crossover, and in traced graphs,
``C_S`` is built from the parts instead. Both must equal the definition on the dense rebuild
(``compact_constants.rebuild``, used as stored, negative cells included) to 1e-5 in fp32: on the attention
function at every length, and on whole tiny models at L = 1,024 and 2,048 with single and pair inputs, both
padding sides and ModernBERT's local windows. A long-L checkpoint loads in a fresh process without the library.
"""

from __future__ import annotations

import json
import random
import sys

import pytest
import torch
from test_checkpoint import LOADER, fresh_python, loader_job
from test_fast_path import SEP, random_batch

from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.description import format_description
from papa_surgery.conversion.inspection import describe
from papa_surgery.conversion.surgery import build_papa_model, papa_config, separator_id
from papa_surgery.hub_code import constant_heads, overrides, papa_attention
from papa_surgery.hub_code.compact_constants import COMPACT_PARTS, CompactLayout, constants_of, rebuild, special_slots
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.hub_code.slot_plan import SlotPlan
from papa_surgery.hub_code.slots import reference_constant_attention
from papa_surgery.hub_code.structured_constants import BuiltSlots, StructuredSlots, _fft_size

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5


def random_parts(layout: CompactLayout, heads: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Positive-looking parts whose residual makes some cells negative (the rebuild keeps them)."""
    parts = {}
    for name, shape in layout.shapes(heads).items():
        t = torch.rand(shape, generator=generator)
        parts[name] = (t - 0.5) * 0.6 if name in ("papa_constants_u", "papa_constants_v") else t + 0.01
    return parts


class CompactHolder(torch.nn.Module):
    """The compact parts of one attention module, as ``constant_attention`` reads them."""

    def __init__(self, parts: dict, layout: CompactLayout):
        super().__init__()
        for name, t in parts.items():
            self.register_buffer(name, t)
        self.papa_compact_layout = layout


@pytest.fixture
def path(monkeypatch):
    """``path("structured")`` / ``path("dense")``: force one side of the crossover."""

    def choose(kind: str) -> None:
        structured = kind == "structured"
        monkeypatch.setattr(constant_heads, "STRUCTURED_FROM", 0 if structured else 10**9)
        monkeypatch.setattr(constant_heads, "LOCAL_STRUCTURED_FROM", 0 if structured else 10**9)
        # structured: no dense rebuild kept at any L; dense: the dense rebuild, not C_S from the parts
        monkeypatch.setattr(constant_heads, "PREPARED_UP_TO", 0 if structured else 10**9)

    return choose


@pytest.mark.parametrize("length", [48, 301, 1024])
@pytest.mark.parametrize("pairs", [False, True], ids=["singles", "pairs"])
@pytest.mark.parametrize("window", [None, 3, 40], ids=["global", "w3", "w40"])
def test_attention_function_equals_the_dense_rebuild(length, pairs, window, path):
    rng, g = random.Random(f"{length}{pairs}{window}"), torch.Generator().manual_seed(length)
    layout = CompactLayout(length, 4, 3, special_slots(length, pairs))
    holder = CompactHolder(random_parts(layout, 3, g), layout)
    dense = rebuild({name: getattr(holder, name) for name in COMPACT_PARTS}, layout)
    assert (dense < 0).any()  # used as stored: negative cells count
    for trial in range(6):
        ids, mask = random_batch(rng, length, max_batch=3, side=rng.choice(["left", "right"]))
        plan = SlotPlan.from_tokens(ids, mask, length, SEP if pairs else None)
        value = torch.randn(ids.shape[0], 3, ids.shape[1], 5)
        expected = reference_constant_attention(dense, plan.slots, value, window=window, clamp=False)[0]
        for kind in ("structured", "dense"):
            path(kind)
            got, _ = constant_heads.constant_attention(holder, plan, value, window=window)
            assert float((got - expected.transpose(1, 2)).abs().max()) <= TOL, (kind, trial, plan.first, plan.second)


def test_both_paths_are_what_the_crossover_picks(monkeypatch):
    """Above L = 512: below the crossover a dense ``C_S`` from the parts, from it on the structured product; a long
    L never rebuilds (L, L)."""
    layout = CompactLayout(4096, 4, 2, special_slots(4096, False))
    holder = CompactHolder(random_parts(layout, 2, torch.Generator().manual_seed(0)), layout)
    for n, structured in ((40, False), (constant_heads.STRUCTURED_FROM + 10, True)):
        plan = SlotPlan.from_tokens(torch.full((1, n), 7), torch.ones(1, n, dtype=torch.long), 4096)
        chosen = constant_heads.compressed_constants(holder, plan, torch.float32)
        assert isinstance(chosen, StructuredSlots) == structured
    monkeypatch.setattr(constant_heads, "rebuild", None)  # any (L, L) rebuild would fail
    value = torch.randn(1, 2, 40, 3)
    constant_heads.constant_attention(holder, SlotPlan.from_tokens(None, torch.ones(1, 40), 4096), value, window=5)


def test_traceable_cells_equal_the_eager_cells():
    length, g = 96, torch.Generator().manual_seed(3)
    layout = CompactLayout(length, 5, 2, special_slots(length, True))
    order = torch.cat([torch.tensor([length - 1]), torch.arange(30), length // 2 + torch.arange(20)])
    slots = StructuredSlots(random_parts(layout, 2, g), layout, order, None, torch.float32)
    rows, cols = torch.randint(0, 51, (4, 7)), torch.randint(0, 51, (4, 9))
    assert torch.allclose(slots.cells(rows, cols), slots.traceable_cells(rows, cols))
    full = torch.arange(51)
    dense = rebuild(random_parts(layout, 2, torch.Generator().manual_seed(3)), layout)
    assert torch.allclose(slots.cells(full, full), dense[:, order][:, :, order])


def test_fft_lengths_are_smooth_and_long_enough():
    for n in range(1, 3000, 37):
        size = _fft_size(n)
        assert size >= n and size < 2 * n + 2
        for p in (2, 3, 5):
            while size % p == 0:
                size //= p
        assert size == 1


# --- whole models -----------------------------------------------------------------------------------------


def _reference_attention(module, plan, value, dropout=0.0, window=None, weights=False, heads=None):
    value = value if heads is None else value.index_select(1, torch.tensor(heads))  # (B, Hc, N, d)
    ctx, p = reference_constant_attention(constants_of(module), plan.slots, value, dropout, window, clamp=False)
    return ctx.transpose(1, 2), p if weights else None


def long_model(tiny, model_type: str, length: int, heads=None, seed: int = 0):
    """A tiny PAPA model at L = ``length`` with random compact constants (set directly: no (L, L) fitting)."""
    src, tok = tiny.model(model_type, max_position_embeddings=length), tiny.tokenizer(model_type)
    every = heads or [[layer, head] for layer in range(2) for head in range(4)]
    config = papa_config(
        src.config,
        papa_max_length=length,
        papa_constant_heads=every,
        papa_sep_token_id=separator_id(tok, src.config),
        papa_calibrated_on="pairs",
        papa_compact_band=8,
        papa_compact_rank=4,
        papa_kind="average",
    )
    papa = build_papa_model(src, config)
    g = torch.Generator().manual_seed(seed)
    for module in attention_modules(papa):
        layout = module.papa_compact_layout
        assert not layout.clamped
        for name, t in random_parts(layout, getattr(module, COMPACT_PARTS[0]).shape[0], g).items():
            getattr(module, name).copy_(t)
    return papa, tok


def _words(rng: random.Random, count: int) -> str:
    words = "the movie is a fun and charming journey but bleak acting music".split()
    return " ".join(rng.choice(words) for _ in range(count))


def _batches(tok, rng: random.Random, length: int) -> list[dict]:
    batches = []
    for side in ("right", "left"):
        tok.padding_side = side
        singles = [_words(rng, n) for n in (length - 40, length // 3, 5)]
        batches.append(tok(singles, padding=True, truncation=True, max_length=length, return_tensors="pt"))
        firsts = [_words(rng, n) for n in (length // 2 + 60, 30, length // 4)]  # the first overflows its half
        seconds = [_words(rng, n) for n in (length // 3, length - 200, 7)]
        batches.append(tok(firsts, seconds, padding=True, truncation=True, max_length=length, return_tensors="pt"))
    return batches


@pytest.mark.parametrize("model_type, length", [("modernbert", 1024), ("modernbert", 2048), ("bert", 1024)])
def test_long_models_equal_the_dense_rebuild(tiny, model_type, length, path, monkeypatch):
    """Singles and pairs up to L tokens, both padding sides, local windows (ModernBERT), mixed layers."""
    mixed = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]
    papa, tok = long_model(tiny, model_type, length, heads=mixed)
    batches = _batches(tok, random.Random(model_type), length)
    assert max(int(b["attention_mask"].sum(-1).max()) for b in batches) > length - 60
    outputs = {}
    for kind in ("structured", "default"):
        if kind == "structured":
            path("structured")
        with torch.no_grad():
            outputs[kind] = [papa(**b).last_hidden_state[b["attention_mask"].bool()] for b in batches]
    monkeypatch.setattr(papa_attention, "constant_attention", _reference_attention)
    monkeypatch.setattr(overrides, "constant_attention", _reference_attention)
    with torch.no_grad():
        reference = [papa(**b).last_hidden_state[b["attention_mask"].bool()] for b in batches]
    for kind, got in outputs.items():
        for g, r in zip(got, reference, strict=True):
            assert float((g - r).abs().max()) <= TOL, kind


def test_a_long_checkpoint_loads_in_a_fresh_process_without_the_library(tiny, tmp_path):
    papa, tok = long_model(tiny, "modernbert", 2048, seed=1)
    out = save_checkpoint(papa, tmp_path / "long", tokenizer=tok, recipe={"test": True})
    config = json.loads((out / "config.json").read_text())
    assert config["papa_max_length"] == 2048 and config["papa_format_version"] == 2
    # inspect and the card state the structure and show the offset profile the model holds
    d = describe(out)
    profiles = torch.cat([m.papa_constants_profile for m in attention_modules(papa)])  # (heads, 2L-1)
    distances = dict(d["offset_profile"])
    assert list(distances)[:3] == [9, 16, 32] and list(distances)[-1] == 2047
    at_32 = float((profiles[:, 2047 + 32] + profiles[:, 2047 - 32]).mean() / 2)
    assert distances[32] == pytest.approx(at_32, rel=1e-5)
    text = format_description(d)
    assert "rank-4 residual" in text and "FFT convolution" in text and "|j-i| = 9: " in text
    card = (out / "README.md").read_text()
    assert "| constants storage | compact (band 8, rank 4): cells within 8 of the diagonal" in card
    assert "| offset profile | weight per cell at \\|j-i\\| = 9: " in card
    job = loader_job(papa, tok, "AutoModel", out, "long", tmp_path)
    rng = random.Random(0)
    inputs = tok([_words(rng, 1900), _words(rng, 300)], padding=True, return_tensors="pt")  # past the crossover
    with torch.no_grad():
        torch.save(papa(**inputs)[0], job["expected"])
    torch.save(dict(inputs), job["inputs"])
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path, python=sys.executable)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize(("band", "rank"), [(0, 0), (3, 2), (8, 0)])
def test_dense_c_s_built_by_blocks_equals_the_cells(pairs, band, rank):
    """``StructuredSlots.dense`` copies each pair of segments' Toeplitz block from a strided view of the profile, then
    writes the band (across a pair's middle too) and the special rows and columns: it equals ``cells`` everywhere."""
    length, g = 100, torch.Generator().manual_seed(band + 10 * rank)
    layout = CompactLayout(length, band, rank, special_slots(length, pairs))
    parts = random_parts(layout, 3, g)
    half = length // 2
    shapes = [(half - 2, 30), (half, 20), (5, 49)] if pairs else [(40, 0), (length - 1, 0), (1, 0)]
    for first, second in shapes:  # a middle a few slots after the first segment: band cells across it
        order = torch.cat([torch.tensor([length - 1]), torch.arange(first), half + torch.arange(second)])
        merged = second == 0 or first == half
        segments = [(1, 0, first + second)] if merged else [(1, 0, first), (1 + first, half, second)]
        structured = StructuredSlots(parts, layout, order, segments, torch.float32)
        every = torch.arange(structured.size)
        assert torch.allclose(structured.dense().matrix, structured.cells(every, every), atol=1e-6)


@pytest.mark.parametrize("pairs", [False, True])
@pytest.mark.parametrize(("band", "rank"), [(0, 0), (3, 2), (9, 1)])
def test_band_blocks_gathered_from_the_parts_equal_the_cells(pairs, band, rank):
    """A local layer's band (``StructuredSlots.band_blocks``) is gathered from the parts over its cells alone: each
    block equals ``cells`` inside the window (row and column 0 apart) and is 0 outside it, across a pair's middle too,
    with the stored band narrower and wider than the window; indices kept for one plan serve other heads' parts."""
    length, g = 100, torch.Generator().manual_seed(band + 10 * rank)
    layout = CompactLayout(length, band, rank, special_slots(length, pairs))
    half = length // 2
    shapes = [(half - 2, 30), (half, 20), (5, 49)] if pairs else [(40, 0), (length - 1, 0), (1, 0)]
    for first, second in shapes:
        order = torch.cat([torch.tensor([length - 1]), torch.arange(first), half + torch.arange(second)])
        merged = second == 0 or first == half
        segments = [(1, 0, first + second)] if merged else [(1, 0, first), (1 + first, half, second)]
        derived = {}  # one plan's kept indices, shared by every layer (here: two sets of parts)
        for layer in range(2):
            structured = StructuredSlots(random_parts(layout, 3, g), layout, order, segments, torch.float32, derived)
            size = structured.size
            for width in (4, 64):
                blocks = structured.band_blocks(width)  # (Hc, nb, R, R + 2 width)
                nb, block = blocks.shape[1], blocks.shape[2]
                start = torch.arange(nb)[:, None] * block
                rows, cols = start + torch.arange(block), start - width + torch.arange(block + 2 * width)
                inside = (rows[:, :, None] - cols[:, None, :]).abs() <= width
                inside &= (rows[:, :, None] >= 1) & (rows[:, :, None] < size)
                inside &= (cols[:, None, :] >= 1) & (cols[:, None, :] < size)
                expected = structured.cells(rows.clamp(max=size - 1), cols.clamp(0, size - 1)) * inside
                assert torch.allclose(blocks, expected, atol=1e-6), (first, second, layer, width)
                x = torch.randn(3, size, 5, generator=g)
                every = torch.arange(size)
                dense = structured.cells(every, every)
                keep = ((every[:, None] - every[None, :]).abs() <= width) & (every[:, None] > 0) & (every[None, :] > 0)
                assert torch.allclose(structured.band_product(x, width), (dense * keep) @ x, atol=1e-5)
        assert len(derived) == 2  # one entry a window width, made by the first layer


def test_each_layer_takes_the_product_its_crossover_picks():
    """Global layers go structured from ``STRUCTURED_FROM`` slots in use, local (windowed) ones from
    ``LOCAL_STRUCTURED_FROM``; below, a dense ``C_S`` built from the parts."""
    from papa_surgery.hub_code.structured_constants import LOCAL_STRUCTURED_FROM, STRUCTURED_FROM

    layout = CompactLayout(4096, 0, 0, special_slots(4096, False))
    holder = CompactHolder(random_parts(layout, 2, torch.Generator().manual_seed(0)), layout)
    for threshold, window in ((STRUCTURED_FROM, None), (LOCAL_STRUCTURED_FROM, 64)):
        for n, structured in ((threshold - 1, False), (threshold, True)):  # S = n rows (the final separator's first)
            plan = SlotPlan.from_tokens(torch.full((1, n), 7), torch.ones(1, n, dtype=torch.long), 4096)
            chosen = constant_heads.compressed_constants(holder, plan, torch.float32, window)
            assert isinstance(chosen, StructuredSlots) == structured, (threshold, window, n)
            assert structured or isinstance(chosen, BuiltSlots), (threshold, window, n)


def test_built_c_s_in_head_groups_equals_the_whole_dense_block(monkeypatch):
    """Below the crossover ``C_S`` is built and applied a few heads at a time (``BuiltSlots``): its products equal
    the whole (Hc, S, S) block's, whatever the group size."""
    from papa_surgery.hub_code import structured_constants

    length, g = 100, torch.Generator().manual_seed(7)
    layout = CompactLayout(length, 3, 2, special_slots(length, True))
    parts = random_parts(layout, 5, g)
    half = length // 2
    order = torch.cat([torch.tensor([length - 1]), torch.arange(30), half + torch.arange(20)])
    structured = StructuredSlots(parts, layout, order, [(1, 0, 30), (31, half, 20)], torch.float32)
    whole = structured.dense()
    x = torch.randn(5, structured.size, 7, generator=g)
    for workspace in (1, 2 * structured.size**2 * 4, 2**22):  # one head, two heads, every head per group
        monkeypatch.setattr(structured_constants, "BUILT_WORKSPACE", workspace)
        built = structured.built()
        assert torch.allclose(built.product(x), whole.product(x), atol=1e-5)
        assert torch.allclose(built.band_product(x, 4), whole.band_product(x, 4), atol=1e-5)
    rows, cols = torch.randint(0, structured.size, (3, 4)), torch.randint(0, structured.size, (3, 6))
    assert torch.allclose(structured.built().cells(rows, cols), whole.cells(rows, cols))
