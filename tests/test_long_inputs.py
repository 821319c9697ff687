"""Long inputs from every front door (issue 30): one constants interface, data-free kinds in O(L), clear refusals.

Through the doors a user takes: ``papa_surgery.calibrate`` / ``rank`` / ``convert`` / ``save`` with no file in
between, the command line, and the saved checkpoint in a fresh process without the library.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import cli
from safetensors.torch import load_file
from test_checkpoint import LOADER, fresh_python, loader_job

import papa_surgery
from papa_surgery import registry
from papa_surgery.calibration import budget
from papa_surgery.calibration.constants import Constants
from papa_surgery.calibration.structured_constants import StructuredConstants
from papa_surgery.hub_code.compact_constants import COMPACT_PARTS
from papa_surgery.hub_code.modeling_papa import attention_modules

pytestmark = pytest.mark.usefixtures("one_thread")

WORDS = "the cat sat on a mat while dogs ran off into the night and it was a very good movie indeed".split()
LONG = 8192


def _documents(*lengths: int) -> list[str]:
    g = torch.Generator().manual_seed(0)
    return [" ".join(WORDS[int(t)] for t in torch.randint(0, len(WORDS), (n,), generator=g)) for n in lengths]


def _parts_bytes(constants: StructuredConstants) -> int:
    return sum(t.numel() * t.element_size() for t in constants.parts.values())


def test_structured_constants_go_through_the_api_end_to_end(tiny, tmp_path):
    """calibrate (auto storage above L=512: StructuredConstants) -> rank -> convert -> save with no file in between;
    the checkpoint loads in a fresh process without the library and equals the in-memory model."""
    length = 1024
    model, tok = tiny.model("modernbert", max_position_embeddings=length), tiny.tokenizer("modernbert")
    docs = _documents(900, 500, 300)
    constants = papa_surgery.calibrate(model, tok, docs, max_length=length, batch_size=1, progress=False)
    assert isinstance(constants, StructuredConstants) and constants.variance is not None
    ranking = papa_surgery.rank("variance", constants=constants)
    assert ranking.method == "variance" and ranking.total == constants.num_layers * constants.num_heads
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.5, tokenizer=tok)
    heads = ranking.select(0.5)
    assert papa.config.papa_constant_heads == heads
    for layer, module in enumerate(attention_modules(papa)):  # the parts, stored as calibrated
        mine = sorted(h for ly, h in heads if ly == layer)
        if mine:
            want = constants.layer_parts(layer, mine)
            assert all(torch.equal(getattr(module, name), want[name]) for name in COMPACT_PARTS)
    folder = papa_surgery.save(papa, tmp_path / "ckpt", tokenizer=tok)
    assert papa_surgery.rank("first-to-last", constants=constants).order[0] == [0, 0]
    job = loader_job(papa, tok, "AutoModel", folder, "long", tmp_path)
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    done = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path)
    assert "ALL-OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("kind", registry.DATA_FREE_KINDS)
def test_data_free_kinds_at_8192_slots_take_o_of_l(tiny, kind):
    """Every data-free kind at L = 8,192 through the API: compact parts of O(L) values per head (a dense matrix
    would be 268 MB a head), and a converted model whose constants buffers are as small, that runs."""
    model, tok = tiny.model("modernbert", max_position_embeddings=LONG), tiny.tokenizer("modernbert")
    constants = papa_surgery.calibrate(model, tok, kind=kind, max_length=LONG, progress=False)
    heads = constants.num_layers * constants.num_heads
    assert isinstance(constants, StructuredConstants) and constants.kind == kind
    assert _parts_bytes(constants) <= heads * 8 * LONG * 4  # about 6 values per slot and head
    papa = papa_surgery.convert(model, constants, "first-to-last", 1.0, tokenizer=tok)
    buffers = sum(b.numel() for name, b in papa.named_buffers() if "papa_constants" in name)
    assert buffers <= heads * 8 * LONG
    enc = tok(_documents(40), return_tensors="pt")
    with torch.no_grad():
        assert torch.isfinite(papa(**enc).last_hidden_state).all()


@pytest.mark.parametrize("kind", registry.DATA_FREE_KINDS)
def test_data_free_kinds_built_compact_equal_the_dense_matrices(tiny, kind):
    """Above L=512 the data-free kinds are built into the compact structure; the converted model computes exactly
    what the dense matrices give (single sentences and pairs, both padding sides)."""
    length = 600
    model = tiny.model("bert", max_position_embeddings=length)
    compact = papa_surgery.calibrate(model, tiny.tokenizer("bert"), kind=kind, max_length=length)
    dense = papa_surgery.calibrate(model, tiny.tokenizer("bert"), kind=kind, max_length=length, storage="dense")
    assert isinstance(compact, StructuredConstants) and isinstance(dense, Constants)
    for side in ("right", "left"):
        tok = tiny.tokenizer("bert", padding_side=side)
        heads = [[0, 1], [1, 0], [1, 3]]
        a = papa_surgery.convert(model, compact, _ranking(heads, compact), 3 / 8, tokenizer=tok)
        b = papa_surgery.convert(model, dense, _ranking(heads, dense), 3 / 8, tokenizer=tok, storage="dense")
        assert a.config.papa_compact_band is not None and b.config.papa_compact_band is None
        for enc in (tok(["the cat sat on the mat", "a dog"], padding=True, return_tensors="pt"),
                    tok(["a good movie", "the end"], ["it ran", "off into the night"], padding=True,
                        return_tensors="pt")):  # fmt: skip
            with torch.no_grad():
                got, want = a(**enc).last_hidden_state, b(**enc).last_hidden_state
            assert torch.allclose(got, want, atol=1e-5), (kind, side, (got - want).abs().max())


def _ranking(first, constants):
    """A ranking that makes ``first`` constant first (the rest in layer order)."""
    from papa_surgery.ranking.order import Ranking

    rest = [[ly, h] for ly in range(constants.num_layers) for h in range(constants.num_heads) if [ly, h] not in first]
    return Ranking("first-to-last", first + rest, constants.num_layers, constants.num_heads)


def test_cli_converts_a_data_free_kind_at_8192_slots_without_calibrating(tiny_folder, tmp_path, calibrations):
    """``convert --fraction 1 --max-length 8192 --kind toeplitz``: no ranking (every head is constant), so no
    calibration; the checkpoint's constants are O(L) per head; ``calibrate --kind identity`` writes a compact file
    that ``rank`` and ``convert`` read."""
    folder = tiny_folder("modernbert", max_position_embeddings=LONG)
    out = tmp_path / "toeplitz"
    done = cli("convert", folder, "--fraction", "1", "--max-length", LONG, "--kind", "toeplitz", "--out", out)
    assert done.exit_code == 0, done.output
    assert calibrations.calls == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["papa_compact_band"], config["papa_compact_rank"]) == (0, 0) and config["papa_method"] is None
    assert (out / "model.safetensors").stat().st_size < 2_000_000  # dense constants: 8 heads x 268 MB
    constants_file = tmp_path / "identity.safetensors"
    done = cli("calibrate", folder, "--kind", "identity", "--max-length", LONG, "--out", constants_file)
    assert done.exit_code == 0, done.output
    loaded = Constants.load(constants_file)
    assert isinstance(loaded, StructuredConstants) and loaded.kind == "identity"
    ranking = tmp_path / "ranking.json"
    assert (
        cli("rank", folder, "--method", "last-to-first", "--constants", constants_file, "--out", ranking).exit_code == 0
    )
    out = tmp_path / "half"
    done = cli(
        "convert", folder, "--fraction", "0.5", "--constants", constants_file, "--ranking", ranking, "--out", out
    )
    assert done.exit_code == 0, done.output
    assert json.loads((out / "config.json").read_text())["papa_constant_heads"] == [[1, 0], [1, 1], [1, 2], [1, 3]]


def test_a_ranking_refuses_constants_of_another_kind(tiny, tiny_folder, tmp_path):
    """The registry says which constants each method reads: variance reads the average's variance, norm the
    norm-average's contributions, lambda mixes the average; anything else is refused, naming what to pass."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    toeplitz = papa_surgery.calibrate(model, tok, kind="toeplitz", max_length=16)
    average = papa_surgery.calibrate(model, tok, ["the cat sat on the mat", "a dog ran off"], max_length=16)
    with pytest.raises(ValueError, match=r"'variance' ranking reads average constants .*, not toeplitz constants"):
        papa_surgery.rank("variance", constants=toeplitz)
    with pytest.raises(ValueError, match=r"'norm' ranking reads norm-average constants .* not average constants"):
        papa_surgery.rank("norm", constants=average)
    with pytest.raises(ValueError, match=r"'lambda' ranking reads average constants"):
        papa_surgery.rank("lambda", model, tok, constants=toeplitz, task="sst2")
    assert papa_surgery.rank("variance", constants=average).method == "variance"
    path = toeplitz.save(tmp_path / "toeplitz.safetensors")
    done = cli("rank", tiny_folder("bert"), "--method", "variance", "--constants", path, "--out", tmp_path / "r.json")
    assert done.exit_code != 0 and "reads average constants" in done.output and "Traceback" not in done.output


def test_dense_work_that_cannot_fit_is_refused_before_it_starts(tiny, tiny_folder, tmp_path, monkeypatch):
    """Dense (L, L) calibration, analyses, distillation and healing at a length this machine's memory cannot hold:
    one sentence naming the size and the fix, before any pass (here the machine is said to have 1 GB)."""
    monkeypatch.setattr(budget, "memory_bytes", lambda: 2**30)
    length = 4096
    model, tok = tiny.model("modernbert", max_position_embeddings=length), tiny.tokenizer("modernbert")
    docs = _documents(30)
    big = r"calibrating the average at L=4096 .* about 9 GB, more than this machine's 1 GB.*storage='compact'"
    with pytest.raises(ValueError, match=big):
        papa_surgery.calibrate(model, tok, docs, max_length=length, storage="dense")
    for kind in ("norm-average", "effective-average"):
        with pytest.raises(ValueError, match=rf"making {kind} constants at L=4096 .* use a smaller max_length"):
            papa_surgery.calibrate(model, tok, docs, kind=kind, max_length=length)
    long_model = tiny.model("modernbert", max_position_embeddings=LONG)
    with pytest.raises(ValueError, match=r"building toeplitz constants at L=8192 needs .*storage='compact'"):
        papa_surgery.calibrate(long_model, tok, kind="toeplitz", max_length=LONG, storage="dense")
    folder = tiny_folder("modernbert", max_position_embeddings=length)
    corpus = tmp_path / "docs.txt"
    corpus.write_text("\n".join(docs * 3))
    out = tmp_path / "c.safetensors"
    for args, fix in ((("--storage", "dense"), "--storage compact"), (("--kind", "distilled"), "--max-length")):
        done = cli("calibrate", folder, "--max-length", length, "--corpus", corpus, *args, "--out", out)
        assert done.exit_code == 1 and "more than this machine's 1 GB" in done.output, done.output
        assert f"use a smaller {fix}" in done.output or f"({fix}" in done.output, done.output
        assert "Traceback" not in done.output and not out.exists()
    done = cli("analyze", folder, "--corpus", corpus, "--max-length", length, "--out", tmp_path / "an", "norms")
    assert done.exit_code == 1 and "making norm-average constants at L=4096" in done.output, done.output
    assert not (tmp_path / "an").exists()
    ckpt = tmp_path / "ckpt"
    assert (
        cli("convert", folder, "--fraction", "1", "--max-length", length, "--kind", "zeros", "--out", ckpt).exit_code
        == 0
    )
    done = cli("heal", ckpt, "--teacher", folder, "--corpus", corpus, "--heldout", "1", "--steps", "1",
               "--out", tmp_path / "healed")  # fmt: skip
    assert done.exit_code == 1 and "healing (it trains the constants) at L=4096" in done.output, done.output
    assert "--freeze-constants" in done.output and not (tmp_path / "healed").exists()
    # the fix it names: the constants kept as stored (compact), the other weights healed
    done = cli("heal", ckpt, "--teacher", folder, "--corpus", corpus, "--heldout", "1", "--steps", "1", "--train",
               "lora", "--freeze-constants", "--batch-size", "1", "--out", tmp_path / "healed")  # fmt: skip
    assert done.exit_code == 0, done.output
    before, after = (load_file(str(f / "model.safetensors")) for f in (ckpt, tmp_path / "healed"))
    assert before.keys() == after.keys()
    kept = [k for k in before if k.rpartition(".")[2] in (*COMPACT_PARTS, "papa_constants")]
    assert kept and all(torch.equal(after[k], before[k]) for k in kept)
    assert any(not torch.equal(after[k], before[k]) for k in before if k not in kept)
    healing = json.loads((tmp_path / "healed" / "papa_recipe.json").read_text())["healing"]
    assert healing["freeze_constants"] is True and healing["train"] == "lora"


def test_compact_constants_at_a_long_length_refuse_dense_uses(tiny):
    """Constants stored compact above L=1,024 cannot become dense (L, L) matrices: lambda ranking, distillation,
    dense storage and trainable constants say so in one sentence naming the fix."""
    length = 2048
    model, tok = tiny.model("modernbert", max_position_embeddings=length), tiny.tokenizer("modernbert")
    constants = papa_surgery.calibrate(model, tok, _documents(60), max_length=length, batch_size=1, progress=False)
    assert isinstance(constants, StructuredConstants)
    fix = r"stored compact at L=2048: dense \(L, L\) matrices per head .* use max_length=1024 or less"
    with pytest.raises(ValueError, match=fix):
        papa_surgery.rank("lambda", model, tok, constants=constants, task="sst2", steps=1)
    with pytest.raises(ValueError, match=fix):
        papa_surgery.convert(model, constants, "variance", 0.5, storage="dense")
    with pytest.raises(ValueError, match=fix):
        papa_surgery.convert(model, constants, "variance", 0.5, trainable_constants=True)
    with pytest.raises(ValueError, match=fix):
        papa_surgery.distill(model, tok, _documents(5), constants, [[0, 0]], steps=1)


def test_files_of_a_newer_format_are_refused(tiny, tmp_path):
    """Constants and ranking files carry a format version; a newer one is refused naming both versions, a missing
    one reads as version 1."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    constants = papa_surgery.calibrate(tiny.model("bert"), tiny.tokenizer("bert"), kind="uniform", max_length=16)
    path = constants.save(tmp_path / "c.safetensors")
    with safe_open(str(path), framework="pt") as f:
        meta, tensors = f.metadata(), {k: f.get_tensor(k) for k in f.keys()}
    assert meta["format_version"] == "1"
    save_file(tensors, str(path), metadata={**meta, "format_version": "99"})
    with pytest.raises(ValueError, match=r"of format 99, newer than the 1 this papa-surgery reads: upgrade"):
        Constants.load(path)
    save_file(tensors, str(path), metadata={k: v for k, v in meta.items() if k != "format_version"})
    assert torch.equal(Constants.load(path).values, constants.values)
    ranking = papa_surgery.rank("random", constants=constants).save(tmp_path / "r.json")
    data = json.loads(ranking.read_text())
    assert data["format_version"] == 1
    ranking.write_text(json.dumps({**data, "format_version": 2}))
    with pytest.raises(ValueError, match=r"ranking file .* of format 2, newer than the 1"):
        papa_surgery.Ranking.load(ranking)
    for damaged in (0, -3, True, 1.9, "1", [1]):  # taken as 1 (or as a number) before, where checkpoints refuse them
        ranking.write_text(json.dumps({**data, "format_version": damaged}))
        with pytest.raises(ValueError, match=r"damaged format version .* \(a whole number from 1\)"):
            papa_surgery.Ranking.load(ranking)
    for damaged in ("0", "1.0", "x"):
        save_file(tensors, str(path), metadata={**meta, "format_version": damaged})
        with pytest.raises(ValueError, match=r"damaged format version"):
            Constants.load(path)
    data.pop("format_version")
    ranking.write_text(json.dumps(data))
    assert papa_surgery.Ranking.load(ranking).order == papa_surgery.rank("random", constants=constants).order


def test_compact_storage_is_refused_for_kinds_made_dense(tiny, tiny_folder, tmp_path):
    """calibrate's compact storage and layout apply to the average and data-free kinds; for the analyses' and trained
    kinds (dense matrices) asking for them is an error naming the option, not silently a dense file."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with pytest.raises(ValueError, match=r"norm-average constants are made as dense .* drop storage="):
        papa_surgery.calibrate(model, tok, ["a cat sat"], kind="norm-average", max_length=16, storage="compact")
    corpus = tmp_path / "c.txt"
    corpus.write_text("the cat sat on the mat\na dog ran off\n" * 4)
    out = tmp_path / "c.safetensors"
    args = ("calibrate", tiny_folder("bert"), "--kind", "distilled", "--compact-band", "2", "--corpus", corpus)
    done = cli(*args, "--max-length", 16, "--out", out)
    assert done.exit_code == 2 and "'--compact-band'" in done.output and "drop --compact-band" in done.output
    assert not out.exists()
    assert isinstance(papa_surgery.calibrate(model, tok, kind="zeros", max_length=64, storage="compact"),
                      StructuredConstants)  # fmt: skip


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_attention_is_summed_in_full_precision(tiny, monkeypatch, dtype):
    """A family calibrated through forward hooks hands fp16/bf16 attention to the accumulator; its sums are taken in
    fp32 at least, so the parts equal those of the same attention given in fp32 (the per-cell means A / count fall
    below fp16's normal range at realistic counts)."""
    import dataclasses

    from test_structured_calibration import _corpus

    from papa_surgery.calibration import into_structure
    from papa_surgery.calibration.compaction import layout_for
    from papa_surgery.calibration.corpus import load_corpus

    real = into_structure.get_family
    monkeypatch.setattr(into_structure, "get_family", lambda m: dataclasses.replace(real(m), style="override"))
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    layout = layout_for("compact", 48, False, 3, 0)
    corpus = load_corpus(_corpus())
    seen = {}

    class Halved(into_structure.StructuredAccumulator):  # the same attention, rounded to the model's half dtype
        def add(self, layer, matrices):
            seen.setdefault("dtype", matrices.to(dtype).dtype)
            super().add(layer, matrices.to(dtype).to(torch.float32) if self.exact else matrices.to(dtype))

    for exact in (True, False):
        Halved.exact = exact
        monkeypatch.setattr(into_structure, "StructuredAccumulator", Halved)
        made = into_structure.calibrate_structured(model, tok, corpus, layout, batch_size=4, progress=False)
        seen[exact] = made
    for name, part in seen[True].parts.items():
        assert torch.allclose(seen[False].parts[name], part, rtol=1e-6, atol=1e-9), name
    assert torch.allclose(seen[False].variance, seen[True].variance, rtol=1e-5, atol=1e-12)


def test_a_probe_sweep_takes_constants_calibrated_into_the_structure(tiny_folder, tmp_path):
    """A sweep at L=600 (above 512: the average calibrated into the structure) ranks, converts and probes with those
    constants, keeps them on disk as a compact file, reads them back on a rerun, and its labelled kind trains their
    dense matrices."""
    from test_sweep import write_sst2

    from papa_surgery.experiments import SweepConfig, run_sweep

    config = SweepConfig(
        model=str(tiny_folder("modernbert", max_position_embeddings=1024)), tasks=("sst2",), fractions=(0.5,),
        seeds=1, data_dir=str(write_sst2(tmp_path / "data")), epochs=1, max_length=600, calibration_batch_size=16,
        kinds=("average", "toeplitz", "labeled-average"), methods=("variance",),
    )  # fmt: skip
    out = tmp_path / "results.jsonl"
    rows = run_sweep(config, out, progress=False)
    assert sorted(r["kind"] for r in rows) == ["average", "labeled-average", "toeplitz"]
    assert all(r["max_length"] == 600 and r["constant_heads"] == 4 for r in rows)
    saved = [Constants.load(p) for p in (tmp_path / "results.artifacts").glob("constants-*.safetensors")]
    assert saved and all(isinstance(c, StructuredConstants) for c in saved)
    assert run_sweep(config, out, progress=False) == rows  # resumed from the file: nothing left to do


def test_a_data_free_kind_stored_compact_by_auto_has_no_residual_and_equals_dense(tiny_folder, tmp_path):
    """Between L=129 and 512 ``--storage auto`` built data-free constants dense, then fitted a rank-16 residual of
    zeros to them: all-MiniLM-L6-v2's attention-free toeplitz checkpoint was larger than its source (94.2 MB against
    90.9 MB), and the card spoke of a residual. They are built into the structure with none, exact as before."""
    from transformers import AutoModel

    folder = tiny_folder("bert", max_position_embeddings=512)
    outs = {}
    for storage in ("auto", "dense"):
        outs[storage] = tmp_path / storage
        done = cli("convert", folder, "--fraction", "1", "--max-length", 256, "--kind", "toeplitz",
                   "--storage", storage, "--out", outs[storage])  # fmt: skip
        assert done.exit_code == 0, done.output
    config = json.loads((outs["auto"] / "config.json").read_text())
    assert config["papa_compact_rank"] == 0 and config["papa_compact_band"] > 0
    assert "residual" not in " ".join(cli("inspect", outs["auto"]).output.split())
    ids = torch.randint(5, 90, (2, 200), generator=torch.Generator().manual_seed(0))
    got = [AutoModel.from_pretrained(outs[s], trust_remote_code=True)(input_ids=ids)[0] for s in ("auto", "dense")]
    assert float((got[0] - got[1]).abs().max()) < 1e-5
