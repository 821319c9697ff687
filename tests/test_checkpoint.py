"""Conversion and the standalone checkpoint: fresh-process round trips, Q/K removal, bad inputs, Trainer."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code.families import FAMILIES
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.ranking.methods import label_free_ranking

FAMILY_TYPES = sorted(FAMILIES)
L = 16
# Layer 0 mixes constant and kept heads; layer 1 is attention-free (no Q/K at all).
HEADS = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]

LOADER = textwrap.dedent(
    """
    import sys
    sys.modules["papa_surgery"] = None  # the checkpoint must not need the library
    import json, torch, transformers
    jobs = json.load(open(sys.argv[1]))
    for job in jobs:
        cls = getattr(transformers, job["auto"])
        model = cls.from_pretrained(job["dir"], trust_remote_code=True, attn_implementation=job["attn"]).eval()
        inputs = torch.load(job["inputs"])
        expected = torch.load(job["expected"])
        with torch.no_grad():
            out = model(**inputs)
        got = out[0]
        diff = (got - expected).abs().max().item()
        print(job["name"], type(model).__name__, diff)
        assert type(model).__name__.startswith("Papa"), type(model).__name__
        assert diff <= 1e-6, (job["name"], diff)
    print("ALL-OK")
    """
)


def fresh_python(script: str, *args: str, cwd: Path, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", HF_HOME=str(cwd / "hf_home"))
    return subprocess.run(
        [python, "-I", "-c", script, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def model_inputs(auto: str, tok, model) -> dict:
    enc = tok(["the cat sat on the mat", "a dog"], ["it was happy", "ran off"], padding=True, return_tensors="pt")
    enc = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask", "token_type_ids")}
    if "token_type_ids" in enc and model.config.model_type.endswith("distilbert"):
        enc.pop("token_type_ids")
    if "token_type_ids" in enc and getattr(model.config, "type_vocab_size", 2) < 2:
        enc.pop("token_type_ids")
    if auto == "AutoModelForMultipleChoice":
        enc = {k: v.unsqueeze(1).expand(-1, 2, -1).contiguous() for k, v in enc.items()}
    return enc


def loader_job(papa, tok, auto: str, out: Path, name: str, tmp_path: Path) -> dict:
    """A job for ``LOADER``: the saved checkpoint ``out`` must reproduce ``papa``'s output on these inputs."""
    inputs = model_inputs(auto, tok, papa)
    with torch.no_grad():
        expected = papa(**inputs)[0]
    torch.save(inputs, tmp_path / f"{name}.in.pt")
    torch.save(expected, tmp_path / f"{name}.out.pt")
    return {
        "name": name,
        "auto": auto,
        "attn": papa.config._attn_implementation,
        "dir": str(out),
        "inputs": str(tmp_path / f"{name}.in.pt"),
        "expected": str(tmp_path / f"{name}.out.pt"),
    }


def _round_trip_every_family_and_auto_class(tiny, tmp_path, python: str, skip=(), families=FAMILY_TYPES):
    jobs = []
    for model_type in families:
        family = FAMILIES[model_type]
        tok = tiny.tokenizer(model_type)
        for auto in family.auto_classes:
            if (model_type, auto) in skip:
                continue
            src = tiny.model(model_type, head=auto)
            heads_per_layer = (
                src.config.num_attention_heads if hasattr(src.config, "num_attention_heads") else src.config.n_heads
            )
            layers = len(attention_modules(src))
            consts = Constants(torch.rand(layers, heads_per_layer, L, L) + 0.01, "average", L)
            papa = convert(src, consts, HEADS, tokenizer=tok, fraction=0.75)
            name = f"{model_type}-{auto}"
            out = save_checkpoint(papa, tmp_path / name, tokenizer=tok, recipe={"test": True}, card=False)
            jobs.append(loader_job(papa, tok, auto, out, name, tmp_path))
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path, python=python)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-4000:]
    assert len([ln for ln in result.stdout.splitlines() if ln.count(" ") == 2]) == len(jobs)


def test_round_trip_every_family_and_auto_class_in_fresh_process(tiny, tmp_path):
    _round_trip_every_family_and_auto_class(tiny, tmp_path, sys.executable)


def floor_python() -> str | None:
    """An interpreter with the oldest transformers the checkpoint code declares (scripts/test.sh makes one)."""
    candidate = os.environ.get("PAPA_FLOOR_PYTHON") or str(
        Path(__file__).resolve().parents[1] / ".venv-floor/bin/python"
    )
    return candidate if Path(candidate).is_file() else None


def test_round_trip_on_the_oldest_supported_transformers(tiny, tmp_path):
    """Checkpoints saved here load and compute the same under the declared floor (TRANSFORMERS_FLOOR)."""
    from papa_surgery.hub_code.compat import TRANSFORMERS_FLOOR

    python = floor_python()
    if python is None:
        pytest.skip("no floor interpreter: scripts/test.sh makes .venv-floor (or set PAPA_FLOOR_PYTHON)")
    version = subprocess.run(
        [python, "-c", "import transformers; print(transformers.__version__)"], capture_output=True, text=True
    ).stdout.strip()
    assert tuple(int(x) for x in version.split(".")[:2]) == TRANSFORMERS_FLOOR, version
    # Families that need a newer transformers than the floor (the modern encoders) are left out here; the
    # floor must refuse them with the release they need, which the next test checks.
    families = [t for t in FAMILY_TYPES if FAMILIES[t].min_transformers <= TRANSFORMERS_FLOOR]
    # transformers 5.0.0's own XLMRobertaForMultipleChoice fails (its encoder returns no pooled output).
    _round_trip_every_family_and_auto_class(
        tiny, tmp_path, python, skip={("xlm-roberta", "AutoModelForMultipleChoice")}, families=families
    )


NEWER_THAN_FLOOR = [t for t in FAMILY_TYPES if FAMILIES[t].min_transformers > (5, 0)]


@pytest.mark.slow  # slow tier: one floor process per family
@pytest.mark.parametrize("model_type", NEWER_THAN_FLOOR)
def test_floor_transformers_refuses_newer_families_by_name(tiny, tmp_path, model_type):
    """A checkpoint of a family newer than the floor fails to load there with the release it needs."""
    python = floor_python()
    if python is None:
        pytest.skip("no floor interpreter: scripts/test.sh makes .venv-floor (or set PAPA_FLOOR_PYTHON)")
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    consts = Constants(torch.rand(2, 4, L, L) + 0.01, "average", L)
    out = save_checkpoint(convert(src, consts, HEADS, tokenizer=tok), tmp_path / "ckpt", card=False)
    script = (
        "import sys, transformers\n"
        "try:\n"
        "    transformers.AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)\n"
        "except Exception as e:\n"
        "    print('REFUSED', e)\n"
    )
    result = fresh_python(script, str(out), cwd=tmp_path, python=python)
    need = ".".join(map(str, FAMILIES[model_type].min_transformers))
    assert "REFUSED" in result.stdout and f"transformers>={need}" in result.stdout, result.stdout + result.stderr


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_checkpoint_layout_and_weights(tiny, tmp_path, model_type):
    src = tiny.model(model_type)
    tok = tiny.tokenizer(model_type)
    modules = attention_modules(src)
    h = getattr(src.config, FAMILIES[model_type].heads_attr)
    consts = Constants.from_kind("toeplitz", len(modules), h, L)
    papa = convert(src, consts, HEADS, tokenizer=tok, dtype="fp16")
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, recipe={"fraction": 0.75}, card=False)
    names = {p.name for p in out.iterdir()}
    for required in (
        "config.json",
        "model.safetensors",
        "modeling_papa.py",
        "configuration_papa.py",
        "papa_recipe.json",
    ):
        assert required in names
    assert not any(n.endswith((".bin", ".pt", ".pkl")) for n in names)
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == f"papa_{model_type}"
    assert config["papa_constant_heads"] == HEADS
    assert config["papa_constants_dtype"] == "float16"
    assert set(config["auto_map"]) >= {"AutoConfig", "AutoModel", "AutoModelForMaskedLM"}
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:
        keys = list(f.keys())
        consts_keys = [k for k in keys if k.endswith("papa_constants")]
        # Only constant heads store constants: 2 in layer 0, 4 in layer 1.
        shapes = sorted(tuple(f.get_tensor(k).shape) for k in consts_keys)
        assert shapes == [(2, L, L), (4, L, L)]
        assert all(f.get_tensor(k).dtype == torch.float16 for k in consts_keys)
    # The all-constant layer 1 has no query/key weights at all; layer 0 keeps 2 of 4 heads' rows.
    family = FAMILIES[model_type]
    layer1 = [k for k in keys if (".1." in k or "layer.1." in k) and ("attention" in k or "attn" in k)]
    q_names = {family.q, family.k, "pos_proj", "pos_q_proj", "pos_key_proj", "pos_query_proj"}
    if model_type != "deberta" and not family.fused_qkv:
        assert not any(f".{q}." in k for k in layer1 for q in q_names), layer1
    m0 = attention_modules(papa)[0]
    d = m0.papa_heads.head_dim
    if family.fused_qkv:  # ModernBERT: the fused projection keeps kept heads' Q/K rows and every V row
        assert m0.Wqkv.proj.weight.shape[0] == (2 * 2 + h) * d
        assert attention_modules(papa)[1].Wqkv.proj.weight.shape[0] == h * d
    elif model_type == "deberta":
        assert m0.in_proj.weight.shape[0] == 2 * 3 * d
        assert attention_modules(papa)[1].in_proj is None
    else:
        assert getattr(m0, family.q).weight.shape[0] == 2 * d
        # No query weights left: None, or (interface families) a weightless stand-in the family's forward calls.
        assert not isinstance(getattr(attention_modules(papa)[1], family.q), torch.nn.Linear)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_loaded_in_bf16_every_weight_has_the_sources_dtype_and_it_runs_where_the_source_runs(
    tiny, tmp_path, model_type
):
    """``from_pretrained(..., dtype=torch.bfloat16)``: each weight the checkpoint shares with the source is in the
    dtype the source's has loaded the same way (DeBERTa v1's q_bias/v_bias stay float32 in transformers, and once
    left the whole rebuilt layer float32), and the model computes in bf16 what it computes in fp32."""
    from transformers import AutoModel

    source_dir = tiny.save(model_type, tmp_path / "source")
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    consts = Constants.from_kind(
        "toeplitz", len(attention_modules(src)), getattr(src.config, FAMILIES[model_type].heads_attr), L
    )
    ckpt = save_checkpoint(convert(src, consts, HEADS, tokenizer=tok), tmp_path / "ckpt", tokenizer=tok, card=False)
    source = AutoModel.from_pretrained(source_dir, dtype=torch.bfloat16)
    papa = AutoModel.from_pretrained(ckpt, trust_remote_code=True, dtype=torch.bfloat16).eval()
    wanted = {name: p.dtype for name, p in source.named_parameters()}
    got = {name: p.dtype for name, p in papa.named_parameters() if not name.endswith("papa_constants")}
    assert {n: d for n, d in got.items() if d != wanted.get(n, torch.bfloat16)} == {}
    inputs = tok(["a fun ride .", "it 's a charming and often affecting journey ."], padding=True, return_tensors="pt")
    try:
        with torch.no_grad():
            source(**inputs)
    except RuntimeError as error:  # transformers' own DeBERTa v1 cannot run in bf16: neither can its conversion
        with pytest.raises(RuntimeError, match="dtype|scalar type"):
            papa(**inputs)
        pytest.skip(f"the source itself fails in bf16: {error}")
    full = AutoModel.from_pretrained(ckpt, trust_remote_code=True).eval()
    with torch.no_grad():
        half, exact = papa(**inputs).last_hidden_state.float(), full(**inputs).last_hidden_state
    real = inputs["attention_mask"].bool()
    assert torch.nn.functional.cosine_similarity(half[real], exact[real], dim=-1).min() > 0.98


@pytest.mark.real
def test_real_minilm_half_converted_round_trip(minilm_path, tmp_path):
    from transformers import AutoModel, AutoTokenizer

    from papa_surgery.calibration.average import calibrate
    from papa_surgery.calibration.corpus import default_corpus

    src = AutoModel.from_pretrained(minilm_path).eval()
    tok = AutoTokenizer.from_pretrained(minilm_path)
    consts = calibrate(src, tok, default_corpus(max_examples=48), max_length=64, progress=False)
    ranking = label_free_ranking("variance", 6, 12, consts)
    heads = ranking.select(0.5)
    assert len(heads) == 36
    papa = convert(src, consts, heads, tokenizer=tok, method="variance", fraction=0.5)
    enc = tok(
        ["Constant attention is cheap.", "A second, longer sentence to pad the first one."],
        padding=True,
        return_tensors="pt",
    )
    with torch.no_grad():
        expected = papa(**enc).last_hidden_state
        source = src(**enc).last_hidden_state
    assert (expected - source).abs().max() > 1e-3  # half the heads really changed
    out = save_checkpoint(papa, tmp_path / "minilm-papa", tokenizer=tok, recipe={}, card=False)
    torch.save(dict(enc), tmp_path / "in.pt")
    torch.save(expected, tmp_path / "out.pt")
    job = [
        {
            "name": "minilm",
            "auto": "AutoModel",
            "attn": papa.config._attn_implementation,
            "dir": str(out),
            "inputs": str(tmp_path / "in.pt"),
            "expected": str(tmp_path / "out.pt"),
        }
    ]
    (tmp_path / "jobs.json").write_text(json.dumps(job))
    result = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path)
    assert "ALL-OK" in result.stdout, result.stdout + result.stderr[-3000:]
    size_src = (Path(minilm_path) / "model.safetensors").stat().st_size
    assert (out / "model.safetensors").stat().st_size < size_src  # Q/K of 36 heads are gone


def test_no_constant_heads_equals_source(tiny):
    src = tiny.model("bert")
    tok = tiny.tokenizer("bert")
    papa = convert(src, Constants.from_kind("uniform", 2, 4, L), [], tokenizer=tok)
    enc = tok(["the cat sat", "a dog ran off far away"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(papa(**enc).last_hidden_state, src(**enc).last_hidden_state, atol=1e-6)


# --- bad inputs -------------------------------------------------------------------------------------------------


def test_bad_inputs_are_clear_errors(tiny, tmp_path):
    src = tiny.model("bert")
    tok = tiny.tokenizer("bert")
    good = Constants.from_kind("identity", 2, 4, L)
    with pytest.raises(ValueError, match="3 layers x 4 heads but the model has 2 x 4"):
        convert(src, Constants.from_kind("identity", 3, 4, L), [[0, 0]])
    other = Constants.from_kind("identity", 2, 4, L, source_model="roberta-base")
    with pytest.raises(ValueError, match="calibrated on 'roberta-base'"):
        convert(src, other, [[0, 0]], source_name="bert-tiny")
    with pytest.raises(ValueError, match="NaN or inf"):
        Constants(torch.full((2, 4, L, L), float("nan")), "average", L)
    with pytest.raises(ValueError, match="does not exist in a model"):
        convert(src, good, [[5, 0]])
    ranking = label_free_ranking("first-to-last", 2, 4)
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="between 0 and 1"):
            ranking.select(bad)
    assert ranking.select(0) == [] and len(ranking.select(1)) == 8
    from transformers import GPT2Config, GPT2Model

    gpt2 = GPT2Model(GPT2Config(n_layer=1, n_head=2, n_embd=8, vocab_size=10))
    with pytest.raises(ValueError, match="unsupported architecture.*bert.*roberta"):
        convert(gpt2, good, [])
    papa = convert(src, good, [[0, 0]], tokenizer=tok)
    with pytest.raises(ValueError, match="papa_max_length=16"):
        papa(**tok(["word " * 30], return_tensors="pt"))
    with pytest.raises(ValueError, match="papa_max_length=16"):
        papa(**tok(["word " * 12], ["x x x"], return_tensors="pt"))  # a pair longer than L
    papa(**tok(["word " * 12], ["x"], return_tensors="pt"))  # L tokens: a long first segment has a place (issue 23)


def test_existing_folder_and_failed_save_leave_nothing_half_written(tiny, tmp_path):
    src = tiny.model("bert")
    tok = tiny.tokenizer("bert")
    papa = convert(src, Constants.from_kind("identity", 2, 4, L), [[0, 0]], tokenizer=tok)
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(ValueError, match="already exists; pass overwrite=True"):
        save_checkpoint(papa, out, tokenizer=tok, card=False)

    class Broken:
        def save_pretrained(self, *_a, **_k):
            raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(papa, tmp_path / "new", tokenizer=Broken(), card=False)
    assert not (tmp_path / "new").exists()
    with pytest.raises(OSError, match="disk full"):
        save_checkpoint(papa, out, tokenizer=Broken(), overwrite=True, card=False)
    assert sorted(p.name for p in out.iterdir()) == before  # the old checkpoint is intact
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]  # no temporary folders left
    save_checkpoint(papa, out, tokenizer=tok, overwrite=True, card=False)


def test_output_attentions_returns_constants_used(tiny):
    src = tiny.model("bert")
    tok = tiny.tokenizer("bert")
    consts = Constants.from_kind("toeplitz", 2, 4, L)
    papa = convert(src, consts, [[0, 2]], tokenizer=tok)
    enc = tok(["the cat sat on the mat", "a dog"], padding=True, return_tensors="pt")
    with torch.no_grad():
        att = papa(**enc, output_attentions=True).attentions[0]  # (B, H, N, N)
    n = int(enc["attention_mask"][1].sum())
    slots = list(range(n - 1)) + [L - 1]
    expected = consts.values[0, 2][slots][:, slots]
    expected = expected / expected.sum(-1, keepdim=True)
    assert torch.allclose(att[1, 2, :n, :n], expected, atol=1e-6)
    assert torch.allclose(att[:, 2].sum(-1)[enc["attention_mask"].bool()], torch.ones(()), atol=1e-6)
    assert (att[1, 2, :n, n:] == 0).all()


def test_trainer_fine_tunes_with_frozen_or_trainable_constants(tiny, tmp_path):
    from datasets import Dataset
    from transformers import AutoModelForSequenceClassification, Trainer, TrainingArguments

    src = tiny.model("bert", head="AutoModelForSequenceClassification")
    tok = tiny.tokenizer("bert")
    papa = convert(src, Constants.from_kind("toeplitz", 2, 4, L), HEADS, tokenizer=tok)
    ckpt = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    texts = ["the cat sat", "a dog ran", "it was good", "bad movie", "the end", "so happy"] * 4
    data = Dataset.from_dict({"text": texts, "label": [i % 3 for i in range(len(texts))]})
    data = data.map(lambda b: tok(b["text"], truncation=True, max_length=L), batched=True, remove_columns=["text"])

    for trainable in (False, True):
        model = AutoModelForSequenceClassification.from_pretrained(
            ckpt, trust_remote_code=True, num_labels=3, papa_trainable_constants=trainable
        )
        # Frozen constants are persistent buffers, trainable ones parameters: read both through the state dict.
        consts = {n: t.clone() for n, t in model.state_dict().items() if n.endswith("papa_constants")}
        assert len(consts) == 2  # HEADS spans both layers
        params = {n for n, p in model.named_parameters() if p.requires_grad}
        buffers = {n for n, _ in model.named_buffers()}
        home, other = (params, buffers) if trainable else (buffers, params)
        assert set(consts) <= home and not set(consts) & other
        value = model.bert.encoder.layer[0].attention.self.value.weight.detach().clone()
        args = TrainingArguments(
            output_dir=str(tmp_path / f"run{trainable}"),
            per_device_train_batch_size=4,
            num_train_epochs=1,
            learning_rate=1e-2,
            report_to=[],
            save_strategy="no",
            use_cpu=True,
        )
        Trainer(model=model, args=args, train_dataset=data, processing_class=tok).train()
        after = {n: t for n, t in model.state_dict().items() if n in consts}
        changed = [not torch.equal(after[n], consts[n]) for n in consts]
        assert len(after) == len(consts) and (all(changed) if trainable else not any(changed))
        assert not torch.equal(model.bert.encoder.layer[0].attention.self.value.weight.detach(), value)


def test_no_loading_flags_are_written_into_the_tokenizer_config(tiny_folder, tmp_path):
    """A source read with local_files_only=True must not make every user of the checkpoint read locally only."""
    import papa_surgery
    from papa_surgery.conversion.checkpoint import LOADING_FLAGS

    model, tok = papa_surgery.load(str(tiny_folder("bert")))
    constants = Constants.from_kind("uniform", 2, 4, L)
    papa = papa_surgery.convert(model, constants, "first-to-last", fraction=0.5, tokenizer=tok)
    out = papa_surgery.save(papa, tmp_path / "ckpt", tokenizer=tok)
    saved = json.loads((out / "tokenizer_config.json").read_text())
    assert saved["model_max_length"] == L
    assert not set(saved) & {*LOADING_FLAGS, "local_files_only", "is_local"}, sorted(saved)


PAIR_SCRIPT = textwrap.dedent(
    """
    import json, sys
    sys.modules["papa_surgery"] = None
    import torch, transformers
    from transformers import AutoModel, AutoTokenizer
    source, checkpoint = sys.argv[1], sys.argv[2]
    first, second = ["the cat sat on the mat", "a dog"], ["it was happy", "ran off to the text"]
    src_tok = AutoTokenizer.from_pretrained(source)
    tok = AutoTokenizer.from_pretrained(checkpoint, trust_remote_code=True)
    src_enc = src_tok(first, second, padding=True, return_tensors="pt")
    enc = tok(first, second, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = AutoModel.from_pretrained(source).eval()(**src_enc).last_hidden_state
        got = AutoModel.from_pretrained(checkpoint, trust_remote_code=True).eval()(**enc).last_hidden_state
    real = src_enc["attention_mask"].bool()
    print(json.dumps({
        "version": transformers.__version__, "source_class": type(src_tok).__name__, "class": type(tok).__name__,
        "same_encoding": {k: torch.equal(v, enc[k]) for k, v in src_enc.items()} if set(enc) == set(src_enc) else
        sorted(enc), "diff": (got - expected)[real].abs().max().item(),
    }))
    """
)


@pytest.mark.parametrize("which", ["installed", "floor"])
def test_the_checkpoint_tokenizer_is_the_sources_class_on_every_supported_transformers(tmp_path, which):
    """transformers 5.0's AutoTokenizer gave a generic tokenizer without token_type_ids for every PAPA checkpoint, so
    a fraction-0 checkpoint's pair outputs differed from its source's; now class, encodings and outputs agree."""
    from fake_hub import TINY_WORDS
    from transformers import BertConfig, BertModel, BertTokenizer

    import papa_surgery

    python = sys.executable if which == "installed" else floor_python()
    if python is None:
        pytest.skip("no floor interpreter: scripts/test.sh makes .venv-floor (or set PAPA_FLOOR_PYTHON)")
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *TINY_WORDS, "cat", "sat", "mat",
                                "dog", "happy", "ran", "off"]) + "\n")  # fmt: skip
    source = tmp_path / "tiny-bert"
    torch.manual_seed(0)
    config = BertConfig(vocab_size=40, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    BertModel(config).save_pretrained(source)
    BertTokenizer(vocab_file=str(vocab)).save_pretrained(source)
    model, tok = papa_surgery.load(str(source))
    constants = Constants.from_kind("uniform", 2, 4, L)
    papa = papa_surgery.convert(model, constants, "first-to-last", fraction=0.0, tokenizer=tok)
    out = papa_surgery.save(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    result = fresh_python(PAIR_SCRIPT, str(source), str(out), cwd=tmp_path, python=python)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    assert (which == "floor") == facts["version"].startswith("5.0.")
    assert facts["class"] == facts["source_class"] == "BertTokenizer", facts
    assert facts["same_encoding"] == {"input_ids": True, "token_type_ids": True, "attention_mask": True}, facts
    assert facts["diff"] <= 1e-5, facts
