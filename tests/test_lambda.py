"""The learned lambda ranking (paper 3.2): the mixed attention, frozen backbone, and a behavioural check."""

from __future__ import annotations

import random

import pytest
import torch
from conftest import FAMILY_TYPES, PAIRS, SENTENCES, make_constants, needs_shared_data, shared_data_dir

from papa_surgery.calibration.constants import Constants
from papa_surgery.calibration.encoding import encode
from papa_surgery.conversion.surgery import convert
from papa_surgery.hub_code.modeling_papa import attention_modules
from papa_surgery.hub_code.slots import compute_slots
from papa_surgery.probing.heads import build_head
from papa_surgery.ranking.lambdas import (
    fit_lambdas,
    lambda_model,
    lambda_parameters,
    lambda_values,
    set_lambda_logits,
    train_lambdas,
)
from papa_surgery.ranking.methods import rank_heads

LAYERS, HEADS, L = 2, 4, 32
EVERY = [[layer, head] for layer in range(LAYERS) for head in range(HEADS)]
BIG = 30.0  # sigmoid(30) == 1 and sigmoid(-30) ~ 1e-13 in float32


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


def _constants(seed: int = 0) -> Constants:
    return Constants(make_constants("random", LAYERS, HEADS, L, seed=seed), "average", L)


def _inputs(tokenizer, pairs: bool):
    return encode(tokenizer, PAIRS if pairs else SENTENCES, L, pairs=pairs)


def _out(model, batch) -> torch.Tensor:
    """Last hidden states of the real tokens (padding outputs carry nothing and differ by design)."""
    with torch.no_grad():
        return model(**batch).last_hidden_state[batch["attention_mask"].bool()]  # (T, H)


def _sst2_dir(root, rows) -> str:
    (root / "glue/sst2").mkdir(parents=True, exist_ok=True)
    (root / "glue/sst2/train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return str(root)


# --------------------------------------------------------------------------------- test 1: lambda = 1 / 0
@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_lambda_one_is_source_and_zero_is_fully_converted(tiny, model_type):
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    reference = {k: v.clone() for k, v in src.state_dict().items()}
    constants = _constants()
    mixed = lambda_model(src, constants, tok)
    full = convert(src, constants, EVERY, tokenizer=tok)
    assert all(torch.equal(v, reference[k]) for k, v in src.state_dict().items())  # the source is untouched
    assert [p.shape for p in lambda_parameters(mixed)] == [torch.Size([HEADS])] * LAYERS
    assert torch.equal(lambda_values(mixed), torch.full((LAYERS, HEADS), 0.5))  # p_h = 0 at the start
    for pairs in (False, True):
        batch = _inputs(tok, pairs)
        source_out, full_out = _out(src, batch), _out(full, batch)
        assert (source_out - full_out).abs().max() > 1e-2  # the two ends really differ
        set_lambda_logits(mixed, BIG)
        assert (_out(mixed, batch) - source_out).abs().max() <= 1e-5
        set_lambda_logits(mixed, -BIG)
        assert (_out(mixed, batch) - full_out).abs().max() <= 1e-5
        set_lambda_logits(mixed, 0.0)
        half = _out(mixed, batch)
        assert (half - source_out).abs().max() > 1e-3 and (half - full_out).abs().max() > 1e-3


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_per_head_lambdas_line_up_with_conversion(tiny, model_type):
    """lambda = 0 on some heads and 1 on the others is the conversion of exactly those heads."""
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    constants = _constants(seed=1)
    chosen = [[0, 1], [0, 2], [1, 0], [1, 3]]
    logits = torch.full((LAYERS, HEADS), BIG)
    for layer, head in chosen:
        logits[layer, head] = -BIG
    mixed = lambda_model(src, constants, tok)
    set_lambda_logits(mixed, logits)
    partial = convert(src, constants, chosen, tokenizer=tok)
    batch = _inputs(tok, pairs=False)
    assert (_out(mixed, batch) - _out(partial, batch)).abs().max() <= 1e-5


def test_mixed_attention_is_lambda_a_plus_one_minus_lambda_c(tiny):
    """The paper's B = lambda * A + (1 - lambda) * rownorm(C * mask), read back from the first layer."""
    src, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = _constants(seed=2)
    mixed = lambda_model(src, constants, tok)
    logits = torch.linspace(-2.0, 2.0, LAYERS * HEADS).view(LAYERS, HEADS)
    set_lambda_logits(mixed, logits)
    batch = _inputs(tok, pairs=False)
    with torch.no_grad():
        a = src(**batch, output_attentions=True).attentions[0]  # (B, H, N, N): layer 0 sees the same input
        b = mixed(**batch, output_attentions=True).attentions[0]  # (B, H, N, N)
    mask = batch["attention_mask"].bool()  # (B, N)
    slots = compute_slots(batch["input_ids"], batch["attention_mask"], L, tok.sep_token_id).clamp_min(0)  # (B, N)
    c = constants.values[0][:, slots[:, :, None], slots[:, None, :]].transpose(0, 1)  # (B, H, N, N)
    c = c * mask[:, None, None, :]
    c = c / c.sum(-1, keepdim=True)
    lam = torch.sigmoid(logits[0]).view(1, HEADS, 1, 1)
    expected = lam * a + (1 - lam) * c
    real = mask[:, None, :, None] & mask[:, None, None, :]  # (B, 1, N, N)
    assert torch.allclose(b.masked_select(real), expected.masked_select(real), atol=1e-6)
    assert torch.allclose(b.sum(-1).masked_select(mask[:, None, :]), torch.tensor(1.0), atol=1e-5)


def test_lambda_model_is_frozen_except_lambdas(tiny):
    mixed = lambda_model(tiny.model("deberta-v2"), _constants(), tiny.tokenizer("deberta-v2"))
    trainable = {n for n, p in mixed.named_parameters() if p.requires_grad}
    assert trainable == {n for n, _ in mixed.named_parameters() if n.endswith("papa_lambda_logits")}
    assert len(trainable) == LAYERS
    assert not mixed.training
    for module in attention_modules(mixed):
        assert "papa_constants" in dict(module.named_buffers())


# ------------------------------------------------------------------ test 2: only lambda and the probe move
def _labelled(n: int, seed: int = 0):
    rng = random.Random(seed)
    pos, neg, filler = ["charming", "fun", "good"], ["bleak", "dull", "bad"], ["the", "a", "movie", "is", "and"]
    rows = []
    for _ in range(n):
        y = rng.randrange(2)
        words = rng.choices(filler, k=rng.randrange(2, 10)) + [rng.choice(pos if y else neg)]
        rng.shuffle(words)
        rows.append((" ".join(words), y))
    return rows


@pytest.mark.parametrize("model_type", ["bert", "deberta", "distilbert"])
def test_training_changes_only_lambdas_and_probe(tiny, tmp_path, model_type):
    src, tok = tiny.model(model_type, head="AutoModelForSequenceClassification"), tiny.tokenizer(model_type)
    source_before = {k: v.clone() for k, v in src.state_dict().items()}
    data = _sst2_dir(tmp_path, _labelled(48))
    mixed = lambda_model(src, _constants(), tok)
    before = {k: v.clone() for k, v in mixed.state_dict().items()}
    fit = fit_lambdas(mixed, tok, "sst2", data, steps=6, batch_size=8, lr=1e-2, lambda_lr=0.1, seed=3, progress=False)
    after = mixed.state_dict()
    assert fit.steps == 6 and fit.examples == 48
    assert set(after) == set(before)
    lam_keys = {k for k in after if k.endswith("papa_lambda_logits")}
    const_keys = {k for k in after if k.endswith("papa_constants")}
    assert len(lam_keys) == LAYERS and len(const_keys) == LAYERS
    assert all(not torch.equal(after[k], before[k]) for k in lam_keys)
    for key in set(after) - lam_keys:  # every backbone weight, buffer and constant, bit for bit
        assert torch.equal(after[key], before[key]), key
    assert all(p.grad is None for n, p in mixed.named_parameters() if n not in lam_keys)
    # The probe trained: it differs from a fresh head of the same seed.
    torch.manual_seed(3)
    fresh = build_head("sentence", LAYERS + 1, 32, L, 2)
    pairs = zip(fit.head.state_dict().values(), fresh.state_dict().values(), strict=True)
    assert any(not torch.equal(a, b) for a, b in pairs)
    # The source never changes, through train_lambdas either.
    train_lambdas(src, tok, _constants(), "sst2", data, steps=2, batch_size=8, progress=False)
    assert all(torch.equal(v, source_before[k]) for k, v in src.state_dict().items())


def test_training_is_seeded_and_leaves_global_rng(tiny, tmp_path):
    src, tok = tiny.model("roberta"), tiny.tokenizer("roberta")
    data = _sst2_dir(tmp_path, _labelled(40, seed=1))
    opts = dict(steps=5, batch_size=8, lr=1e-2, lambda_lr=0.1, progress=False)
    torch.manual_seed(123)
    state = torch.get_rng_state()
    first = train_lambdas(src, tok, _constants(), "sst2", data, seed=7, **opts)
    assert torch.equal(torch.get_rng_state(), state)
    again = train_lambdas(src, tok, _constants(), "sst2", data, seed=7, **opts)
    other = train_lambdas(src, tok, _constants(), "sst2", data, seed=8, **opts)
    assert first.order == again.order and first.scores == again.scores
    assert first.scores != other.scores
    assert first.scores == sorted(first.scores)
    prov = first.provenance
    assert prov["task"] == "sst2" and prov["seed"] == 7 and prov["steps"] == 5 and prov["examples"] == 40
    assert prov["data"].endswith("train.tsv") and "papa_surgery_version" in prov


def test_token_and_pair_tasks_and_progress_bar(tiny, tmp_path, capsys):
    src, tok = tiny.model("bert"), tiny.tokenizer("bert")
    rng = random.Random(0)
    lines = []
    for _ in range(12):
        for w in rng.choices(["the", "movie", "is", "paris", "london", "fun"], k=rng.randrange(3, 8)):
            lines.append(f"{w} NN O {'B-LOC' if w in ('paris', 'london') else 'O'}")
        lines.append("")
    (tmp_path / "conll2003").mkdir()
    (tmp_path / "conll2003/train.txt").write_text("\n".join(lines))
    pairs = [(a, b, rng.randrange(2)) for a, b in [("a fun ride .", "bleak"), ("the movie", "is fun")] * 6]
    (tmp_path / "glue/mrpc").mkdir(parents=True)
    (tmp_path / "glue/mrpc/train.tsv").write_text(
        "Quality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        + "".join(f"{y}\t{i}\t{i}\t{a}\t{b}\n" for i, (a, b, y) in enumerate(pairs))
    )
    opts = dict(steps=3, batch_size=4, lr=1e-2, lambda_lr=0.1)
    ner = train_lambdas(src, tok, _constants(), "ner", tmp_path, progress=True, **opts)
    assert ner.total == LAYERS * HEADS and ner.provenance["task"] == "ner" and ner.provenance["steps"] == 3
    assert "lambda (ner)" in capsys.readouterr().err  # the progress bar over training steps
    pair_constants = Constants(make_constants("random", LAYERS, HEADS, L), "average", L, pairs=True)
    mrpc = train_lambdas(src, tok, pair_constants, "mrpc", tmp_path, progress=False, **opts)
    assert mrpc.provenance["constants"]["pairs"] is True and mrpc.provenance["examples"] == 12
    with pytest.warns(UserWarning, match="calibrated on single sentences"):
        train_lambdas(src, tok, _constants(), "mrpc", tmp_path, progress=False, **opts)


# ------------------------------------------------------------------------------ test 3: behavioural check
SIGNAL = (0, 1)  # the head that carries the label (layer 0: a tie-break alone would rank it early)
CODES = 7  # matching pairs (A_i, B_i)
SEQ_WORDS = 10  # one A, one B, eight fillers per example
SIGNAL_L = 16  # slots


def _hadamard(n: int) -> torch.Tensor:
    h = torch.ones(1, 1)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _signal_model(tiny):
    """A tiny BERT whose head (0, 1) answers "does the A word match the B word?" by attending.

    Embeddings (hidden 32, no position or token-type signal) put an orthogonal code of A_i in dims 0-7,
    the code of B_j in dims 8-15, an A flag in dim 16, a B flag in dim 17, filler patterns in 18-29 and a
    balancing entry in 31 (every vector has mean 0, so the LayerNorm only rescales). Head (0, 1): queries
    read the B code, keys the A code, so B_j attends (softmax score ~11) to A_j when the codes match and
    uniformly otherwise; values carry the A flag; the output writes into residual dim 30. Every other
    weight (the other seven heads, the FFNs, layer 1) stays random. The label is the match, which no
    single token and no fixed (position-weighted) mixing reveals: the head's input-dependent attention
    is what carries it.
    """
    tok = tiny.tokenizer("bert")
    model = tiny.model("bert")
    vocab = tok.get_vocab()
    words = [w for w in sorted(vocab, key=vocab.get) if w.isalpha() and w.isascii()]
    a_words, b_words, fillers = words[:CODES], words[CODES : 2 * CODES], words[2 * CODES : 2 * CODES + 16]
    codes = _hadamard(8)[1 : CODES + 1]  # (7, 8): zero mean, orthogonal
    g = torch.Generator().manual_seed(0)

    def vector(kind: str, i: int = 0) -> torch.Tensor:
        e = torch.zeros(32)
        if kind == "A":
            e[0:8], e[16] = codes[i], 2.0
        elif kind == "B":
            e[8:16], e[17] = codes[i], 2.0
        else:
            e[18:30] = torch.tensor([1.0] * 6 + [-1.0] * 6)[torch.randperm(12, generator=g)]
        e[31] = -e.sum()
        return e

    layer, head = SIGNAL
    rows = slice(8 * head, 8 * head + 8)
    with torch.no_grad():
        emb = model.embeddings
        for i, w in enumerate(a_words):
            emb.word_embeddings.weight[vocab[w]] = vector("A", i)
        for i, w in enumerate(b_words):
            emb.word_embeddings.weight[vocab[w]] = vector("B", i)
        for w in [*fillers, tok.cls_token, tok.sep_token, tok.pad_token]:
            emb.word_embeddings.weight[vocab[w]] = vector("F")
        emb.position_embeddings.weight.zero_()
        emb.token_type_embeddings.weight.zero_()
        emb.LayerNorm.weight.fill_(1.0)
        emb.LayerNorm.bias.zero_()
        attn = model.encoder.layer[layer].attention
        for lin in (attn.self.query, attn.self.key, attn.self.value):
            lin.weight[rows] = 0.0
            lin.bias[rows] = 0.0
        attn.self.query.weight[rows, 8:16] = 2.0 * torch.eye(8)  # query: B code
        attn.self.key.weight[rows, 0:8] = torch.eye(8)  # key: A code
        attn.self.value.weight[8 * head, 16] = 1.0  # value: the A flag
        attn.output.dense.weight[:, rows] = 0.0
        attn.output.dense.weight[30, 8 * head] = 3.0  # into residual dim 30

    def example(rng: random.Random) -> tuple[str, int]:
        i, match = rng.randrange(CODES), rng.random() < 0.5
        j = i if match else rng.choice([x for x in range(CODES) if x != i])
        seq = rng.choices(fillers, k=SEQ_WORDS)
        pa, pb = rng.sample(range(SEQ_WORDS), 2)
        seq[pa], seq[pb] = a_words[i], b_words[j]
        return " ".join(seq), int(match)

    return model, tok, example


def _signal_data(tmp_path, example, shuffle_labels: bool = False) -> str:
    rng = random.Random(0)
    rows = [example(rng) for _ in range(384)]
    if shuffle_labels:  # the control: same sentences, labels unrelated to the match
        labels = [y for _, y in rows]
        random.Random(9).shuffle(labels)
        rows = [(text, y) for (text, _), y in zip(rows, labels, strict=True)]
    return _sst2_dir(tmp_path / f"signal-{int(shuffle_labels)}", rows)


SIGNAL_OPTS = dict(epochs=8, lr=3e-3, lambda_lr=0.05, progress=False)


def test_lambda_ranks_the_signal_head_last_and_baselines_do_not(tiny, tmp_path):
    from papa_surgery.calibration.average import calibrate

    model, tok, example = _signal_model(tiny)
    constants = calibrate(
        model, tok, [example(random.Random(1))[0] for _ in range(256)], max_length=SIGNAL_L, progress=False
    )
    data = _signal_data(tmp_path, example)
    ranking = rank_heads("lambda", model, tok, constants, task="sst2", data_dir=data, seed=0, **SIGNAL_OPTS)
    signal = list(SIGNAL)
    assert ranking.order[-1] == signal  # replaced last: the most input-dependent head
    scores = zip(map(tuple, ranking.order), ranking.scores, strict=True)
    logit = {k: torch.logit(torch.tensor(v)).item() for k, v in scores}
    assert ranking.scores[-1] > 0.95  # lambda ~ 1: the head keeps its attention
    assert logit[SIGNAL] - max(v for k, v in logit.items() if k != SIGNAL) > 1.0  # by a clear margin
    assert ranking.select(7 / 8) == sorted(h for h in ranking.order if h != signal)

    reversed_ = rank_heads("reversed-lambda", model, tok, constants, task="sst2", data_dir=data, seed=0, **SIGNAL_OPTS)
    assert reversed_.order[0] == signal and reversed_.order == ranking.order[::-1]  # replaced first
    assert reversed_.select(1 / 8) == [signal]
    random_ = rank_heads("random", model, seed=0)
    assert random_.order.index(signal) < 6  # the label plays no part: not near last

    # Control: with labels unrelated to the match, nothing singles the head out.
    control_data = _signal_data(tmp_path, example, shuffle_labels=True)
    control = rank_heads("lambda", model, tok, constants, task="sst2", data_dir=control_data, seed=0, **SIGNAL_OPTS)
    lam = dict(zip(map(tuple, control.order), control.scores, strict=True))
    assert control.order[-1] != signal and lam[SIGNAL] < 0.9


# ------------------------------------------------------------------------------------------- real model
@pytest.mark.real
@needs_shared_data("glue", "sst2", "train.tsv")
def test_minilm_lambda_ranking_on_real_sst2(minilm):
    from papa_surgery.calibration.average import calibrate
    from papa_surgery.tasks.data import load_split

    data = shared_data_dir()
    model, tok = minilm
    corpus = load_split("sst2", "eval", data, max_examples=128).texts
    constants = calibrate(model, tok, corpus, max_length=64, progress=False)
    ranking = train_lambdas(
        model, tok, constants, "sst2", data, epochs=1, max_train_examples=320, lr=1e-3, lambda_lr=0.05, progress=False
    )
    assert ranking.method == "lambda" and ranking.total == 6 * 12
    assert sorted(map(tuple, ranking.order)) == [(layer, head) for layer in range(6) for head in range(12)]
    assert ranking.scores == sorted(ranking.scores) and len(set(ranking.scores)) > 1
    assert all(0.0 < s < 1.0 for s in ranking.scores)
    assert ranking.provenance["steps"] == 10 and ranking.provenance["examples"] == 320
    assert ranking.provenance["source_model"] and "/" not in ranking.provenance["source_model"]  # no local paths


@pytest.mark.parametrize("model_type", ["roberta", "jina_embeddings_v3"])
def test_lambda_model_of_a_task_head_whose_encoder_has_no_pooler(tiny, model_type):
    """RoBERTa-style task heads build their encoder without a pooler; the lambda model still builds and runs."""
    src = tiny.model(model_type, head="AutoModelForSequenceClassification")
    assert src.base_model.pooler is None
    mixed = lambda_model(src, _constants(), tiny.tokenizer(model_type))
    batch = _inputs(tiny.tokenizer(model_type), pairs=False)
    assert _out(mixed, batch).shape[-1] == src.config.hidden_size


# ------------------------------------------------------------------- defaults that move, and an honest order
def test_defaults_move_the_lambdas_and_help_shows_them_with_the_cost():
    """The paper's lr (1e-4) with a CPU's budget left every lambda at 0.5 +- 0.01 and nothing said what a run costs."""
    from click.testing import CliRunner

    from papa_surgery.cli import main
    from papa_surgery.ranking.lambdas import LambdaOptions
    from papa_surgery.tasks.registry import get_task

    opts = LambdaOptions().resolved(get_task("sst2"))
    assert (opts.steps, opts.lambda_lr, opts.seeds, opts.lr, opts.batch_size) == (100, 1e-2, 2, 1e-4, 32)
    assert LambdaOptions(epochs=1).resolved(get_task("sst2")).steps is None  # epochs given: the epochs decide
    text = " ".join(CliRunner().invoke(main, ["rank", "--help"]).output.split())
    assert "--steps" in text and "Default 100: with 2 seeds, 200 forward and backward passes" in text
    assert "--lambda-lr" in text and "default 1e-2" in text and "--lambda-seeds" in text and "Default 2." in text


def test_seed_agreement_is_spearman_between_seeds_and_the_noise_beside_the_spread():
    from papa_surgery.ranking.lambdas import seed_agreement

    lam = torch.tensor([[0.1, 0.2, 0.3, 0.4], [0.5, 0.6, 0.7, 0.8]])  # (layers, heads)
    assert seed_agreement([lam, lam + 0.01])["seed_agreement"] == pytest.approx(1.0)
    assert seed_agreement([lam, -lam])["seed_agreement"] == pytest.approx(-1.0)
    facts = seed_agreement([lam, lam + 0.02])
    assert facts["noise"] == pytest.approx((0.02**2 / 2) ** 0.5, abs=1e-6)  # sd of two values 0.02 apart
    assert facts["spread"] == pytest.approx(float((lam + 0.01).flatten().double().std()), abs=1e-6)
    assert seed_agreement([lam]) == {"seed_agreement": None, "spread": pytest.approx(facts["spread"]), "noise": None}


@pytest.mark.parametrize("threshold", [-1.01, 1.01])
def test_two_seeds_are_averaged_and_a_disagreement_is_warned(tiny, tmp_path, monkeypatch, threshold):
    import warnings

    import papa_surgery.ranking.lambdas as lambdas

    src, tok = tiny.model("bert"), tiny.tokenizer("bert")
    data = _sst2_dir(tmp_path, _labelled(48, seed=2))
    monkeypatch.setattr(lambdas, "NOISY_AGREEMENT", threshold)  # every order is noise (1.01) or none is (-1.01)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ranking = train_lambdas(src, tok, _constants(), "sst2", data, steps=3, batch_size=8, seed=4, progress=False)
    noisy = [w for w in caught if issubclass(w.category, lambdas.LambdaNoiseWarning)]
    assert len(noisy) == (threshold > 1)
    if noisy:
        assert "seeds agree only" in str(noisy[0].message) and "steps=..., now 3 a seed" in str(noisy[0].message)
    prov = ranking.provenance
    assert prov["seeds"] == [4, 5] and prov["seed"] == 4 and prov["steps"] == 3 and prov["lambda_lr"] == 1e-2
    per_seed = torch.tensor(prov["lambdas_per_seed"])  # (seeds, layers * heads)
    assert per_seed.shape == (2, LAYERS * HEADS) and not torch.equal(per_seed[0], per_seed[1])
    mean = per_seed.mean(0).view(LAYERS, HEADS)
    assert ranking.scores == pytest.approx([float(mean[layer, head]) for layer, head in ranking.order], abs=2e-6)
    assert prov["seed_agreement"] == pytest.approx(lambdas.seed_agreement(list(per_seed))["seed_agreement"], abs=1e-3)
    one = train_lambdas(src, tok, _constants(), "sst2", data, steps=3, batch_size=8, seed=4, seeds=1, progress=False)
    assert one.provenance["seeds"] == [4] and one.provenance["seed_agreement"] is None
    assert torch.allclose(torch.tensor(one.provenance["lambdas_per_seed"][0]), per_seed[0], atol=1e-6)
