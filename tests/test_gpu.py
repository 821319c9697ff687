"""On a GPU: a converted checkpoint loaded by the real client onto CUDA, in fp32 and bf16, computes what it computes
on the CPU, in every family and storage; calibrating and sharpening (per layer and per head) on CUDA give the
CPU's constants, and ``convert`` with its defaults (the sensitivity ranking, sharpened per head) the CPU's checkpoint.

Skipped where PyTorch sees no GPU (CI has none); run it on one with ``pytest -m "" tests/test_gpu.py``.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILY_TYPES, SENTENCES, cli
from transformers import AutoModel

import papa_surgery
from papa_surgery.hub_code.families import FAMILIES

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")

L = 32
# every storage a user can end up with: dense matrices, compacted at conversion, calibrated into the structure
STORAGES = {
    "dense": ({}, {"storage": "dense"}),
    "compact": ({}, {"storage": "compact", "compact_band": 4, "compact_rank": 3}),
    "calibrated-compact": ({"storage": "compact", "compact_band": 4, "compact_rank": 3}, {}),
}


def _inputs(tok, device) -> dict:
    """A right-padded batch of mixed lengths (the shortest is mostly padding)."""
    enc = tok(SENTENCES, padding=True, truncation=True, max_length=L, return_tensors="pt")
    return {k: v.to(device) for k, v in enc.items()}


def _hidden(model, inputs) -> torch.Tensor:
    """(B, N, D) last hidden states in fp32, zero at padding (what a pooling reads)."""
    with torch.no_grad():
        out = model(**inputs).last_hidden_state.float()
    return (out * inputs["attention_mask"][..., None]).cpu()


def _source_runs_in_bf16(tiny, model_type, tmp_path) -> bool:
    """Whether the source loaded in bf16 runs: transformers' own DeBERTa v1 does not (its q_bias/v_bias stay
    float32), nor then can its conversion."""
    folder = tiny.save(model_type, tmp_path / "source")
    source = AutoModel.from_pretrained(folder, dtype=torch.bfloat16).to("cuda").eval()
    try:
        _hidden(source, _inputs(tiny.tokenizer(model_type), "cuda"))
    except RuntimeError:
        return False
    return True


def _checkpoint(tiny, model_type, tmp_path, fraction, storage, kind="average"):
    try:  # a GPU machine's image may hold an older transformers than the one CI tests
        FAMILIES[model_type].check_transformers()
    except ImportError as error:
        pytest.skip(str(error))
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    calibrate_options, convert_options = STORAGES[storage]
    constants = papa_surgery.calibrate(model, tok, SENTENCES * 3, max_length=L, progress=False, **calibrate_options)
    if kind == "sharpened":  # convert's default kind: an exponent per head fitted to the source (on the CPU)
        heads = papa_surgery.rank("first-to-last", model, tok, constants=constants).select(fraction)
        constants = papa_surgery.sharpen(model, tok, SENTENCES * 3, constants, heads, steps=8, progress=False)
    papa = papa_surgery.convert(model, constants, "first-to-last", fraction, tokenizer=tok, **convert_options)
    return papa_surgery.save(papa, tmp_path / "ckpt", tokenizer=tok, card=False), model, tok


@pytest.mark.parametrize("storage", list(STORAGES))
@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_the_checkpoint_on_cuda_computes_what_it_computes_on_the_cpu(tiny, model_type, storage, tmp_path):
    folder, _, tok = _checkpoint(tiny, model_type, tmp_path, 0.5, storage)
    cpu = _hidden(AutoModel.from_pretrained(folder, trust_remote_code=True).eval(), _inputs(tok, "cpu"))
    on_cuda = AutoModel.from_pretrained(folder, trust_remote_code=True).to("cuda").eval()
    assert torch.allclose(_hidden(on_cuda, _inputs(tok, "cuda")), cpu, atol=1e-4, rtol=1e-4)
    if not _source_runs_in_bf16(tiny, model_type, tmp_path):
        pytest.skip(f"{model_type}: the source itself does not run in bf16")
    half = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16).to("cuda").eval()
    kept_float = {n for n, p in half.named_parameters() if p.dtype != torch.bfloat16 and not n.endswith("constants")}
    assert kept_float == set(), kept_float  # every weight in bf16, the encoder's too
    got = _hidden(half, _inputs(tok, "cuda"))
    real = _inputs(tok, "cpu")["attention_mask"].bool()
    assert torch.isfinite(got).all()
    cosine = torch.nn.functional.cosine_similarity(got[real], cpu[real], dim=-1)  # (tokens,)
    assert cosine.min() > 0.98, (model_type, storage, cosine.min())


@pytest.mark.parametrize("storage", ["dense", "compact"])
@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_sharpened_constants_on_cuda_compute_what_they_compute_on_the_cpu(tiny, model_type, storage, tmp_path):
    """convert's default kind (sharpened per head), dense and compact, at fraction 1: CUDA in fp32 is the CPU, bf16
    stays near it."""
    folder, _, tok = _checkpoint(tiny, model_type, tmp_path, 1.0, storage, kind="sharpened")
    cpu = _hidden(AutoModel.from_pretrained(folder, trust_remote_code=True).eval(), _inputs(tok, "cpu"))
    on_cuda = AutoModel.from_pretrained(folder, trust_remote_code=True).to("cuda").eval()
    assert torch.allclose(_hidden(on_cuda, _inputs(tok, "cuda")), cpu, atol=1e-4, rtol=1e-4)
    half = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16).to("cuda").eval()
    got, real = _hidden(half, _inputs(tok, "cuda")), _inputs(tok, "cpu")["attention_mask"].bool()
    assert torch.isfinite(got).all()
    assert torch.nn.functional.cosine_similarity(got[real], cpu[real], dim=-1).min() > 0.98


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_fraction_1_on_cuda_in_bf16_stays_finite_and_near_fp32(tiny, model_type, tmp_path):
    folder, _, tok = _checkpoint(tiny, model_type, tmp_path, 1.0, "dense")
    if not _source_runs_in_bf16(tiny, model_type, tmp_path):
        pytest.skip(f"{model_type}: the source itself does not run in bf16")
    full = _hidden(AutoModel.from_pretrained(folder, trust_remote_code=True).to("cuda").eval(), _inputs(tok, "cuda"))
    model = AutoModel.from_pretrained(folder, trust_remote_code=True, dtype=torch.bfloat16).to("cuda").eval()
    half = _hidden(model, _inputs(tok, "cuda"))
    real = _inputs(tok, "cpu")["attention_mask"].bool()
    assert torch.nn.functional.cosine_similarity(half[real], full[real], dim=-1).min() > 0.98


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_fraction_0_on_cuda_is_the_source_on_cuda(tiny, model_type, tmp_path):
    folder, source, tok = _checkpoint(tiny, model_type, tmp_path, 0.0, "dense")
    papa = AutoModel.from_pretrained(folder, trust_remote_code=True).to("cuda").eval()
    inputs = _inputs(tok, "cuda")
    assert torch.allclose(_hidden(papa, inputs), _hidden(source.to("cuda").eval(), inputs), atol=1e-5, rtol=1e-5)


def test_calibrating_and_sharpening_on_cuda_give_the_cpus_constants(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    corpus = SENTENCES * 4
    cpu = papa_surgery.calibrate(model, tok, corpus, max_length=L, progress=False)
    gpu = papa_surgery.calibrate(model, tok, corpus, max_length=L, device="cuda", progress=False)
    assert next(model.parameters()).device.type == "cpu"
    assert torch.allclose(gpu.values, cpu.values, atol=1e-5)
    heads = papa_surgery.rank("first-to-last", model, tok, constants=cpu).select(0.5)
    fitted = {
        device: papa_surgery.sharpen(model, tok, corpus, cpu, heads, search="walk", device=device, progress=False)
        for device in ("cpu", "cuda")
    }
    assert fitted["cuda"].metadata["sharpened"]["exponents"] == fitted["cpu"].metadata["sharpened"]["exponents"]
    assert torch.allclose(fitted["cuda"].values, fitted["cpu"].values, atol=1e-5)
    assert next(model.parameters()).device.type == "cpu"


def test_per_head_sharpening_on_cuda_fits_the_cpus_exponents(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    corpus = SENTENCES * 4
    average = papa_surgery.calibrate(model, tok, corpus, max_length=L, progress=False)
    heads = papa_surgery.rank("first-to-last", model, tok, constants=average).select(1.0)
    fitted = {
        device: papa_surgery.sharpen(
            model, tok, corpus, average, heads, search="per-head", steps=8, device=device, progress=False
        )
        for device in ("cpu", "cuda")
    }
    found = {d: f.metadata["sharpened"] for d, f in fitted.items()}
    cpu = [p for ps in found["cpu"]["exponents"].values() for p in ps.values()]
    cuda = [p for ps in found["cuda"]["exponents"].values() for p in ps.values()]
    assert cuda == pytest.approx(cpu, rel=1e-3) and found["cuda"]["losses"] == pytest.approx(
        found["cpu"]["losses"], rel=1e-3
    )
    assert torch.allclose(fitted["cuda"].values, fitted["cpu"].values, atol=1e-4)
    assert next(model.parameters()).device.type == "cpu"


def test_convert_with_its_defaults_on_cuda_writes_the_cpus_checkpoint(tiny, tiny_folder, corpus, tmp_path):
    """``papa-surgery convert`` with no kind or method (the sensitivity ranking, then sharpened constants fitted per
    head) run with ``--device cuda`` ranks the heads in the CPU's order and fits the CPU's exponents."""
    folder = tiny_folder("bert")
    made = {}
    for device in ("cpu", "cuda"):
        out = tmp_path / device
        args = ("convert", folder, "--fraction", 0.5, "--corpus", corpus, "--max-length", L, "--device", device)
        result = cli(*args, "--out", out)
        assert result.exit_code == 0, result.output
        made[device] = json.loads((out / "papa_recipe.json").read_text()), papa_surgery.load(out)[0]
    (cpu, cpu_model), (cuda, cuda_model) = made["cpu"], made["cuda"]
    assert cuda["method"] == cpu["method"] == "sensitivity" and cuda["kind"] == cpu["kind"] == "sharpened"
    assert cuda["constant_heads"] == cpu["constant_heads"]
    exponents = [[p for ps in r["sharpened"]["exponents"].values() for p in ps.values()] for r in (cpu, cuda)]
    assert exponents[1] == pytest.approx(exponents[0], rel=1e-3)
    enc = tiny.tokenizer("bert")(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():  # both checkpoints loaded on the CPU: their constants agree
        out = [m(**enc).last_hidden_state for m in (cpu_model, cuda_model)]
    torch.testing.assert_close(out[1], out[0], atol=1e-4, rtol=1e-4)


def test_a_bf16_source_calibrates_on_cuda_in_full_precision(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    full = papa_surgery.calibrate(model, tok, SENTENCES, max_length=L, progress=False)
    half = papa_surgery.calibrate(model.to(torch.bfloat16), tok, SENTENCES, max_length=L, device="cuda", progress=False)
    assert half.values.dtype == torch.float32 and (half.values - full.values).abs().max() < 0.05
