"""What the modern encoders add: sliding windows, grouped-query attention, rotary slots, their refusals.

The invariants every family shares (fraction 0 = source, slot path, lambda, checkpoints, clients,
calibration) run on these families through the shared lists in ``conftest.FAMILY_TYPES``; this module
checks what only they have:

- a local (sliding-window) head's constant puts no mass outside its layer's window, at any input length;
- EuroBERT drops a key head only when every query head of its group is constant, and the result equals
  the unpruned model;
- with rotary positions the slot path equals the paper's padded-to-L layout (positions passed explicitly,
  as RoBERTa's positions skip padding);
- packed sequences, Jina's ``task=`` and a too-old transformers are refused by name.
"""

from __future__ import annotations

import pytest
import torch
from conftest import MODERN_TYPES, MODERNBERT_WINDOW, PAIRS, SENTENCES, make_constants, make_papa

import papa_surgery
from papa_surgery.calibration.constants import Constants
from papa_surgery.hub_code.families import FAMILIES
from papa_surgery.hub_code.modeling_papa import attention_modules

pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread

L = 32
LAYERS, HEADS = 2, 4
TOL = 1e-5


@torch.no_grad()
def run(model, enc, **kwargs):
    return model(**enc, **kwargs)


@pytest.mark.parametrize("kind", ["uniform", "random"])
def test_local_constant_has_no_mass_outside_the_window_at_any_length(tiny, kind):
    """ModernBERT's layer 1 is local (|i - j| <= w): its constant heads stay inside, for every length up to L."""
    src, tok = tiny.model("modernbert"), tiny.tokenizer("modernbert")
    assert src.config.layer_types == ["full_attention", "sliding_attention"]
    model = make_papa(src, [[0, 1], [1, 0], [1, 1], [1, 2], [1, 3]], make_constants(kind, LAYERS, HEADS, L), L, 3)
    assert getattr(attention_modules(model)[1], "papa_window", None) == MODERNBERT_WINDOW
    assert getattr(attention_modules(model)[0], "papa_window", None) is None
    i = torch.arange(L)
    outside = (i[:, None] - i[None, :]).abs() > MODERNBERT_WINDOW
    for n in range(2, L + 1):
        ids = torch.randint(5, len(tok), (2, n))
        ids[:, 0], ids[:, -1] = tok.cls_token_id, tok.sep_token_id
        mask = torch.ones_like(ids)
        mask[1, : n // 3] = 0  # left padding in the second example
        attentions = run(model, {"input_ids": ids, "attention_mask": mask}, output_attentions=True).attentions
        local = attentions[1]  # (B, H, N, N)
        if n > MODERNBERT_WINDOW + 1:
            assert float(local[..., outside[:n, :n]].abs().max()) == 0.0, n
        rows = local.sum(-1)[mask[:, None, :].expand(-1, HEADS, -1).bool()]
        assert torch.allclose(rows, torch.ones_like(rows), atol=1e-5)  # every real row still sums to 1
        if n > MODERNBERT_WINDOW + 1:  # the global layer's constant head does reach beyond the window
            assert float(attentions[0][0, 1][outside[:n, :n]].abs().max()) > 0


def test_a_calibrated_local_constant_can_reach_outside_the_window_in_slot_space(tiny):
    """Why the window is applied at use: slots are not distances (the final separator sits at L-1)."""
    from papa_surgery.calibration.average import calibrate

    src, tok = tiny.model("modernbert"), tiny.tokenizer("modernbert")
    constants = calibrate(src, tok, SENTENCES, max_length=L, progress=False)
    local = constants.values[1]  # (H, L, L) of the local layer
    # "a fun ride ." has 6 tokens: its final separator (slot L-1) attends to slot 2, 3 tokens away but
    # L-3 slots away. Read as slot distances, the calibrated constant reaches far outside the window.
    assert float(local[:, L - 1, 2].min()) > 0


@pytest.mark.parametrize("constant", [[0, 1], [0, 2], [0, 1, 2, 3]], ids=["whole group", "split groups", "all"])
def test_grouped_query_attention_drops_a_key_head_only_with_its_whole_group(tiny, constant):
    src, tok = tiny.model("eurobert"), tiny.tokenizer("eurobert")
    assert src.config.num_key_value_heads == 2  # groups {0, 1} and {2, 3}
    heads = [[0, h] for h in constant]
    c = make_constants("random", LAYERS, HEADS, L)
    model = make_papa(src, heads, c, L, tok.sep_token_id)
    m = attention_modules(model)[0]
    d = src.config.hidden_size // HEADS
    kept = [h for h in range(HEADS) if h not in constant]
    key_groups = {h // 2 for h in kept}
    if kept:
        assert m.q_proj.weight.shape[0] == len(kept) * d
        assert m.k_proj.weight.shape[0] == len(key_groups) * d
    else:
        assert not isinstance(m.q_proj, torch.nn.Linear) and not isinstance(m.k_proj, torch.nn.Linear)
    assert m.v_proj.weight.shape[0] == 2 * d  # constant heads read their group's value head: every one stays

    everything = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    unpruned = make_papa(src, everything, c, L, tok.sep_token_id, kept_heads=everything)
    with torch.no_grad():
        for layer, mod in enumerate(attention_modules(unpruned)):
            mod.papa_lambda_logits.copy_(torch.tensor([-50.0 if [layer, h] in heads else 50.0 for h in range(HEADS)]))
    for side in ("right", "left"):
        tok.padding_side = side
        enc = tok(SENTENCES, padding=True, return_tensors="pt")
        a, b = run(model, enc).last_hidden_state, run(unpruned, enc).last_hidden_state
        assert float((a - b)[enc["attention_mask"].bool()].abs().max()) <= TOL


def _paper_layout(tok, example, pairs: bool):
    """One example padded to L with its tokens at their slots (the paper's App. A), and its natural positions."""
    enc = tok(*example) if pairs else tok(example)
    ids = enc["input_ids"]
    half = L // 2
    if pairs:
        mid = ids.index(tok.sep_token_id)
        slots = list(range(mid)) + [half + i for i in range(len(ids) - 1 - mid)] + [L - 1]
    else:
        slots = list(range(len(ids) - 1)) + [L - 1]
    padded = torch.full((1, L), tok.pad_token_id)
    mask = torch.zeros(1, L, dtype=torch.long)
    positions = torch.zeros(1, L, dtype=torch.long)
    padded[0, slots], mask[0, slots] = torch.tensor(ids), 1
    positions[0, slots] = torch.arange(len(ids))  # the natural positions, as if unpadded
    return {"input_ids": padded, "attention_mask": mask, "position_ids": positions}, slots


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("model_type", MODERN_TYPES)
def test_slot_path_equals_padded_reference_with_rotary_positions(tiny, model_type, pairs):
    # ModernBERT's local windows count padded indices, which the paper's layout spreads apart: the reference
    # holds for its global layers, so every layer is global here (the window test above covers local ones).
    overrides = {"global_attn_every_n_layers": 1} if model_type == "modernbert" else {}
    src, tok = tiny.model(model_type, **overrides), tiny.tokenizer(model_type, "left")
    heads = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]
    model = make_papa(src, heads, make_constants("random", LAYERS, HEADS, L, seed=2), L, tok.sep_token_id)
    examples = PAIRS if pairs else SENTENCES
    texts = ([a for a, _ in examples], [b for _, b in examples]) if pairs else (examples,)
    enc = tok(*texts, padding=True, return_tensors="pt")
    enc = {k: v for k, v in enc.items() if k in ("input_ids", "attention_mask")}
    got = run(model, enc).last_hidden_state
    for b, example in enumerate(examples):
        padded, slots = _paper_layout(tok, example, pairs)
        grid = torch.where(padded["attention_mask"].bool(), torch.arange(L), torch.tensor(-1))
        ref = run(model, padded, papa_slots=grid).last_hidden_state[0, slots]
        mine = got[b][enc["attention_mask"][b].bool()]
        assert float((mine - ref).abs().max()) <= TOL, (model_type, b)


def test_packed_sequences_are_refused_by_name(tiny):
    src, tok = tiny.model("modernbert"), tiny.tokenizer("modernbert")
    model = make_papa(src, [[0, 1]], make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    enc = tok(SENTENCES[:1], return_tensors="pt")
    n = enc["input_ids"].shape[1]
    with pytest.raises(ValueError, match="packed sequences"):
        run(model, enc, cu_seq_lens_q=torch.tensor([0, n]), cu_seq_lens_k=torch.tensor([0, n]))


@pytest.mark.parametrize("keyword", ["task", "adapter_mask"])
def test_jina_task_adapters_are_refused(tiny, keyword):
    src, tok = tiny.model("jina_embeddings_v3"), tiny.tokenizer("jina_embeddings_v3")
    model = make_papa(src, [[0, 1]], make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    enc = tok(SENTENCES[:1], return_tensors="pt")
    value = "retrieval.query" if keyword == "task" else torch.zeros(1, dtype=torch.long)
    with pytest.raises(ValueError, match="task adapter"):
        run(model, enc, **{keyword: value})


@pytest.mark.parametrize("model_type", MODERN_TYPES)
def test_an_older_transformers_is_refused_with_the_release_needed(model_type):
    family = FAMILIES[model_type]
    need = ".".join(map(str, family.min_transformers))
    with pytest.raises(ImportError, match=rf"{model_type} models need transformers>={need}"):
        family.check_transformers("5.0.0")
    family.check_transformers(f"{family.min_transformers[0]}.{family.min_transformers[1]}.0")


@pytest.mark.parametrize("model_type", ["modernbert", "eurobert", "jina_embeddings_v3"])
def test_inspect_and_card_name_the_family_specifics(tiny, tmp_path, model_type):
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.card import write_card
    from papa_surgery.conversion.checkpoint import save_checkpoint
    from papa_surgery.conversion.description import format_description
    from papa_surgery.conversion.inspection import describe
    from papa_surgery.conversion.surgery import convert

    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    papa = convert(src, Constants(make_constants("random", LAYERS, HEADS, L), "test", L), [[0, 1]], tokenizer=tok)
    out = save_checkpoint(papa, tmp_path / "ckpt", tokenizer=tok, card=False)
    family = FAMILIES[model_type]
    specific = {"modernbert": "sliding window", "eurobert": "grouped-query", "jina_embeddings_v3": "task="}
    assert specific[model_type] in family.notes
    text = format_description(describe(out))
    assert family.notes in text and "needs transformers>=5.23" in text
    card = write_card(out).read_text()
    assert "family specifics" in card and specific[model_type] in card


def every_pair() -> list[tuple[int, int]]:
    return [(layer, h) for layer in range(LAYERS) for h in range(HEADS)]


@pytest.mark.parametrize("model_type", MODERN_TYPES)
def test_every_kind_method_and_path_runs(tiny, tmp_path, model_type):
    """calibrate (every kind) -> rank (every method, lambda included) -> convert -> probe -> analyze, per family."""
    from papa_surgery import api
    from papa_surgery.calibration.constants import KINDS
    from papa_surgery.registry import LABEL_FREE_METHODS

    src, tok = tiny.model(model_type, head="AutoModelForSequenceClassification"), tiny.tokenizer(model_type)
    sentences = SENTENCES * 2
    data = tmp_path / "data" / "glue" / "sst2"
    data.mkdir(parents=True)
    rows = "".join(f"{s}\t{i % 2}\n" for i, s in enumerate(sentences * 4))
    (data / "train.tsv").write_text("sentence\tlabel\n" + rows)
    (data / "dev.tsv").write_text("sentence\tlabel\n" + rows)
    kinds = [k for k in KINDS if k not in ("distilled", "sharpened")]  # fitted for the heads made constant: below
    by_kind = {kind: api.calibrate(src, tok, sentences, kind=kind, max_length=L, progress=False) for kind in kinds}
    every = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    by_kind["distilled"] = papa_surgery.distill(src, tok, sentences, by_kind["average"], every, steps=2, progress=False)
    by_kind["sharpened"] = papa_surgery.sharpen(src, tok, sentences, by_kind["average"], every, progress=False)
    assert all(c.values.shape == (LAYERS, HEADS, L, L) and c.kind == k for k, c in by_kind.items())
    assert torch.equal(by_kind["identity"].values[1, 2], torch.eye(L))  # data-free kinds are their matrices
    assert torch.equal(by_kind["zeros"].values, torch.zeros(LAYERS, HEADS, L, L))
    for kind in ("average", "norm-average", "effective-average"):  # averages over the corpus, with their counts
        assert by_kind[kind].metadata["examples"] == len(sentences) and by_kind[kind].variance is not None, kind
    assert by_kind["distilled"].metadata["distilled"]["steps"] == 2
    assert not torch.equal(by_kind["distilled"].values, by_kind["average"].values)  # training moved the matrices
    average = by_kind["average"]
    rankings = {}
    for method in (*LABEL_FREE_METHODS, "lambda"):
        options = dict(task="sst2", data_dir=tmp_path / "data", epochs=1, progress=False) if method == "lambda" else {}
        constants = by_kind["norm-average"] if method == "norm" else average
        rankings[method] = api.rank(method, src, tok, constants=constants, **options)
        assert sorted(map(tuple, rankings[method].order)) == every_pair(), method
    # Each order is what its method says, checked against the scores it reads.
    assert rankings["first-to-last"].order == [list(x) for x in every_pair()]
    assert rankings["last-to-first"].order[:HEADS] == [[LAYERS - 1, h] for h in range(HEADS)]
    by_variance = sorted(every_pair(), key=lambda x: (float(average.variance[x]), x))
    assert rankings["variance"].order == [list(x) for x in by_variance]
    contribution = by_kind["norm-average"].metadata["contribution"]
    assert rankings["norm"].order == [
        list(x) for x in sorted(every_pair(), key=lambda x: (contribution[x[0]][x[1]], x))
    ]
    lambdas = rankings["lambda"].scores
    assert all(0.0 < v < 1.0 for v in lambdas) and lambdas == sorted(lambdas)  # sigmoid values, smallest first
    assert (
        api.rank("random", src, tok, constants=average, seed=3).order
        == api.rank("random", constants=average, seed=3).order
    )
    converted = api.convert(src, average, ranking=rankings["lambda"], fraction=0.5, tokenizer=tok)
    assert converted.config.papa_constant_heads == rankings["lambda"].select(0.5)
    # The probe reads the encoder's hidden states: convert an encoder (AutoModel), with its own constants.
    encoder = tiny.model(model_type)
    own = api.calibrate(encoder, tok, sentences, max_length=L, progress=False)
    papa = api.convert(encoder, own, ranking="variance", fraction=0.5, tokenizer=tok)
    probed = [api.probe(papa, tok, "sst2", data_dir=tmp_path / "data", epochs=1, progress=False) for _ in range(2)]
    assert (
        probed[0]["metric"] == "accuracy" and probed[0]["examples"] == probed[0]["eval_examples"] == len(sentences) * 4
    )
    assert probed[0]["score"] == probed[1]["score"]  # the same seed scores the same
    for which in ("norms", "effective"):
        summary = api.analyze(src, tok, sentences, which, tmp_path / which, max_length=L, progress=False)
        saved = Constants.load(tmp_path / which / f"{'norm' if which == 'norms' else 'effective'}-average.safetensors")
        same = by_kind["norm-average" if which == "norms" else "effective-average"]
        assert torch.allclose(saved.values, same.values, rtol=1e-6, atol=1e-9), which  # the analysis's own averages
        assert all((tmp_path / which / name).is_file() for name in summary["files"]), which
