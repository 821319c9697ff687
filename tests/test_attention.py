"""PAPA attention on tiny models of every family: equivalence, constant heads, padding, slot layout.

Invariants (issue 2, tests 1, 3 and 4):

- no constant heads: the PAPA model is the source model (eager and sdpa, left and right padding);
- constant heads lose their query/key weights and output ``rownorm(C[slots] * mask) @ V``;
  ``identity`` gives each token its own value vector, ``zeros`` gives zero, and the weights returned
  with ``output_attentions`` are the constants actually used (rows sum to 1 over real tokens);
- padding an input more or less changes no real token's output;
- the slot path equals a reference that pads every input to L in the paper's layout (RoBERTa positions).
"""

from __future__ import annotations

import pytest
import torch
from conftest import FAMILY_TYPES, MODERN_TYPES, PAIRS, SENTENCES, make_constants, make_papa

from papa_surgery.hub_code.families import family_for
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.hub_code.slots import window_mask

TOL = 1e-5
L = 64  # slots of the constants used here (> every test input)
LAYERS, HEADS = 2, 4

# Family cases: the 8 families plus DeBERTa-v2 with separate positional projections.
CASES = {t: (t, {}) for t in FAMILY_TYPES}
CASES["deberta-v2-unshared"] = ("deberta-v2", {"share_att_key": False})
SDPA = {"bert", "roberta", "xlm-roberta", "electra", "distilbert", *MODERN_TYPES}
# Families whose source model gives the same real-token outputs under left padding (positions skip
# padding or are relative); absolute arange positions (BERT, ELECTRA, DistilBERT, DeBERTa v1) move.
# Rotary positions (the modern encoders) are relative too: left padding shifts every real token alike.
LEFT_PAD_INVARIANT = {"roberta", "xlm-roberta", "mpnet", "deberta-v2", *MODERN_TYPES}

# Layer 0: heads 1 and 3 constant, 0 and 2 kept; layer 1: every head constant.
MIXED = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


def encode(tok, pairs: bool, padding_side: str = "right", examples=None):
    tok.padding_side = padding_side
    if pairs:
        examples = PAIRS if examples is None else examples
        return tok([a for a, _ in examples], [b for _, b in examples], padding=True, return_tensors="pt")
    return tok(SENTENCES if examples is None else examples, padding=True, return_tensors="pt")


@torch.no_grad()
def run(model, enc, **kwargs):
    """Forward pass without gradients."""
    return model(**enc, **kwargs)


def max_diff_real(a: torch.Tensor, b: torch.Tensor, mask: torch.Tensor) -> float:
    """Largest |a - b| over real tokens ((B, N, ...) tensors, (B, N) mask)."""
    return float((a - b)[mask.bool()].abs().max())


def source_and_tokenizer(tiny_model, tiny_tokenizer, case, head="AutoModel", attn="eager"):
    model_type, overrides = CASES[case]
    return tiny_model(model_type, head=head, attn=attn, **overrides), tiny_tokenizer(model_type)


# --- 1. no constant heads == source ---------------------------------------------------------------------


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("attn", ["eager", "sdpa"])
@pytest.mark.parametrize("case", list(CASES))
def test_no_constant_heads_equals_source(tiny_model, tiny_tokenizer, case, attn, padding_side, pairs):
    if attn == "sdpa" and CASES[case][0] not in SDPA:
        pytest.skip(f"{case} has no sdpa attention in transformers")
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case, attn=attn)
    model = make_papa(src, [], max_length=L, sep_token_id=tok.sep_token_id)
    assert all(m.papa_heads.const == () and len(m.papa_heads.kept) == HEADS for m in attention_modules(model))
    enc = encode(tok, pairs, padding_side)
    assert enc["attention_mask"].min() == 0  # the batch really is padded
    expected, got = run(src, enc).last_hidden_state, run(model, enc).last_hidden_state
    assert max_diff_real(expected, got, enc["attention_mask"]) <= TOL


@pytest.mark.parametrize("head", ["AutoModelForSequenceClassification", "AutoModelForMaskedLM"])
@pytest.mark.parametrize("case", list(CASES))
def test_no_constant_heads_equals_source_task_heads(tiny_model, tiny_tokenizer, case, head):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case, head=head)
    model = make_papa(src, [], max_length=L, sep_token_id=tok.sep_token_id)
    enc = encode(tok, pairs=True)
    diff = (run(src, enc).logits - run(model, enc).logits).abs()
    if head == "AutoModelForMaskedLM":
        diff = diff[enc["attention_mask"].bool()]
    assert float(diff.max()) <= TOL


# --- 2. constant heads beside kept heads ----------------------------------------------------------------


def _qk_rows(module, family) -> dict[str, int | None]:
    """Output rows of every per-head query/key projection (None when removed)."""
    names = {
        "deberta": ["in_proj", "pos_proj", "pos_q_proj"],
        "deberta-v2": ["query_proj", "key_proj", "pos_key_proj", "pos_query_proj"],
    }.get(family.model_type, [family.q, family.k])
    rows = {}
    for name in names:
        if name in ("pos_key_proj", "pos_query_proj") and module.share_att_key:
            assert getattr(module, name, None) is None
            continue
        linear = getattr(module, name, None)  # a layer with no kept head has a weightless stand-in, or None
        rows[name] = linear.weight.shape[0] if isinstance(linear, torch.nn.Linear) else None
    return rows


@pytest.mark.parametrize("case", list(CASES))
def test_constant_heads_drop_query_key(tiny_model, tiny_tokenizer, case):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    family = family_for(src.config.model_type)
    constants = make_constants("random", LAYERS, HEADS, L)
    model = make_papa(src, MIXED, constants, L, tok.sep_token_id)
    d = 32 // HEADS
    first, second = attention_modules(model)
    assert (first.papa_heads.kept, first.papa_heads.const) == ((0, 2), (1, 3))
    assert (second.papa_heads.kept, second.papa_heads.const) == ((), (0, 1, 2, 3))
    assert tuple(first.papa_constants.shape) == (2, L, L) and tuple(second.papa_constants.shape) == (4, L, L)

    per_kept = 3 * d if family.model_type == "deberta" else d  # DeBERTa v1 keeps q, k and v rows in in_proj
    if family.fused_qkv:  # ModernBERT's Wqkv keeps the kept heads' Q and K rows and every V row
        assert first.Wqkv.proj.weight.shape[0] == 2 * 2 * d + HEADS * d
        assert second.Wqkv.proj.weight.shape[0] == HEADS * d
    elif family.kv_heads_attr:  # EuroBERT: kept heads 0 and 2 read both key heads (groups {0, 1}, {2, 3})
        assert first.q_proj.weight.shape[0] == 2 * d and first.k_proj.weight.shape[0] == 2 * d
        assert _qk_rows(second, family) == {"q_proj": None, "k_proj": None}
    else:
        for name, rows in _qk_rows(first, family).items():
            expected = 2 * (per_kept if name == "in_proj" else d)
            assert rows == expected, (name, rows)
        for name, rows in _qk_rows(second, family).items():
            assert rows is None, name
    if family.model_type == "deberta":
        assert first.papa_value_proj.weight.shape[0] == 2 * d
        assert second.papa_value_proj.weight.shape[0] == 4 * d
        assert first.q_bias.shape[0] == 2 * d and second.q_bias.shape[0] == 0

    # Value and output projections stay whole.
    v = {"deberta": "papa_value_proj", "deberta-v2": "value_proj"}.get(family.model_type, family.v)
    if family.model_type != "deberta" and not family.fused_qkv:
        kv_heads = getattr(src.config, family.kv_heads_attr) if family.kv_heads_attr else HEADS
        assert getattr(second, v).weight.shape[0] == kv_heads * d

    # Dropping the constant heads' query/key rows changes no output: the unpruned model (every head in both
    # sets, lambda 1 for the kept heads and 0 for the constant ones) computes the same thing.
    everything = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    unpruned = make_papa(src, everything, constants, L, tok.sep_token_id, kept_heads=everything)
    with torch.no_grad():
        for layer, m in enumerate(attention_modules(unpruned)):
            m.papa_lambda_logits.copy_(torch.tensor([-50.0 if [layer, h] in MIXED else 50.0 for h in range(HEADS)]))
    for pairs in (False, True):
        enc = encode(tok, pairs)
        out = run(model, enc).last_hidden_state
        assert max_diff_real(out, run(unpruned, enc).last_hidden_state, enc["attention_mask"]) <= TOL
    # Nothing of the source changed.
    assert all(type(m).__name__ == family.attention_class for m in attention_modules(src))


@pytest.mark.parametrize("case", list(CASES))
def test_kept_heads_match_source_attention(tiny_model, tiny_tokenizer, case):
    """Layer 0 sees the source's own hidden states: its kept heads must attend exactly like the source's."""
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    enc = encode(tok, pairs=True)
    expected = run(src, enc, output_attentions=True).attentions[0]
    got = run(model, enc, output_attentions=True).attentions[0]
    assert got.shape == expected.shape
    assert float((got[:, [0, 2]] - expected[:, [0, 2]]).abs().max()) <= TOL


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][0] in SDPA))
def test_constant_heads_eager_equals_sdpa(tiny_model, tiny_tokenizer, case, pairs):
    src_eager, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case, attn="eager")
    src_sdpa, _ = source_and_tokenizer(tiny_model, tiny_tokenizer, case, attn="sdpa")
    c = make_constants("random", LAYERS, HEADS, L)
    eager = make_papa(src_eager, MIXED[:3], c, L, tok.sep_token_id)
    sdpa = make_papa(src_sdpa, MIXED[:3], c, L, tok.sep_token_id)
    for examples in (None, PAIRS[:1] if pairs else SENTENCES[:1]):  # padded batch; one example, no padding
        enc = encode(tok, pairs, examples=examples)
        a, b = run(eager, enc).last_hidden_state, run(sdpa, enc).last_hidden_state
        assert max_diff_real(a, b, enc["attention_mask"]) <= TOL


# --- 4. what constant heads compute ---------------------------------------------------------------------


@torch.no_grad()
def _value_vectors(src_module, family, hidden: torch.Tensor, head: int, d: int) -> torch.Tensor:
    """Value vectors (B, N, d) of one head, from the source module's own weights."""
    rows = slice(head * d, (head + 1) * d)
    if family.model_type == "deberta":
        w = src_module.in_proj.weight.view(HEADS, 3, d, -1)[head, 2]  # (d, hidden)
        return hidden @ w.T + src_module.v_bias[rows]
    linear = getattr(src_module, {"deberta-v2": "value_proj"}.get(family.model_type, family.v))
    if family.fused_qkv:  # ModernBERT: [Q; K; V] rows, V last
        rows = slice(2 * HEADS * d + head * d, 2 * HEADS * d + (head + 1) * d)
    if family.kv_heads_attr:  # EuroBERT: the head reads its group's value head
        group = head // src_module.num_key_value_groups
        rows = slice(group * d, (group + 1) * d)
    bias = 0 if linear.bias is None else linear.bias[rows]
    return hidden @ linear.weight[rows].T + bias


def _capture_contexts(model, family):
    """Hooks capturing each PAPA attention module's input hidden states and per-head context (B, N, H*d)."""
    seen: dict[int, dict] = {}
    handles = []
    for layer, module in enumerate(attention_modules(model)):
        seen[layer] = {}

        def pre(mod, args, kwargs, layer=layer):
            seen[layer]["hidden"] = args[0] if args else kwargs["hidden_states"]

        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        if family.out is not None:  # DistilBERT, MPNet: the output projection is inside the module

            def ctx_hook(mod, args, layer=layer):
                seen[layer]["context"] = args[0]

            handles.append(getattr(module, family.out).register_forward_pre_hook(ctx_hook))
        else:

            def out_hook(mod, args, output, layer=layer):
                seen[layer]["context"] = output[0]

            handles.append(module.register_forward_hook(out_hook))
    return seen, handles


@pytest.mark.parametrize("case", list(CASES))
def test_identity_and_zeros_constants(tiny_model, tiny_tokenizer, case):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    family = family_for(src.config.model_type)
    d = 32 // HEADS
    src_modules = attention_modules(src)
    for kind in ("identity", "zeros"):
        model = make_papa(src, MIXED, make_constants(kind, LAYERS, HEADS, L), L, tok.sep_token_id)
        seen, handles = _capture_contexts(model, family)
        for pairs, side in ((False, "right"), (True, "left")):
            enc = encode(tok, pairs, side)
            run(model, enc)
            real = enc["attention_mask"].bool()
            for layer, heads in ((0, [1, 3]), (1, [0, 1, 2, 3])):
                hidden, ctx = seen[layer]["hidden"], seen[layer]["context"]
                for h in heads:
                    got = ctx[..., h * d : (h + 1) * d]
                    if kind == "zeros":
                        assert float(got.abs().max()) == 0.0
                    else:
                        value = _value_vectors(src_modules[layer], family, hidden, h, d)
                        assert float((got - value)[real].abs().max()) <= TOL, (kind, pairs, layer, h)
        for handle in handles:
            handle.remove()


def _expected_single_slots(n_real: int) -> list[int]:
    """Slots of a single sentence of n_real tokens: 0, 1, ..., then the final separator at L - 1."""
    return list(range(n_real - 1)) + [L - 1]


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("case", list(CASES))
def test_output_attentions_are_the_constants_used(tiny_model, tiny_tokenizer, case, padding_side):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    c = make_constants("random", LAYERS, HEADS, L, seed=1)
    model = make_papa(src, MIXED, c, L, tok.sep_token_id)
    enc = encode(tok, pairs=False, padding_side=padding_side)
    attentions = run(model, enc, output_attentions=True).attentions
    assert len(attentions) == LAYERS
    real = enc["attention_mask"].bool()
    for layer, heads in ((0, [1, 3]), (1, [0, 1, 2, 3])):
        w = attentions[layer]  # (B, H, N, N)
        assert w.shape == (real.shape[0], HEADS, real.shape[1], real.shape[1])
        for b in range(real.shape[0]):
            idx = real[b].nonzero().squeeze(-1)
            slots = torch.tensor(_expected_single_slots(len(idx)))
            for h in heads:
                used = w[b, h]
                expected = c[layer, h][slots][:, slots]
                window = getattr(attention_modules(model)[layer], "papa_window", None)
                if window is not None:  # ModernBERT's local layer: tokens within the window only
                    expected = expected * window_mask(len(idx), window)
                expected = expected / expected.sum(-1, keepdim=True)
                assert torch.allclose(used[idx][:, idx], expected, atol=1e-6)
                rows = used[idx]  # real queries
                assert torch.allclose(rows.sum(-1), torch.ones(len(idx)), atol=1e-6)
                assert float(rows[:, ~real[b]].abs().sum()) == 0.0  # no mass on padding keys
            for h in (0, 2) if layer == 0 else ():  # kept heads: an ordinary softmax over real keys
                assert torch.allclose(w[b, h][idx][:, idx].sum(-1), torch.ones(len(idx)), atol=1e-5)


@pytest.mark.parametrize("case", sorted(c for c in CASES if CASES[c][0] in SDPA))
def test_sdpa_output_attentions_return_the_constants(tiny_model, tiny_tokenizer, case):
    """sdpa gives no weights for kept heads (NaN there), but constant heads still report their constants."""
    c = make_constants("random", LAYERS, HEADS, L)
    weights = {}
    for attn in ("eager", "sdpa"):
        src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case, attn=attn)
        model = make_papa(src, MIXED, c, L, tok.sep_token_id)
        weights[attn] = run(model, encode(tok, pairs=True), output_attentions=True).attentions
    assert torch.equal(weights["sdpa"][1], weights["eager"][1])
    assert torch.equal(weights["sdpa"][0][:, [1, 3]], weights["eager"][0][:, [1, 3]])
    assert torch.isnan(weights["sdpa"][0][:, [0, 2]]).all()


@pytest.mark.parametrize("case", list(CASES))
def test_inputs_embeds_match_input_ids_for_single_sentences(tiny_model, tiny_tokenizer, case):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    enc = encode(tok, pairs=False)
    embeds = model.get_input_embeddings()(enc["input_ids"])
    by_embeds = {k: v for k, v in enc.items() if k != "input_ids"}
    a = run(model, enc).last_hidden_state
    b = run(model, {**by_embeds, "inputs_embeds": embeds}).last_hidden_state
    assert max_diff_real(a, b, enc["attention_mask"]) <= TOL


@pytest.mark.parametrize("case", list(CASES))
def test_training_step(tiny_model, tiny_tokenizer, case):
    """Train mode (dropout on kept and constant heads) runs and back-propagates; constants frozen by default."""
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case, head="AutoModelForSequenceClassification")
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    enc = encode(tok, pairs=True)
    model.train()
    out = model(**enc, labels=torch.tensor([0, 1, 2]))
    out.loss.backward()
    first, second = attention_modules(model)
    assert not first.papa_constants.requires_grad and first.papa_constants.grad is None
    family = family_for(src.config.model_type)
    q = {"deberta": "in_proj", "deberta-v2": "query_proj"}.get(family.model_type, family.q)
    projection = getattr(first, q)
    assert getattr(projection, "proj", projection).weight.grad is not None  # ModernBERT's fused Wqkv: .proj

    trainable = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id, trainable=True)
    assert all(m.papa_constants.requires_grad for m in attention_modules(trainable))
    trainable.train()
    trainable(**enc, labels=torch.tensor([0, 1, 2])).loss.backward()
    grads = [m.papa_constants.grad for m in attention_modules(trainable)]
    assert all(g is not None and torch.isfinite(g).all() and g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("case", list(CASES))
def test_converted_model_records_outputs(tiny_model, tiny_tokenizer, case):
    """``convert``'s model is constructed like a loaded one: it returns attentions and hidden states."""
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.conversion.surgery import convert

    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    constants = Constants(make_constants("random", LAYERS, HEADS, L), "test", L)
    model = convert(src, constants, MIXED, tokenizer=tok)
    enc = encode(tok, pairs=True)
    out = run(model, enc, output_attentions=True, output_hidden_states=True)
    assert out.attentions is not None and len(out.attentions) == LAYERS
    assert out.hidden_states is not None and len(out.hidden_states) == LAYERS + 1
    assert torch.equal(out.hidden_states[-1], out.last_hidden_state)
    assert torch.equal(out.hidden_states[0], run(src, enc, output_hidden_states=True).hidden_states[0])


@pytest.mark.parametrize("case", list(CASES))
def test_lambda_mixing(tiny_model, tiny_tokenizer, case):
    """Every head kept and constant: lambda -> 1 is the source, lambda -> 0 the all-constant model."""
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    everything = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    c = make_constants("random", LAYERS, HEADS, L)
    mixed = make_papa(src, everything, c, L, tok.sep_token_id, kept_heads=everything)
    constant = make_papa(src, everything, c, L, tok.sep_token_id)
    enc = encode(tok, pairs=True)
    real = enc["attention_mask"]
    modules = attention_modules(mixed)
    assert all(m.papa_lambda_logits.shape == (HEADS,) for m in modules)
    for logit, reference in ((50.0, src), (-50.0, constant)):
        with torch.no_grad():
            for m in modules:
                m.papa_lambda_logits.fill_(logit)
        got = run(mixed, enc).last_hidden_state
        assert max_diff_real(got, run(reference, enc).last_hidden_state, real) <= TOL
    with torch.no_grad():
        for m in modules:
            m.papa_lambda_logits.zero_()
    mixed(**enc).last_hidden_state[real.bool()].pow(2).sum().backward()
    assert all(m.papa_lambda_logits.grad is not None and m.papa_lambda_logits.grad.abs().sum() > 0 for m in modules)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_tiny_folder_loads_with_auto_classes(tiny_model, tiny_tokenizer, tiny_folder, model_type):
    from transformers import AutoModel, AutoTokenizer

    folder = tiny_folder(model_type)
    model = AutoModel.from_pretrained(folder, attn_implementation="eager").eval()
    tok = AutoTokenizer.from_pretrained(folder)
    assert tok.pad_token_id == tiny_tokenizer(model_type).pad_token_id
    enc = encode(tok, pairs=True)
    a, b = run(model, enc).last_hidden_state, run(tiny_model(model_type), enc).last_hidden_state
    assert max_diff_real(a, b, enc["attention_mask"]) == 0.0


# --- 3. padding invariance and the padded reference -----------------------------------------------------


@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("case", list(CASES))
def test_padding_changes_no_real_token(tiny_model, tiny_tokenizer, case, padding_side, pairs):
    src, tok = source_and_tokenizer(tiny_model, tiny_tokenizer, case)
    model_type = CASES[case][0]
    if padding_side == "left" and model_type not in LEFT_PAD_INVARIANT:
        pytest.skip(f"{model_type} uses absolute positions: left padding moves them in the source model too")
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, L), L, tok.sep_token_id)
    examples = PAIRS if pairs else SENTENCES
    short = min(range(len(examples)), key=lambda i: len(str(examples[i])))
    alone = encode(tok, pairs, padding_side, [examples[short]])
    batch = encode(tok, pairs, padding_side, examples)
    n = int(alone["attention_mask"].sum())
    assert batch["input_ids"].shape[1] > n  # the short example is padded in the batch
    for m in (src, model):  # the source is invariant too, or the comparison would be meaningless
        a = run(m, alone).last_hidden_state[0][alone["attention_mask"][0].bool()]
        b = run(m, batch).last_hidden_state[short][batch["attention_mask"][short].bool()]
        assert float((a - b).abs().max()) <= TOL


def _padded_reference_input(tok, example, pairs: bool, max_length: int):
    """One example padded to L in the paper's layout, with the slot of each natural token.

    Single: tokens from slot 0, padding, the final ``</s>`` at L-1. Pair: the first segment from slot 0,
    ``</s></s>`` at L/2 and L/2+1, the second segment after them, the final ``</s>`` at L-1.
    """
    enc = tok(*example) if pairs else tok(example)
    ids = enc["input_ids"]
    sep, half = tok.sep_token_id, max_length // 2
    if pairs:
        mid = ids.index(sep)  # first </s>: end of the first segment
        first, middle_and_second = ids[:mid], ids[mid:-1]
        slots = list(range(len(first))) + [half + i for i in range(len(middle_and_second))] + [max_length - 1]
    else:
        slots = list(range(len(ids) - 1)) + [max_length - 1]
    padded = torch.full((1, max_length), tok.pad_token_id)
    mask = torch.zeros(1, max_length, dtype=torch.long)
    padded[0, slots] = torch.tensor(ids)
    mask[0, slots] = 1
    return {"input_ids": padded, "attention_mask": mask}, torch.tensor(ids), torch.tensor(slots)


@pytest.mark.parametrize("padding_side", ["right", "left"])
@pytest.mark.parametrize("pairs", [False, True], ids=["single", "pair"])
@pytest.mark.parametrize("model_type", ["roberta", "xlm-roberta"])
def test_slot_path_equals_padded_reference(tiny_model, tiny_tokenizer, model_type, pairs, padding_side):
    ref_len = 32
    src, tok = tiny_model(model_type), tiny_tokenizer(model_type)
    c = make_constants("random", LAYERS, HEADS, ref_len, seed=2)
    model = make_papa(src, MIXED, c, ref_len, tok.sep_token_id)
    examples = PAIRS if pairs else SENTENCES
    natural = encode(tok, pairs, padding_side, examples)
    got = run(model, natural).last_hidden_state

    # The paper's layout: each example padded to L with its tokens at their slots, and the constants read
    # on the whole L x L grid (slot i = position i, padding masked): rownorm(C * mask) @ V.
    for b, example in enumerate(examples):
        padded, ids, slots = _padded_reference_input(tok, example, pairs, ref_len)
        grid = torch.where(padded["attention_mask"].bool(), torch.arange(ref_len), torch.tensor(-1))  # (1, L)
        ref = run(model, padded, papa_slots=grid).last_hidden_state[0, slots]  # (n, hidden) at the natural tokens
        real = natural["attention_mask"][b].bool()
        assert torch.equal(natural["input_ids"][b][real], ids)
        assert float((got[b][real] - ref).abs().max()) <= TOL, example


# --- the real model ---------------------------------------------------------------------------------------


@pytest.mark.real
def test_minilm_no_constant_heads_equals_source(minilm):
    src, tok = minilm
    model = make_papa(src, [], max_length=128, sep_token_id=tok.sep_token_id)
    for side in ("right", "left"):
        enc = encode(tok, pairs=True, padding_side=side)
        diff = max_diff_real(run(src, enc).last_hidden_state, run(model, enc).last_hidden_state, enc["attention_mask"])
        assert diff <= TOL


@pytest.mark.real
def test_minilm_half_constant_padding_invariant(minilm):
    src, tok = minilm
    layers, heads = src.config.num_hidden_layers, src.config.num_attention_heads
    constant = [[layer, h] for layer in range(layers) for h in range(heads) if (layer + h) % 2 == 0]
    model = make_papa(src, constant, make_constants("toeplitz", layers, heads, 128), 128, tok.sep_token_id)
    first = attention_modules(model)[0]
    assert first.query.weight.shape[0] == 6 * 32 and first.key.weight.shape[0] == 6 * 32
    alone = encode(tok, pairs=True, examples=[PAIRS[2]])
    batch = encode(tok, pairs=True, examples=PAIRS)
    a = run(model, alone).last_hidden_state[0]
    b = run(model, batch).last_hidden_state[2][batch["attention_mask"][2].bool()]
    assert float((a - b).abs().max()) <= TOL
