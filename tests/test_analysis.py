"""Norm-based and effective attention: brute-force equality, padding invariance, the effective-attention
identities, the new kinds and ranking end to end, and (real MiniLM) the papers' qualitative findings."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from papa_surgery.analysis import (
    analysis_constants,
    attention_norms,
    effective_attentions,
    head_projections,
    output_projection_modules,
)
from papa_surgery.analysis.capture import needs_output_attentions, recording
from papa_surgery.analysis.effective import effective_attention
from papa_surgery.calibration.encoding import model_inputs
from papa_surgery.ranking.methods import norm_ranking

FAMILIES = ["bert", "roberta", "distilbert", "mpnet", "deberta", "deberta-v2"]
TEXTS = [
    "it 's a charming and often affecting journey .",
    "a fun ride .",
    "the acting , costumes , music , cinematography and sound are all astounding .",
    "bleak",
]


def encoded(tok, model, texts, padding_side="right"):
    tok.padding_side = padding_side
    return model_inputs(model, tok(texts, padding=True, return_tensors="pt"))


@pytest.mark.parametrize("model_type", FAMILIES)
def test_heads_reconstruct_the_output_projection(tiny, model_type):
    """sum_h A_h F_h + b_O equals what the family's output projection computes: the weights are read right."""
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    inputs = encoded(tok, model, TEXTS)
    projections = head_projections(model)
    got, want = {}, {}
    outs = output_projection_modules(model)
    hooks = [m.register_forward_hook(lambda _m, _i, o, k=k: want.__setitem__(k, o)) for k, m in enumerate(outs)]

    def collect(layer, x, probs):
        p = projections[layer].to(torch.float64)
        f = p.transformed(x.double())  # (B, N, H, D)
        got[layer] = torch.einsum("bhij,bjhD->biD", probs.double(), f) + p.b_o
        # The chunked Gram matrices (streaming path) equal those of the materialised f.
        torch.testing.assert_close(p.gram(x.double(), chunk=5), f @ f.transpose(-1, -2))

    try:
        with torch.no_grad(), recording(model, collect):
            model(**inputs, output_attentions=needs_output_attentions(model))
    finally:
        for h in hooks:
            h.remove()
    real = inputs["attention_mask"].bool()
    for layer in got:
        diff = (got[layer] - want[layer].double())[real].abs().max().item()
        assert diff < 1e-4, (model_type, layer, diff)


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "deberta"])
def test_norms_equal_brute_force_and_ignore_padding(tiny, model_type):
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    inputs = encoded(tok, model, TEXTS)
    projections = head_projections(model)
    records = {}

    def collect(layer, x, probs):
        records[layer] = (x.double(), probs.double())

    with torch.no_grad(), recording(model, collect):
        model(**inputs, output_attentions=needs_output_attentions(model))
    norms = attention_norms(model, inputs)
    real = inputs["attention_mask"].bool()
    for layer, (x, probs) in records.items():
        f = projections[layer].to(torch.float64).transformed(x)  # (B, N, H, D)
        for b in range(x.shape[0]):
            n = int(real[b].sum())
            idx = real[b].nonzero().squeeze(-1)
            a = probs[b][:, idx][:, :, idx]  # (H, n, n)
            fb = f[b, idx].transpose(0, 1)  # (H, n, D)
            full = a[..., None] * fb[:, None, :, :]  # (H, n, n, D) materialised
            brute_head = full.norm(dim=-1)
            brute_sum = full.sum(0).norm(dim=-1)
            ours_head = norms[layer]["weighted"][b][:, idx][:, :, idx]
            ours_sum = norms[layer]["summed"][b][idx][:, idx]
            torch.testing.assert_close(ours_head, brute_head, rtol=1e-5, atol=1e-7)
            torch.testing.assert_close(ours_sum, brute_sum, rtol=1e-5, atol=1e-7)
            assert n == idx.numel()
    # Padding changes nothing: each example alone gives the same real entries as in a padded batch
    # (right padding: absolute-position families see other positions under left padding, by design).
    for side in ("right",):
        batch = attention_norms(model, encoded(tok, model, TEXTS, side))
        mask = encoded(tok, model, TEXTS, side)["attention_mask"].bool()
        for b, text in enumerate(TEXTS):
            alone = attention_norms(model, encoded(tok, model, [text]))
            idx = mask[b].nonzero().squeeze(-1)
            for layer in range(len(alone)):
                for key in ("weighted", "summed"):
                    got = batch[layer][key][b][..., idx, :][..., idx]
                    torch.testing.assert_close(got, alone[layer][key][0], rtol=1e-5, atol=1e-6)


def _null_basis(t: torch.Tensor) -> tuple[torch.Tensor, int]:
    """(left null space basis (n, n - r), r) of t (n, D), independently of the library (full SVD)."""
    u, s, _ = torch.linalg.svd(t, full_matrices=True)
    rank = int((s > 1e-6 * s[0]).sum())
    return u[:, rank:], rank


@pytest.mark.parametrize("model_type", ["bert", "distilbert", "deberta"])
@pytest.mark.parametrize("value_bias", [True, False])
def test_effective_attention_identities(tiny, model_type, value_bias):
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    inputs = encoded(tok, model, TEXTS)
    real = inputs["attention_mask"].bool()
    records = effective_attentions(model, inputs, value_bias=value_bias)
    projections = head_projections(model)
    head_size = projections[0].w_v.shape[-1]
    checked_full = 0
    for layer, rec in enumerate(records):
        proj = projections[layer].to(torch.float64)
        v = proj.values(rec["x"].double())  # (B, N, H, d)
        if not value_bias:
            v = v - proj.b_v
        t_all = torch.einsum("bnhd,hdD->bhnD", v, proj.w_o)  # (B, H, N, D): T per head
        for b in range(real.shape[0]):
            idx = real[b].nonzero().squeeze(-1)
            n = idx.numel()
            for h in range(proj.num_heads):
                a = rec["probs"][b, h][idx][:, idx].double()
                eff = rec["effective"][b, h][idx][:, idx]
                t = t_all[b, h, idx]  # (n, D), real tokens only
                want = a @ t
                rel = (eff @ t - want).norm() / want.norm()
                assert rel <= 1e-5, (layer, b, h, rel.item())
                null, rank = _null_basis(t)
                assert int(rec["rank"][b, h]) == rank
                if null.shape[1]:
                    assert (eff @ null).norm() <= 1e-5 * a.norm()
                if n <= head_size and rank == n:
                    torch.testing.assert_close(eff, a, rtol=0, atol=1e-9)
                    checked_full += 1
                # Padding rows and columns carry nothing.
                pad = ~real[b]
                assert rec["effective"][b, h][pad].abs().max().item() == 0 if pad.any() else True
                assert rec["effective"][b, h][:, pad].abs().max().item() == 0 if pad.any() else True
    assert checked_full > 0  # the short examples exercised the n <= head size case


def test_effective_attention_on_a_rank_deficient_transform():
    g = torch.Generator().manual_seed(0)
    n, width, rank = 9, 12, 4
    t = torch.randn(n, rank, generator=g, dtype=torch.float64) @ torch.randn(
        rank, width, generator=g, dtype=torch.float64
    )
    a = torch.softmax(torch.randn(n, n, generator=g, dtype=torch.float64), -1)
    eff, r = effective_attention(a, t)
    assert int(r) == rank
    torch.testing.assert_close(eff @ t, a @ t, rtol=1e-10, atol=1e-12)
    null, _ = _null_basis(t)
    assert (eff @ null).abs().max() < 1e-12
    # Effective attention is a projection: applying it twice changes nothing.
    eff2, _ = effective_attention(eff, t)
    torch.testing.assert_close(eff2, eff)


# --- streaming averages, kinds and ranking -------------------------------------------------------------

L = 24
CORPUS = (
    TEXTS
    + [
        "unflinchingly bleak and desperate",
        "a charming journey .",
        "the production 's austere locales are all astounding , given the sound .",
    ]
    * 2
)


def slot_reference(per_example, lengths):
    """Average (H-first) matrices per example into the slot grid of single sentences (right padding)."""
    layers, heads = per_example[0].shape[:2]
    sums = torch.zeros(layers, heads, L, L, dtype=torch.float64)
    counts = torch.zeros(L, L, dtype=torch.float64)
    for mats, n in zip(per_example, lengths, strict=True):
        slots = [*range(n - 1), L - 1]
        idx = torch.tensor(slots)
        sums[:, :, idx[:, None], idx[None, :]] += mats.double()
        counts[idx[:, None], idx[None, :]] += 1
    return torch.where(counts > 0, sums / counts.clamp_min(1), 0), counts


@pytest.mark.parametrize("model_type", ["bert", "mpnet"])
def test_analysis_constants_equal_per_example_reference(tiny, model_type):
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    norm = analysis_constants("norm-average", model, tok, CORPUS, max_length=L, batch_size=4, progress=False)
    eff = analysis_constants("effective-average", model, tok, CORPUS, max_length=L, batch_size=4, progress=False)
    assert (norm.kind, eff.kind) == ("norm-average", "effective-average")
    weighted, effective, lengths = [], [], []
    for text in CORPUS:
        inputs = encoded(tok, model, [text])
        lengths.append(inputs["input_ids"].shape[1])
        weighted.append(torch.stack([r["weighted"][0] for r in attention_norms(model, inputs)]))
        effective.append(torch.stack([r["effective"][0] for r in effective_attentions(model, inputs)]))
    ref, counts = slot_reference(weighted, lengths)
    assert torch.equal(norm.counts, counts)
    covered = counts > 0  # cells no example reached are filled (tests/test_coverage.py)
    torch.testing.assert_close(norm.values[..., covered], ref.float()[..., covered], rtol=1e-5, atol=1e-6)
    assert torch.equal(norm.filled_cells, ~covered)
    contribution = torch.tensor(norm.metadata["contribution"])
    per_entry = sum(w.double().sum((-1, -2)) for w in weighted) / sum(n * n for n in lengths)
    torch.testing.assert_close(contribution.double(), per_entry, rtol=1e-5, atol=1e-7)
    ref_eff, _ = slot_reference(effective, lengths)
    torch.testing.assert_close(
        eff.values[..., covered], ref_eff.clamp_min(0).float()[..., covered], rtol=1e-5, atol=1e-6
    )
    assert (eff.values >= 0).all() and len(eff.metadata["clipped_negative_mass"]) == 2
    # The norm ranking: smallest mean contribution first.
    ranking = norm_ranking(norm)
    assert ranking.method == "norm" and ranking.scores == sorted(ranking.scores)
    first = ranking.order[0]
    assert contribution[first[0], first[1]] == contribution.min()


LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["papa_surgery"] = None  # the checkpoint must not need the library
    import json, torch, transformers
    for job in json.load(open(sys.argv[1])):
        model = transformers.AutoModel.from_pretrained(job["dir"], trust_remote_code=True).eval()
        assert type(model).__name__.startswith("Papa"), type(model).__name__
        assert model.config.papa_kind == job["kind"], model.config.papa_kind
        with torch.no_grad():
            got = model(**torch.load(job["inputs"]))[0]
        diff = (got - torch.load(job["expected"])).abs().max().item()
        assert diff <= 1e-5, (job["dir"], diff)  # fp32 across processes
        print(job["kind"], diff)
    print("ALL-OK")
    """
)


def test_new_kinds_and_norm_ranking_through_convert_save_and_fresh_load(tiny, tmp_path):
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.surgery import convert

    jobs = []
    for model_type, kind in (
        ("bert", "norm-average"),
        ("deberta", "effective-average"),
        ("distilbert", "norm-average"),
    ):
        model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
        constants = analysis_constants(kind, model, tok, CORPUS, max_length=L, batch_size=4, progress=False)
        path = constants.save(tmp_path / f"{model_type}-{kind}.safetensors")
        constants = Constants.load(path)  # the scores survive the file
        ranking = (
            norm_ranking(constants)
            if kind == "norm-average"
            else norm_ranking(model=model, tokenizer=tok, corpus=CORPUS, max_length=L, progress=False)
        )
        heads = ranking.select(0.5)
        papa = convert(model, constants, heads, tokenizer=tok, method="norm", fraction=0.5)
        out = save_checkpoint(papa, tmp_path / f"ckpt-{model_type}", tokenizer=tok, card=False)
        inputs = encoded(tok, model, TEXTS)
        with torch.no_grad():
            expected = papa(**inputs)[0]
            source = model(**inputs)[0]
        assert (expected - source).abs().max() > 1e-4  # the constant heads changed something
        torch.save(inputs, tmp_path / f"{model_type}.in.pt")
        torch.save(expected, tmp_path / f"{model_type}.out.pt")
        jobs.append(
            {
                "dir": str(out),
                "kind": kind,
                "inputs": str(tmp_path / f"{model_type}.in.pt"),
                "expected": str(tmp_path / f"{model_type}.out.pt"),
            }
        )
        assert json.loads((out / "config.json").read_text())["papa_method"] == "norm"
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(tmp_path / "hf_home"))
    result = subprocess.run(
        [sys.executable, "-I", "-c", LOADER, str(tmp_path / "jobs.json")],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]


def test_analyze_names_a_bad_count_not_the_corpus(tiny, tmp_path):
    """``max_examples=0`` was said as "the corpus ... has no usable examples: give one example per line"."""
    from papa_surgery import analyze

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    for given, error, words in [({"max_examples": 0}, ValueError, "max_examples: 0 is not in the range"),
                                ({"max_length": "64"}, TypeError, "max_length: must be int")]:  # fmt: skip
        with pytest.raises(error, match=words):
            analyze(model, tok, CORPUS, "norms", tmp_path / "out", progress=False, **given)
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("which", ["norms", "effective"])
def test_analyze_writes_summaries_and_figures(tiny, tmp_path, which):
    from papa_surgery import Constants, Ranking, analyze

    model, tok = tiny.model("roberta"), tiny.tokenizer("roberta")
    model.train()
    summary = analyze(model, tok, CORPUS, which, tmp_path, max_length=L, batch_size=4, progress=False)
    assert model.training  # the caller's mode is put back
    for name in summary["files"]:
        assert (tmp_path / name).stat().st_size > 0, name
    saved = json.loads((tmp_path / "summary.json").read_text())
    assert saved["files"] == summary["files"] and ("norm-ranking.json" in saved["files"]) == (which == "norms")
    assert len(saved["layers"]) == 2 and len(saved["heads"]) == 8
    for item in saved["layers"]:
        assert abs(sum(item["attention_share"].values()) - 1) < 1e-6
        if which == "norms":
            assert abs(sum(item["norm_share"].values()) - 1) < 1e-6
            assert abs(sum(item["summed_norm_share"].values()) - 1) < 1e-6
    kind = "norm-average" if which == "norms" else "effective-average"
    assert Constants.load(tmp_path / f"{kind}.safetensors").kind == kind
    if which == "norms":
        assert Ranking.load(tmp_path / "norm-ranking.json").method == "norm"
    else:
        assert (tmp_path / "sep_mass.png").exists()
    with pytest.raises(ValueError, match="norms, effective"):
        analyze(model, tok, CORPUS, "weights", tmp_path / "new")
    # an analysis folder is replaced only with overwrite, and never one holding anything else (the user's file kept)
    options = dict(max_length=L, batch_size=4, progress=False)
    with pytest.raises(ValueError, match="overwrite=True"):
        analyze(model, tok, CORPUS, which, tmp_path, **options)
    assert analyze(model, tok, CORPUS, which, tmp_path, overwrite=True, **options)["files"] == summary["files"]
    (tmp_path / "mine.txt").write_text("keep me")
    with pytest.raises(ValueError, match="mine.txt"):
        analyze(model, tok, CORPUS, which, tmp_path, overwrite=True, **options)
    assert (tmp_path / "mine.txt").read_text() == "keep me"
    # a look-alike summary.json listing the user's own file does not make that file papa-surgery's
    lookalike = tmp_path / "lookalike"
    lookalike.mkdir()
    (lookalike / "summary.json").write_text(json.dumps({"files": ["data.csv", "summary.json"]}))
    (lookalike / "data.csv").write_text("1,2")
    with pytest.raises(ValueError, match="data.csv"):
        analyze(model, tok, CORPUS, which, lookalike, overwrite=True, **options)
    assert (lookalike / "data.csv").read_text() == "1,2"
    staging = [p.name for p in (*tmp_path.parent.iterdir(), *tmp_path.iterdir()) if ".papa-staging-" in p.name]
    assert staging == []  # every refusal and replacement left nothing half-written beside the folder


# --- the real model -------------------------------------------------------------------------------------


@pytest.mark.real
def test_minilm_norms_and_effective_attention_on_real_text(minilm, tmp_path):
    """What the papers report, where it holds on MiniLM (see notes/analysis_readme.md for the measurements).

    Kobayashi et al.: special tokens get much attention weight but little norm contribution. On MiniLM the
    weight piles on [CLS] (not [SEP], as in BERT-base), and the norm lens removes it: in the middle layers
    [CLS]+[SEP] get a far smaller share of ||alpha f|| than of alpha. Sun & Marasovic: effective attention
    is less about the special tokens; on MiniLM it halves the [CLS] mass, but leaves [SEP]'s (already
    small) mass as it is, so [SEP] is checked not to grow much rather than to shrink.
    """
    from papa_surgery.analysis import analyze
    from papa_surgery.calibration.corpus import default_corpus

    model, tok = minilm
    corpus = default_corpus(max_examples=100)
    norms = analyze(model, tok, corpus, "norms", tmp_path / "norms", max_length=64, progress=False)
    eff = analyze(model, tok, corpus, "effective", tmp_path / "effective", max_length=64, progress=False)
    for folder, summary in (("norms", norms), ("effective", eff)):
        for name in summary["files"]:
            assert (tmp_path / folder / name).stat().st_size > 0
    special = ("cls", "sep")
    for item in norms["layers"][1:5]:
        weight = sum(item["attention_share"][c] for c in special)
        norm = sum(item["norm_share"][c] for c in special)
        summed = sum(item["summed_norm_share"][c] for c in special)
        assert norm < 0.5 * weight and summed < 0.5 * weight, item
    for item in eff["layers"][1:5]:
        assert item["effective_mass"]["cls"] < 0.8 * item["attention_share"]["cls"], item
        assert item["effective_mass"]["sep"] < item["attention_share"]["sep"] + 0.01, item
