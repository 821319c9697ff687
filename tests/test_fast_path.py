"""Constant heads without per-example matrices equal the materialised definition (issue 19).

The runtime computes ``rownorm(C[slots] * mask) V`` as one GEMM per head on the batch's compressed slot space
(``hub_code/constant_heads.py``); the reference is the gather-and-normalise definition
(``slots.reference_constant_attention``), which builds every example's (N, N) matrix. They must agree to 1e-5 in
fp32:

- on the attention function, for random batches of singles and pairs (one or two middle separators, segments
  longer than their halves), both padding sides, every length up to L, local windows, explicit slots, rows no
  calibration reached; with the gradients of trainable constants and of the values;
- on whole models of all 13 families, with the reference swapped in for the runtime: single and pair inputs,
  both padding sides, several lengths, ModernBERT's local layers, compact constants, lambda mixing and its
  gradients, trainable constants' gradients, and attention dropout in training (which runs the reference).
"""

from __future__ import annotations

import random

import pytest
import torch
from conftest import FAMILY_TYPES, make_constants, make_papa

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code import constant_heads, overrides, papa_attention
from papa_surgery.hub_code.compact_constants import constants_of
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.hub_code.slot_plan import SlotPlan
from papa_surgery.hub_code.slots import reference_constant_attention

pytestmark = pytest.mark.usefixtures("one_thread")

TOL = 1e-5
LAYERS, HEADS = 2, 4
MIXED = [[0, 1], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]  # layer 0 keeps heads 0 and 2; layer 1 attention-free
CLS, SEP, PAD, WORD = 2, 3, 0, 10


class Holder(torch.nn.Module):
    """Just the constants of one attention module, as ``constant_attention`` reads them."""

    def __init__(self, constants: torch.Tensor, trainable: bool = False):
        super().__init__()
        if trainable:
            self.papa_constants = torch.nn.Parameter(constants)
        else:
            self.register_buffer("papa_constants", constants)


def random_batch(rng: random.Random, length: int, max_batch: int = 5, side: str = "right"):
    """(ids, mask) of singles and pairs of random lengths up to L, RoBERTa-style double separators included."""
    rows = []
    for _ in range(rng.randint(1, max_batch)):
        n = rng.randint(2, length)
        row = [CLS] + [WORD] * (n - 2) + [SEP]
        if n >= 4 and rng.random() < 0.6:  # a pair: its middle anywhere, so segments overflow their halves too
            k = rng.randint(1, n - 3)
            row[k] = SEP
            if k + 1 < n - 1 and rng.random() < 0.5:
                row[k + 1] = SEP
        rows.append(row)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), PAD)
    mask = torch.zeros(len(rows), width, dtype=torch.long)
    for b, row in enumerate(rows):
        place = slice(0, len(row)) if side == "right" else slice(width - len(row), width)
        ids[b, place], mask[b, place] = torch.tensor(row), 1
    return ids, mask


def reference(constants, plan, value, window=None):
    return reference_constant_attention(constants, plan.slots, value, window=window)[0].transpose(1, 2)


@pytest.mark.parametrize("window", [None, 1, 3, 7], ids=["global", "w1", "w3", "w7"])
@pytest.mark.parametrize("side", ["right", "left"])
def test_attention_function_equals_the_definition_on_random_batches(side, window):
    rng, length = random.Random(f"{side}{window}"), 24
    torch.manual_seed(0)
    for trial in range(60):
        ids, mask = random_batch(rng, length, side=side)
        constants = torch.rand(3, length, length) + 0.01
        if trial % 4 == 0:
            constants[:, rng.randrange(length)] = 0  # a slot no calibration example reached: empty row
        plan = SlotPlan.from_tokens(ids, mask, length, SEP)
        value = torch.randn(ids.shape[0], 3, ids.shape[1], 5)
        got, weights = constant_heads.constant_attention(Holder(constants), plan, value, window=window)
        assert weights is None
        expected = reference(constants, plan, value, window)
        assert float((got - expected).abs().max()) <= TOL, (trial, ids.tolist())


@pytest.mark.parametrize(
    "heads",
    [[0, 2, 3], [3, 1], [1, 1, 2, 2], [1, 2, 3], [0, 1, 2, 3]],
    ids=["sorted", "unsorted", "grouped", "run", "all"],
)
def test_constant_heads_read_in_place_equal_their_copy(heads):
    """``heads=`` (which of a layer's value heads the constant heads read; repeated under GQA) on every head's
    values equals the constant heads' values copied out first, on the gathered short-batch path and the
    scattered one (explicit slots), and the definition; padded singles and pairs."""
    rng, length = random.Random(f"in-place{heads}"), 24
    torch.manual_seed(3)
    for trial in range(20):
        ids, mask = random_batch(rng, length, side="right" if trial % 2 else "left")
        constants = torch.rand(len(heads), length, length) + 0.01
        value = torch.randn(ids.shape[0], 4, ids.shape[1], 5)  # (B, 4 value heads, N, d)
        copied = value.index_select(1, torch.tensor(heads))  # (B, Hc, N, d)
        for plan in (SlotPlan.from_tokens(ids, mask, length, SEP), SlotPlan.from_slots(_slots(ids, mask), length)):
            got, _ = constant_heads.constant_attention(Holder(constants), plan, value, heads=heads)
            expected, _ = constant_heads.constant_attention(Holder(constants), plan, copied)
            assert float((got - expected).abs().max()) <= TOL
            assert float((got - reference(constants, plan, copied)).abs().max()) <= TOL


def _slots(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """The model's own slots of a batch, given back as explicit ones (the plan then knows nothing of them)."""
    return SlotPlan.from_tokens(ids, mask, 24, SEP).slots


def test_explicit_slots_equal_the_definition():
    """Any slots in [0, L), gaps and all (the paper's padded-to-L layout is one such)."""
    torch.manual_seed(1)
    length = 20
    for _ in range(30):
        slots = torch.full((3, 9), -1)
        for b in range(3):
            k = int(torch.randint(1, 10, ()))
            slots[b, torch.randperm(9)[:k]] = torch.randperm(length)[:k]
        constants = torch.rand(2, length, length)
        value = torch.randn(3, 2, 9, 4)
        plan = SlotPlan.from_slots(slots, length)
        got, _ = constant_heads.constant_attention(Holder(constants), plan, value)
        assert float((got - reference(constants, plan, value)).abs().max()) <= TOL
    with pytest.raises(ValueError, match=r"papa_slots must lie in \[-1, 20\)"):
        SlotPlan.from_slots(torch.tensor([[0, 20]]), length)


@pytest.mark.parametrize("window", [None, 2])
def test_gradients_of_trainable_constants_and_values_equal_the_definition(window):
    rng, length = random.Random(7), 16
    ids, mask = random_batch(rng, length, max_batch=4)
    ids[0, : mask[0].sum()] = torch.tensor([CLS] + [WORD] * (int(mask[0].sum()) - 2) + [SEP])
    ids[0, 3] = SEP  # at least one pair
    plan = SlotPlan.from_tokens(ids, mask, length, SEP)
    weight = torch.randn(ids.shape[0], ids.shape[1], 2, 3) * mask[:, :, None, None]  # (B, N, Hc, d)
    constants, value0 = torch.rand(2, length, length) + 0.05, torch.randn(ids.shape[0], 2, ids.shape[1], 3)
    grads = {}
    for run in ("fast", "reference"):
        holder, value = Holder(constants.clone(), trainable=True), value0.clone().requires_grad_()
        if run == "fast":
            out, _ = constant_heads.constant_attention(holder, plan, value, window=window)
        else:
            out = reference(holder.papa_constants, plan, value, window)
        (out * weight).sum().backward()
        grads[run] = (holder.papa_constants.grad, value.grad)
    for fast, ref in zip(grads["fast"], grads["reference"], strict=True):
        assert fast.abs().sum() > 0 and torch.allclose(fast, ref, atol=TOL)


def test_prepared_constants_are_kept_until_the_constants_change():
    holder = Holder(torch.rand(2, 8, 8))
    first = constant_heads.prepared_constants(holder, torch.float32)
    assert constant_heads.prepared_constants(holder, torch.float32) is first  # input-independent: built once
    assert torch.equal(first[:, 0, 0], holder.papa_constants[:, 7, 7])  # slot L-1 first
    with torch.no_grad():
        holder.papa_constants.mul_(2)
    again = constant_heads.prepared_constants(holder, torch.float32)
    assert again is not first and torch.allclose(again, 2 * first)
    holder.papa_constants = -torch.ones(2, 8, 8)  # a new tensor; negative entries count as 0
    assert float(constant_heads.prepared_constants(holder, torch.float32).abs().max()) == 0


# --- whole models -----------------------------------------------------------------------------------------


def _reference_attention(module, plan, value, dropout=0.0, window=None, weights=False, heads=None):
    value = value if heads is None else value.index_select(1, torch.tensor(heads))  # (B, Hc, N, d)
    # Compact constants of format 2 are used as stored (negative cells too); dense ones count negatives as 0.
    clamp = constant_heads._clamps(module)
    ctx, p = reference_constant_attention(constants_of(module), plan.slots, value, dropout, window, clamp)
    return ctx.transpose(1, 2), p if weights else None


@pytest.fixture
def as_reference(monkeypatch):
    """Context manager factory: run constant heads through the materialised definition instead."""

    def swap():
        monkeypatch.setattr(papa_attention, "constant_attention", _reference_attention)
        monkeypatch.setattr(overrides, "constant_attention", _reference_attention)

    return swap


def _both(model, batches, as_reference, grad=False):
    """Outputs (real tokens) of ``model`` on ``batches``, fast and with the reference swapped in."""
    fast = [_real(model, b) for b in batches]
    as_reference()
    return fast, [_real(model, b) for b in batches]


def _real(model, batch):
    with torch.no_grad():
        return model(**batch).last_hidden_state[batch["attention_mask"].bool()]


def _texts(rng: random.Random, count: int, longest: int) -> list[str]:
    words = "the movie is a fun and charming journey but bleak acting music".split()
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, longest))) for _ in range(count)]


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_every_family_equals_the_definition(tiny, model_type, as_reference):
    """Singles and pairs (segments over their halves too), both padding sides, lengths 3 .. L."""
    length = 32
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, length, seed=3), length, tok.sep_token_id)
    rng = random.Random(model_type)
    batches = []
    for side in ("right", "left"):
        tok.padding_side = side
        for longest in (4, 12, 28):
            batches.append(tok(_texts(rng, 5, longest), padding=True, truncation=True, return_tensors="pt"))
            a, b = _texts(rng, 4, longest), _texts(rng, 4, longest // 2)
            batches.append(tok(a, b, padding=True, truncation=True, max_length=length, return_tensors="pt"))
    fast, ref = _both(model, batches, as_reference)
    for batch, f, r in zip(batches, fast, ref, strict=True):
        assert float((f - r).abs().max()) <= TOL, (model_type, batch["input_ids"].shape)


@pytest.mark.parametrize("storage", ["dense", "compact"])
def test_modernbert_local_windows_and_compact_constants_equal_the_definition(tiny, storage, as_reference):
    length = 48
    src, tok = tiny.model("modernbert"), tiny.tokenizer("modernbert")
    constants = Constants(make_constants("random", LAYERS, HEADS, length, seed=5), "average", length)
    options = dict(storage="compact", compact_band=3, compact_rank=2) if storage == "compact" else {}
    model = convert(src, constants, MIXED, tokenizer=tok, **options)
    assert getattr(attention_modules(model)[1], "papa_window", None) is not None  # layer 1 is local
    rng = random.Random(storage)
    batches = []
    for side in ("right", "left"):
        tok.padding_side = side
        batches.append(tok(_texts(rng, 6, 40), padding=True, return_tensors="pt"))
        batches.append(tok(_texts(rng, 4, 30), _texts(rng, 4, 10), padding=True, return_tensors="pt"))
    fast, ref = _both(model, batches, as_reference)
    for f, r in zip(fast, ref, strict=True):
        assert float((f - r).abs().max()) <= TOL


@pytest.mark.parametrize("model_type", ["bert", "mpnet", "deberta-v2", "modernbert"])
def test_training_paths_keep_their_gradients(tiny, model_type, as_reference):
    """Trainable constants and lambda mixing: the same gradients through the runtime and the definition."""
    length = 32
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    for module in src.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0  # the same computation in both runs
    c = make_constants("random", LAYERS, HEADS, length, seed=4)
    every = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    enc = tok(["a fun ride .", "the acting is bleak"], ["charming", "and fun"], padding=True, return_tensors="pt")

    def gradients(model):
        model.train()
        model.zero_grad(set_to_none=True)
        out = model(**enc).last_hidden_state
        (out[enc["attention_mask"].bool()] ** 2).sum().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None and "papa_" in n}

    trainable = make_papa(src, MIXED, c, length, tok.sep_token_id, trainable=True)
    mixed = make_papa(src, every, c, length, tok.sep_token_id, kept_heads=every)
    fast = [gradients(trainable), gradients(mixed)]
    as_reference()
    ref = [gradients(trainable), gradients(mixed)]
    for f, r in zip(fast, ref, strict=True):
        assert f and set(f) == set(r)
        for name in f:
            assert torch.allclose(f[name], r[name], atol=TOL), name


def test_attention_dropout_in_training_runs_the_definition(tiny):
    """Dropout drops single cells of each example's matrix: training with it materialises them (same RNG draws)."""
    src, tok = tiny.model("bert"), tiny.tokenizer("bert")
    model = make_papa(src, MIXED, make_constants("random", LAYERS, HEADS, 32), 32, tok.sep_token_id).train()
    enc = tok(["a fun ride .", "the acting is bleak and fun"], padding=True, return_tensors="pt")
    outs = []
    for _ in range(2):
        torch.manual_seed(0)
        outs.append(model(**enc).last_hidden_state)
    assert torch.equal(outs[0], outs[1])
    outs[0].sum().backward()
    model.eval()
    with torch.no_grad():
        assert not torch.allclose(model(**enc).last_hidden_state, outs[1])  # dropout really was on


def test_modernbert_fused_layers_rotate_and_attend_with_the_kept_heads_only(tiny, tmp_path):
    """Item 3: a fused layer with constant heads computes no Q/K for them (nothing to rotate), and its PAPA forward
    equals the family's own forward, which lambda mixing keeps (every head kept): lambda = 1/0 per head."""
    length = 32
    src, tok = tiny.model("modernbert"), tiny.tokenizer("modernbert")
    c = make_constants("random", LAYERS, HEADS, length, seed=6)
    model = make_papa(src, MIXED, c, length, tok.sep_token_id)
    first, second = attention_modules(model)
    d = src.config.hidden_size // HEADS
    assert type(first).__name__ == "PapaModernBertAttention" and first.Wqkv.proj.weight.shape[0] == (2 * 2 + 4) * d
    assert second.Wqkv.proj.weight.shape[0] == HEADS * d  # attention-free layer: V rows only
    q, k, v = first.Wqkv(torch.randn(1, 3, src.config.hidden_size))
    assert q.shape[-1] == k.shape[-1] == 2 * d and v.shape[-1] == HEADS * d

    every = [[layer, h] for layer in range(LAYERS) for h in range(HEADS)]
    unpruned = make_papa(src, every, c, length, tok.sep_token_id, kept_heads=every)
    assert all(type(m).__name__ == "ModernBertAttention" for m in attention_modules(unpruned))
    with torch.no_grad():
        for layer, module in enumerate(attention_modules(unpruned)):
            logits = [-50.0 if [layer, h] in MIXED else 50.0 for h in range(HEADS)]
            module.papa_lambda_logits.copy_(torch.tensor(logits))
    for side in ("right", "left"):
        tok.padding_side = side
        enc = tok(_texts(random.Random(side), 4, 20), padding=True, return_tensors="pt")
        assert float((_real(model, enc) - _real(unpruned, enc)).abs().max()) <= TOL
    torch.save(model, tmp_path / "model.pt")  # the PAPA class unpickles by name
    loaded = torch.load(tmp_path / "model.pt", weights_only=False)
    assert torch.equal(_real(loaded, enc), _real(model, enc))


def test_a_local_layers_band_kept_from_an_inference_forward_serves_a_training_one():
    """The band mask is kept between forwards: one made under ``torch.inference_mode`` must not break autograd."""
    from papa_surgery.hub_code.dense_slots import DenseSlots

    x = torch.randn(2, 11, 3)
    with torch.inference_mode():
        DenseSlots(torch.rand(2, 11, 11)).band_product(x, 2)
    matrix = torch.rand(2, 11, 11, requires_grad=True)
    out = DenseSlots(matrix * 1).band_product(x, 2, owned=True)
    out.sum().backward()
    idx = torch.arange(11)
    band = ((idx[:, None] - idx[None, :]).abs() <= 2) & (idx[:, None] > 0) & (idx[None, :] > 0)
    assert torch.allclose(out, torch.bmm(matrix.detach() * band, x))
    assert torch.equal(matrix.grad != 0, band.expand(2, 11, 11) & (x.sum(-1)[:, None, :] != 0))
