"""The converted model in the clients its source works in (issue 9).

Every test runs the real client, not a stand-in: ``torch.export`` and ONNX dynamo export (matched against
eager on a second shape), ``torch.compile``, gradient checkpointing with two forwards before one backward,
pickling, concurrent threads, sentence-transformers, peft's LoRA, a ``transformers`` pipeline, and
``save_pretrained`` of a converted or fine-tuned model.
"""

from __future__ import annotations

import json
import threading

import pytest
import torch
from conftest import FAMILY_TYPES, MODERN_TYPES, PAIRS, SENTENCES, Encoder, cli, make_constants, onnx_session
from test_checkpoint import fresh_python

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code import HUB_CODE_FILES
from papa_surgery.hub_code.families import family_for

L = 64
LAYERS, HEADS = 2, 4
HALF = [[0, 1], [0, 3], [1, 0], [1, 2]]  # fraction 0.5, both layers keep two heads
ALL = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
INTERFACE = [t for t in FAMILY_TYPES if family_for(t).style == "interface"]
TOL = 1e-5


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


def papa_of(tiny, model_type, heads=HALF, head="AutoModel", attn=None, **overrides):
    attn = attn or ("sdpa" if model_type in INTERFACE else "eager")
    src = tiny.model(model_type, head=head, attn=attn, **overrides)
    tok = tiny.tokenizer(model_type)
    constants = Constants(make_constants("random", LAYERS, HEADS, L), "test", L)
    return src, tok, convert(src, constants, heads, tokenizer=tok, fraction=len(heads) / (LAYERS * HEADS))


def batch(tok, examples, pairs=False):
    if pairs:
        return tok([a for a, _ in examples], [b for _, b in examples], padding=True, return_tensors="pt")
    return tok(list(examples), padding=True, return_tensors="pt")


# --- export and compile -----------------------------------------------------------------------------------


def exported_and_eager(papa, tok) -> tuple[torch.Tensor, torch.Tensor]:
    """``papa``'s encoder exported with dynamic batch and length on one batch, then run on a batch of another
    shape (pairs): (exported output, eager output)."""
    model = Encoder(papa).eval()
    first, second = batch(tok, SENTENCES[:2]), batch(tok, PAIRS, pairs=True)
    assert first["input_ids"].shape != second["input_ids"].shape
    b, n = torch.export.Dim("batch"), torch.export.Dim("length", max=int(papa.config.papa_max_length))
    shapes = ({0: b, 1: n}, {0: b, 1: n})
    program = torch.export.export(model, (first["input_ids"], first["attention_mask"]), dynamic_shapes=shapes)
    got = program.module()(second["input_ids"], second["attention_mask"])
    with torch.no_grad():
        expected = model(second["input_ids"], second["attention_mask"])
    return got, expected


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_torch_export_with_dynamic_shapes_matches_eager(tiny, model_type):
    _, tok, papa = papa_of(tiny, model_type)
    got, expected = exported_and_eager(papa, tok)
    assert float((got - expected).abs().max()) <= TOL


@pytest.mark.slow  # slow tier: ONNX export
@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_onnx_dynamo_export_matches_eager(tiny, model_type, tmp_path):
    # ModernBERT's sdpa graph (sliding-window mask) exports unfaithfully to ONNX, its source model too (max
    # difference ~0.8 with no constant head, transformers 5.23, torch's dynamo exporter); eager exports exactly.
    _, tok, papa = papa_of(tiny, model_type, attn="eager" if model_type == "modernbert" else None)
    model = Encoder(papa).eval()
    first, second = batch(tok, SENTENCES[:2]), batch(tok, PAIRS, pairs=True)
    session = onnx_session(model, first, tmp_path / "model.onnx", L)
    feed = {"input_ids": second["input_ids"].numpy(), "attention_mask": second["attention_mask"].numpy()}
    got = torch.from_numpy(session.run(None, feed)[0])
    with torch.no_grad():
        expected = model(second["input_ids"], second["attention_mask"])
    assert float((got - expected).abs().max()) <= 1e-4  # onnxruntime's kernels round differently


@pytest.mark.slow  # slow tier: torch.compile
@pytest.mark.parametrize("model_type", ["bert", "roberta", "distilbert", "modernbert", "eurobert"])
def test_torch_compile_fullgraph(tiny, model_type):
    _, tok, papa = papa_of(tiny, model_type)
    model = Encoder(papa).eval()
    compiled = torch.compile(model, fullgraph=True, dynamic=True)
    for enc in (batch(tok, SENTENCES[:2]), batch(tok, PAIRS, pairs=True)):
        with torch.no_grad():
            got = compiled(enc["input_ids"], enc["attention_mask"])
            expected = model(enc["input_ids"], enc["attention_mask"])
        assert float((got - expected).abs().max()) <= TOL


def test_export_keeps_the_length_check(tiny):
    """A traced model cannot raise ValueError on data: an input longer than L fails at run time instead."""
    _, tok, papa = papa_of(tiny, "bert")
    model = Encoder(papa).eval()
    enc = batch(tok, SENTENCES[:2])
    n = torch.export.Dim("length", max=L + 20)  # past L, within the tiny models' 96 positions
    program = torch.export.export(model, (enc["input_ids"], enc["attention_mask"]), dynamic_shapes=({1: n}, {1: n}))
    long = torch.full((2, L + 5), tok.convert_tokens_to_ids("the"))
    with pytest.raises(Exception, match="slots"):
        program.module()(long, torch.ones_like(long))
    with pytest.raises(ValueError, match=f"papa_max_length={L}"):
        model(long, torch.ones_like(long))


# --- training clients -------------------------------------------------------------------------------------


def _two_forward_loss(model, tok):
    """The contrastive-loop pattern: two forwards of different shapes, then one backward."""
    a = batch(tok, SENTENCES[:2])
    b = batch(tok, PAIRS, pairs=True)
    loss = model(**a).last_hidden_state.pow(2).mean() + model(**b).last_hidden_state.sin().mean()
    loss.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("reentrant", [True, False], ids=["reentrant", "non-reentrant"])
@pytest.mark.parametrize("model_type", ["bert", "distilbert", "deberta", "deberta-v2"])
def test_gradient_checkpointing_two_forwards_then_backward(tiny, model_type, reentrant):
    if model_type == "deberta-v2" and reentrant:
        pytest.skip(
            "transformers' own DeBERTa-v2 fails re-entrant checkpointing with two forwards (its shared "
            "rel_embeddings graph is freed by the first recomputation); non-reentrant is tested"
        )
    _, tok, papa = papa_of(tiny, model_type)
    for module in papa.modules():  # dropout off: both runs must see the same computation
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
    papa.train()
    expected = _two_forward_loss(papa, tok)
    papa.zero_grad(set_to_none=True)
    papa.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": reentrant})
    if reentrant:  # re-entrant checkpointing needs an input that requires grad to record the layers
        papa.enable_input_require_grads()
    got = _two_forward_loss(papa, tok)
    assert set(got) == set(expected)
    for name in expected:
        assert torch.allclose(got[name], expected[name], atol=TOL), name


@pytest.mark.parametrize("model_type", ["bert", "mpnet", "deberta"])
def test_pickle_round_trip(tiny, model_type, tmp_path):
    _, tok, papa = papa_of(tiny, model_type)
    path = tmp_path / "model.pt"
    torch.save(papa, path)
    loaded = torch.load(path, weights_only=False)
    enc = batch(tok, PAIRS, pairs=True)
    with torch.no_grad():
        assert torch.equal(loaded(**enc).last_hidden_state, papa(**enc).last_hidden_state)


def test_each_module_runs_its_own_copy_of_the_attention_code(tiny):
    """transformers' table of attention functions is global: whichever copy of hub_code registered ``papa_sdpa``
    last, a model's modules run the code they were built with (two checkpoints of different versions in one
    process each keep theirs)."""
    from papa_surgery.hub_code import papa_attention

    _, tok, papa = papa_of(tiny, "bert")
    enc = batch(tok, SENTENCES)
    with torch.no_grad():
        expected = papa(**enc).last_hidden_state
    calls = []

    def own_copy(module, *args, **kwargs):
        calls.append(module)
        return papa_attention.papa_attention_forward(module, *args, **kwargs)

    modules = [m for m in papa.modules() if hasattr(m, "papa_attention_impl")]
    try:
        for m in modules:
            m.papa_attention_impl = own_copy
        with torch.no_grad():
            got = papa(**enc).last_hidden_state
    finally:
        for m in modules:
            m.papa_attention_impl = papa_attention.papa_attention_forward
    assert calls == modules and torch.equal(got, expected)


@pytest.mark.parametrize("model_type", ["bert", "mpnet"])
def test_threads_get_their_own_results(tiny, model_type):
    _, tok, papa = papa_of(tiny, model_type)
    inputs = [batch(tok, SENTENCES[:1]), batch(tok, PAIRS, pairs=True), batch(tok, SENTENCES)]
    with torch.no_grad():
        expected = [papa(**enc).last_hidden_state for enc in inputs]
    results: dict = {}
    start = threading.Barrier(len(inputs))

    def work(i):
        start.wait()
        with torch.no_grad():
            for _ in range(20):
                out = papa(**inputs[i]).last_hidden_state
                if not torch.equal(out, expected[i]):
                    results[i] = "differs"
                    return
        results[i] = "ok"

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(inputs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: "ok" for i in range(len(inputs))}


def test_lora_on_the_linear_layers_the_config_names(tiny):
    peft = pytest.importorskip("peft")
    src, tok, papa = papa_of(tiny, "bert", heads=HALF, head="AutoModelForSequenceClassification")
    names = papa.config.papa_linear_names
    assert names == {"query": [0, 1], "key": [0, 1], "value": [0, 1]}
    lora = peft.get_peft_model(
        papa, peft.LoraConfig(target_modules=["query", "value"], r=4, task_type="SEQ_CLS", init_lora_weights=False)
    )
    adapted = {n for n, _ in lora.named_modules() if n.endswith((".query", ".value")) and hasattr(_, "lora_A")}
    assert len(adapted) == 2 * LAYERS
    enc = batch(tok, SENTENCES)
    out = lora(**enc, labels=torch.tensor([0, 1, 2, 0]))
    out.loss.backward()
    assert all(p.grad is not None for n, p in lora.named_parameters() if "lora_" in n)


def test_lora_on_modernbert_fused_projection(tiny):
    """ModernBERT: ``Wqkv`` where no head is constant, ``Wqkv.proj`` (kept Q/K and every V row) where one is."""
    peft = pytest.importorskip("peft")
    _, tok, papa = papa_of(tiny, "modernbert", heads=[[1, 0], [1, 2]], head="AutoModelForSequenceClassification")
    names = papa.config.papa_linear_names
    assert names == {"Wqkv": [0], "Wqkv.proj": [1], "Wo": [0, 1]}
    # A plain "Wqkv" would also match the fused module of layer 1 itself (peft cannot adapt it): name the layers.
    whole = "|".join(map(str, names["Wqkv"]))
    target = rf".*\.layers\.({whole})\.attn\.Wqkv|.*\.Wqkv\.proj"
    lora = peft.get_peft_model(
        papa, peft.LoraConfig(target_modules=target, r=4, task_type="SEQ_CLS", init_lora_weights=False)
    )
    adapted = {n for n, m in lora.named_modules() if hasattr(m, "lora_A") and n.endswith(("Wqkv", "proj"))}
    assert len(adapted) == LAYERS
    out = lora(**batch(tok, SENTENCES), labels=torch.tensor([0, 1, 2, 0]))
    out.loss.backward()
    assert all(p.grad is not None for n, p in lora.named_parameters() if "lora_" in n)


def test_lora_at_fraction_one_finds_no_query(tiny):
    """At fraction 1 no layer has query/key: the config says so, and LoRA on them adapts only value."""
    peft = pytest.importorskip("peft")
    _, tok, papa = papa_of(tiny, "bert", heads=ALL)
    assert papa.config.papa_linear_names["query"] == [] and papa.config.papa_linear_names["value"] == [0, 1]
    lora = peft.get_peft_model(papa, peft.LoraConfig(target_modules=["query", "value"], r=4))
    adapted = [n for n, m in lora.named_modules() if hasattr(m, "lora_A") and not n.endswith("lora_A")]
    assert adapted and all(n.endswith(".value") for n in adapted)


def test_pipeline_truncates_to_the_slots(tiny, tmp_path):
    from transformers import pipeline

    _, tok, papa = papa_of(tiny, "bert", head="AutoModelForSequenceClassification")
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    assert json.loads((out / "tokenizer_config.json").read_text())["model_max_length"] == L
    classify = pipeline("text-classification", model=str(out), trust_remote_code=True, device="cpu")
    long_text = " ".join(["the movie is good"] * 40)  # ~160 tokens, more than L
    assert len(classify(long_text, truncation=True)) == 1


def test_every_sibling_file_is_a_direct_import_of_the_entry_file():
    """transformers before 5.23 copies only modeling_papa.py's own relative imports into its module cache."""
    from pathlib import Path

    from transformers.dynamic_module_utils import get_relative_imports

    import papa_surgery.hub_code as hub_code

    entry = Path(hub_code.__file__).parent / "modeling_papa.py"
    assert {f"{name}.py" for name in get_relative_imports(entry)} == set(HUB_CODE_FILES) - {"modeling_papa.py"}


def test_save_pretrained_of_a_converted_or_fine_tuned_model_carries_its_code(tiny, tmp_path):
    """register_for_auto_class: a plain save_pretrained writes the code files and the auto_map."""
    from transformers import AutoModel

    _, tok, papa = papa_of(tiny, "roberta")
    papa.save_pretrained(tmp_path / "plain")
    names = {p.name for p in (tmp_path / "plain").iterdir()}
    assert set(HUB_CODE_FILES) <= names
    config = json.loads((tmp_path / "plain" / "config.json").read_text())
    assert config["auto_map"]["AutoModel"] == "modeling_papa.PapaRobertaModel"
    loaded = AutoModel.from_pretrained(tmp_path / "plain", trust_remote_code=True)
    loaded.save_pretrained(tmp_path / "again")  # a model loaded from remote code saves its code too
    again = AutoModel.from_pretrained(tmp_path / "again", trust_remote_code=True)
    enc = batch(tok, PAIRS, pairs=True)
    with torch.no_grad():
        assert float((again(**enc).last_hidden_state - papa(**enc).last_hidden_state).abs().max()) <= 1e-6


# --- sentence-transformers --------------------------------------------------------------------------------


def _sentence_transformers_folder(tiny, model_type, out):
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    source = tiny.save(model_type, out / "hf")
    encoder = models.Transformer(str(source), max_seq_length=48)
    pooling = models.Pooling(encoder.get_word_embedding_dimension(), pooling_mode="mean")
    model = st.SentenceTransformer(modules=[encoder, pooling, models.Normalize()], device="cpu")
    model.save(str(out / "st"))
    return out / "st"


def _pooled_by_hand(model, tok, texts, max_length: int) -> torch.Tensor:
    """What a mean-pooling, normalising sentence-transformers pipeline must give for ``model``: the mask-weighted
    mean of its last hidden states over each text's real tokens, scaled to unit length, computed here by hand."""
    enc = tok(texts, padding=True, truncation=True, max_length=max_length, return_tensors="pt")
    with torch.no_grad():
        hidden = model(**enc).last_hidden_state  # (B, N, D)
    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)  # (B, N, 1)
    mean = (hidden * mask).sum(1) / mask.sum(1)
    return torch.nn.functional.normalize(mean, dim=-1)


@pytest.mark.parametrize("model_type", ["bert", "mpnet", *MODERN_TYPES])
def test_sentence_transformers_round_trip_tiny(tiny, model_type, tmp_path):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    folder = _sentence_transformers_folder(tiny, model_type, tmp_path)
    source = SentenceTransformer(str(folder), device="cpu")
    src = AutoModel.from_pretrained(folder).eval()
    tok = AutoTokenizer.from_pretrained(folder)
    expected = source.encode(SENTENCES, convert_to_tensor=True)
    for heads in ([], HALF, ALL):
        constants = Constants(make_constants("random", LAYERS, HEADS, L), "test", L)
        papa = convert(src, constants, heads, tokenizer=tok)
        out = save_checkpoint(papa, tmp_path / f"papa-{len(heads)}", tokenizer=tok, card=False)
        assert {"modules.json", "1_Pooling", "sentence_bert_config.json"} <= {p.name for p in out.iterdir()}
        model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
        assert model.max_seq_length == min(48, L)
        got = model.encode(SENTENCES, convert_to_tensor=True)
        # The pipeline is the converted model's own mean pooling and normalisation, exactly.
        assert float((got - _pooled_by_hand(papa, tok, SENTENCES, model.max_seq_length)).abs().max()) <= TOL
        if not heads:
            assert float((got - expected).abs().max()) <= TOL
        else:
            assert float((got - expected).abs().max()) > 1e-3  # constant heads change the embedding


# A module of the source's own code (modules.json names ``scaled_pool.Pooling``), in a file that imports
# a second one relatively: sentence-transformers loads both from beside modules.json with trust_remote_code=True.
_SCALED_POOL = """import torch
from .pool_scale import SCALE


class Pooling(torch.nn.Module):  # the name of sentence-transformers' own, not its code
    def forward(self, features):
        mask = features["attention_mask"].unsqueeze(-1).to(features["token_embeddings"].dtype)
        mean = (features["token_embeddings"] * mask).sum(1) / mask.sum(1)
        features["sentence_embedding"] = SCALE * mean
        return features

    @staticmethod
    def load(path):
        return Pooling()
"""


def test_a_sentence_transformers_module_of_own_code_is_carried_through_convert_and_heal(tiny, tmp_path):
    folder = _sentence_transformers_folder(tiny, "bert", tmp_path)
    modules = json.loads((folder / "modules.json").read_text())
    modules = [modules[0], {**modules[1], "type": "scaled_pool.Pooling"}]  # no Normalize: the scale shows
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "scaled_pool.py").write_text(_SCALED_POOL)
    (folder / "pool_scale.py").write_text("SCALE = 3.0\n")
    (tmp_path / "corpus.txt").write_text("\n".join(SENTENCES * 4) + "\n")
    common = ["--corpus", tmp_path / "corpus.txt", "--max-length", L, "--batch-size", 8]
    for fraction, out in (("0", "papa-0"), ("1", "papa-1")):
        result = cli("convert", folder, "--fraction", fraction, *common, "--out", tmp_path / out)
        assert result.exit_code == 0, result.output
    result = cli("heal", tmp_path / "papa-1", "--teacher", folder, "--corpus", tmp_path / "corpus.txt",
                 "--steps", 2, "--heldout", 4, "--batch-size", 4, "--out", tmp_path / "healed")  # fmt: skip
    assert result.exit_code == 0, result.output
    for out in ("papa-0", "papa-1", "healed"):
        assert {"scaled_pool.py", "pool_scale.py"} <= {p.name for p in (tmp_path / out).iterdir()}, out
        recipe = json.loads((tmp_path / out / "papa_recipe.json").read_text())
        assert {"scaled_pool.py", "pool_scale.py"} <= set(recipe["sentence_transformers"]["files"]), out
    # healing's sentence term reproduces only sentence-transformers' own modules, never runs the source's code
    assert json.loads((tmp_path / "healed" / "papa_recipe.json").read_text())["healing"]["objective"] == "layers"
    # --overwrite counts the carried code as the checkpoint's own (not files the user put there)
    result = cli("convert", folder, "--fraction", "0", *common, "--out", tmp_path / "papa-0", "--overwrite")
    assert result.exit_code == 0, result.output
    # in a fresh process, as a user loads them: the source's pipeline, its own module included
    script = (
        "import json, sys\n"
        "from sentence_transformers import SentenceTransformer\n"
        "texts = json.loads(sys.argv[1])\n"
        "out = {}\n"
        "for name in sys.argv[2:]:\n"
        "    model = SentenceTransformer(name, device='cpu', trust_remote_code=True)\n"
        "    out[name] = model.encode(texts, convert_to_tensor=True).tolist()\n"
        "print(json.dumps(out))\n"
    )
    names = [str(folder), *(str(tmp_path / out) for out in ("papa-0", "papa-1", "healed"))]
    done = fresh_python(script, json.dumps(SENTENCES), *names, cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    source, papa0, papa1, healed = (torch.tensor(got[name]) for name in names)
    assert float((papa0 - source).abs().max()) <= TOL  # fraction 0: the source's embedding, scale and all
    norms = torch.tensor([float(torch.linalg.vector_norm(t)) for t in papa1])
    assert float((papa1 - source).abs().max()) > 1e-3 and healed.shape == source.shape and bool((norms > 0).all())


def test_an_encoder_module_kept_in_its_own_folder_becomes_the_checkpoint_and_outside_paths_are_refused(tiny, tmp_path):
    """Older sentence-transformers models keep the encoder in ``0_Transformer/``: that folder was copied into the
    checkpoint, so ``SentenceTransformer(checkpoint)`` ran the source's own weights. A module folder outside the model
    (``../notes``) was copied outside the output folder."""
    import shutil

    from sentence_transformers import SentenceTransformer

    folder = _sentence_transformers_folder(tiny, "bert", tmp_path)
    legacy = folder / "0_Transformer"
    legacy.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy2(folder / name, legacy / name)
    (folder / "sentence_bert_config.json").rename(legacy / "sentence_bert_config.json")
    modules = json.loads((folder / "modules.json").read_text())
    (folder / "modules.json").write_text(json.dumps([{**modules[0], "path": "0_Transformer"}, *modules[1:]]))
    (tmp_path / "corpus.txt").write_text("\n".join(SENTENCES * 4) + "\n")
    common = ["--corpus", tmp_path / "corpus.txt", "--batch-size", 8, "--fraction", 1]
    result = cli("convert", folder, *common, "--out", tmp_path / "papa")  # L: the encoder's max_seq_length, 48
    assert result.exit_code == 0, result.output
    out = tmp_path / "papa"
    assert json.loads((out / "modules.json").read_text())[0]["path"] == "" and not (out / "0_Transformer").exists()
    model = SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    assert type(model[0].auto_model).__name__.startswith("Papa") and model.max_seq_length == 48
    # a module folder outside the model's: refused before anything is written, the sibling folder untouched
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("finish the paper")
    outside = {"idx": 3, "name": "3", "path": "../notes", "type": "sentence_transformers.models.Normalize"}
    (folder / "modules.json").write_text(json.dumps([*modules, outside]))
    result = cli("convert", folder, *common, "--out", tmp_path / "sub" / "papa")
    said = " ".join(result.output.split())
    assert result.exit_code != 0 and "modules.json names the module folder '../notes', outside" in said, said
    assert [p.name for p in notes.iterdir()] == ["todo.txt"] and not (tmp_path / "sub").exists()


@pytest.mark.real
def test_sentence_transformers_round_trip_minilm(minilm_path, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from transformers import AutoModel, AutoTokenizer

    source = st.SentenceTransformer(str(minilm_path), device="cpu")
    src = AutoModel.from_pretrained(minilm_path).eval()
    tok = AutoTokenizer.from_pretrained(minilm_path)
    texts = [*SENTENCES, "Constant attention heads are cheap to run."]
    expected = source.encode(texts, convert_to_tensor=True)
    layers, heads = 6, 12
    every = [[layer, h] for layer in range(layers) for h in range(heads)]
    constants = Constants.from_kind("toeplitz", layers, heads, 128)
    for fraction in (0.0, 0.5, 1.0):
        chosen = every[: int(len(every) * fraction)]
        papa = convert(src, constants, chosen, tokenizer=tok, fraction=fraction)
        out = save_checkpoint(papa, tmp_path / f"minilm-{fraction}", tokenizer=tok, card=False)
        model = st.SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
        assert model.max_seq_length == 128
        got = model.encode(texts, convert_to_tensor=True)
        assert float((got - _pooled_by_hand(papa, tok, texts, model.max_seq_length)).abs().max()) <= TOL
        if fraction == 0.0:
            assert float((got - expected).abs().max()) <= TOL


def test_a_pair_as_inputs_embeds_with_explicit_slots_equals_input_ids(tiny):
    _, tok, papa = papa_of(tiny, "bert")
    enc = batch(tok, PAIRS, pairs=True)
    with torch.no_grad():
        by_ids = papa(**enc).last_hidden_state
        embeds = papa.get_input_embeddings()(enc["input_ids"])
        slots = papa.papa_slots(enc["input_ids"], enc["attention_mask"])
        by_embeds = papa(
            inputs_embeds=embeds,
            attention_mask=enc["attention_mask"],
            token_type_ids=enc["token_type_ids"],
            papa_slots=slots,
        ).last_hidden_state
    assert float((by_embeds - by_ids).abs().max()) <= TOL
