"""The ``sensitivity`` ranking (issue 32): each head made constant alone, scored by how far the sentence embeddings
move on an unlabelled corpus, least first.

What it must be: each head's score is what converting that head alone does (the fast path, the lambda-mixed model
run from the head's layer up, against ``convert``); the order is the scores' ascending; the source is untouched; it
is reachable from the API, ``rank`` and ``convert`` on the command line (the recipe names it) and refuses what it
cannot do, naming the fix.
"""

from __future__ import annotations

import json

import pytest
import torch
from conftest import FAMILY_TYPES, SENTENCES, cli

import papa_surgery
from papa_surgery.calibration.encoding import encode, model_inputs
from papa_surgery.healing.agreement import mean_pooled
from papa_surgery.ranking.order import Ranking
from papa_surgery.ranking.sensitivity import SLACK, _snug_batches

pytestmark = pytest.mark.usefixtures("one_thread")
L = 32


@torch.no_grad()
def _moved_by_converting(model, tok, constants, head, texts, pool=mean_pooled) -> float:
    """The reference: mean 1 - cos of the ``pool``ed last hidden states, ``head`` alone made constant by ``convert``."""
    others = [[la, h] for la in range(constants.num_layers) for h in range(constants.num_heads) if [la, h] != head]
    order = Ranking("manual", [head, *others], constants.num_layers, constants.num_heads)
    papa = papa_surgery.convert(model, constants, order, 1 / order.total, tokenizer=tok, storage="dense").eval()
    enc = encode(tok, texts, constants.max_length, pairs=False)
    inputs = model_inputs(model, enc)
    mask = inputs["attention_mask"]
    ours = pool(papa(**inputs).last_hidden_state.float(), mask)
    theirs = pool(model(**inputs).last_hidden_state.float(), mask)
    return float((1 - torch.nn.functional.cosine_similarity(ours, theirs, dim=-1)).mean())


# 9 texts of several lengths: in batches of at most 2, the layers below a head return what they returned on each of
# at least 5 batches (test_batches_are_snug)
TEXTS = [*SENTENCES, *(" ".join(reversed(s.split())) for s in SENTENCES), f"{SENTENCES[0]} {SENTENCES[1]}"]


@pytest.mark.parametrize("model_type", ["bert", "modernbert"] if "modernbert" in FAMILY_TYPES else ["bert"])
def test_each_heads_score_is_what_converting_that_head_alone_does(tiny, model_type):
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    average = papa_surgery.calibrate(model, tok, SENTENCES * 3, max_length=L, progress=False)
    ranking = papa_surgery.rank(
        "sensitivity", model, tok, constants=average, corpus=TEXTS, batch_size=2, progress=False
    )
    assert ranking.method == "sensitivity" and ranking.total == average.num_layers * average.num_heads
    assert ranking.scores == sorted(ranking.scores) and len(set(ranking.scores)) > 1
    assert ranking.provenance["examples"] == len(TEXTS) and ranking.provenance["constants_kind"] == "average"
    scored = {tuple(head): score for head, score in zip(ranking.order, ranking.scores, strict=True)}
    last = average.num_layers - 1
    for head in ([0, 0], [0, average.num_heads - 1], [last // 2, 1], [last, 0], [last, average.num_heads - 1]):
        expected = _moved_by_converting(model, tok, average, head, TEXTS)
        assert scored[tuple(head)] == pytest.approx(expected, rel=1e-3, abs=1e-6), head
    assert all(torch.equal(v, model.state_dict()[k]) for k, v in before.items())  # the source untouched
    batched = papa_surgery.rank("sensitivity", model, tok, constants=average, corpus=TEXTS, progress=False)
    assert batched.scores == pytest.approx(ranking.scores, rel=1e-4, abs=1e-7)  # batching changes nothing


def test_a_sentence_transformers_source_is_measured_by_its_own_pooling(tiny, tmp_path):
    """The embeddings compared are the ones the source's sentence-transformers files make (CLS pooling here), not a
    mean of its tokens; the ranking file says which."""
    from transformers import AutoModel, AutoTokenizer

    folder = tiny.save("bert", tmp_path / "st")
    (folder / "modules.json").write_text(
        json.dumps(
            [
                {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
                {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            ]
        )
    )
    (folder / "1_Pooling").mkdir()
    (folder / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_cls_token": True}))
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    average = papa_surgery.calibrate(model, tok, SENTENCES * 3, max_length=L, progress=False)
    ranking = papa_surgery.rank("sensitivity", model, tok, constants=average, corpus=TEXTS, progress=False)
    assert ranking.provenance["embedding"] == "cls pooling (the sentence-transformers files of st)"
    scored = {tuple(head): score for head, score in zip(ranking.order, ranking.scores, strict=True)}

    def cls(hidden, mask):
        return hidden[:, 0]  # (B, D): right padding, the first token is [CLS]

    for head in ([0, 0], [average.num_layers - 1, 1]):
        expected = _moved_by_converting(model, tok, average, head, TEXTS, pool=cls)
        assert scored[tuple(head)] == pytest.approx(expected, rel=1e-3, abs=1e-6), head
        by_mean = _moved_by_converting(model, tok, average, head, TEXTS)
        assert scored[tuple(head)] != pytest.approx(by_mean, rel=1e-2), head  # the pooling decides
    plain = tiny.model("bert")  # not loaded from the folder: no pipeline, mean pooling, said so
    meaned = papa_surgery.rank("sensitivity", plain, tok, constants=average, corpus=TEXTS, progress=False)
    assert meaned.provenance["embedding"].startswith("mean pooling")


def test_batches_are_snug(tiny):
    """Every example once, shortest first, at most batch_size per batch, and a batch of several pads to at most
    SLACK times its real tokens (a lone long example makes its own batch)."""
    tok = tiny.tokenizer("bert")
    average = papa_surgery.calibrate(tiny.model("bert"), tok, SENTENCES * 3, max_length=L, progress=False)
    texts = [*TEXTS, SENTENCES[0]]  # an example twice: both copies kept

    def length(text):
        return encode(tok, [text], L)["input_ids"].shape[1]

    for size in (2, 4, 16):
        batches = _snug_batches(tok, texts, average, size)
        flat = [t for b in batches for t in b]
        assert sorted(flat) == sorted(texts) and [length(t) for t in flat] == sorted(map(length, texts))
        assert all(1 <= len(b) <= size for b in batches)
        assert all(len(b) * max(map(length, b)) <= SLACK * sum(map(length, b)) for b in batches if len(b) > 1)
        assert len(batches) >= (5 if size == 2 else 2)  # several batches: the layers below are kept per batch


def test_a_source_with_a_task_head_is_measured_on_its_encoder(tiny):
    headed, tok = tiny.model("bert", head="AutoModelForMaskedLM"), tiny.tokenizer("bert")
    average = papa_surgery.calibrate(headed.base_model, tok, SENTENCES * 3, max_length=L, progress=False)
    with_head = papa_surgery.rank("sensitivity", headed, tok, constants=average, corpus=TEXTS, progress=False)
    bare = papa_surgery.rank("sensitivity", headed.base_model, tok, constants=average, corpus=TEXTS, progress=False)
    assert with_head.order == bare.order and with_head.scores == pytest.approx(bare.scores, rel=1e-5, abs=1e-8)


def test_the_api_refuses_what_the_ranking_cannot_do(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    average = papa_surgery.calibrate(model, tok, SENTENCES, max_length=L, progress=False)
    with pytest.raises(ValueError, match="runs the model: pass the model and its tokenizer"):
        papa_surgery.rank("sensitivity", constants=average)
    assert papa_surgery.rank("sensitivity", model, tok, constants=average, corpus=SENTENCES, progress=False).total
    toeplitz = papa_surgery.calibrate(model, tok, kind="toeplitz", max_length=L, progress=False)
    with pytest.raises(ValueError, match="reads average constants"):
        papa_surgery.rank("sensitivity", model, tok, constants=toeplitz, corpus=SENTENCES)
    with pytest.raises(TypeError, match="tokenizer"):
        papa_surgery.rank("sensitivity", model, constants=average, corpus=SENTENCES)


def test_constants_of_sentence_pairs(source, tmp_path):
    """Pairs constants: convert's default ranks by variance (no corpus of pairs to run on); ``--method sensitivity``
    without a corpus of pairs is refused, naming --corpus; with one it runs on the pairs."""
    pairs = tmp_path / "pairs.txt"
    pairs.write_text("".join(f"{a}\t{b}\n" for a, b in zip(SENTENCES, reversed(SENTENCES), strict=True)) * 3)
    consts = tmp_path / "pairs.safetensors"
    made = cli("calibrate", source, "--corpus", pairs, "--pairs", "--max-length", 32, "--out", consts)
    assert made.exit_code == 0, made.output
    result = cli("convert", source, "--fraction", 0.5, "--constants", consts, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    assert json.loads((tmp_path / "ckpt" / "config.json").read_text())["papa_method"] == "variance"
    refused = cli("rank", source, "--method", "sensitivity", "--constants", consts, "--out", tmp_path / "r.json")
    assert refused.exit_code == 2 and "--corpus" in refused.output and "pairs" in refused.output, refused.output
    args = ("--method", "sensitivity", "--constants", consts, "--corpus", pairs, "--out", tmp_path / "r.json")
    ranked = cli("rank", source, *args)
    assert ranked.exit_code == 0, ranked.output
    assert Ranking.load(tmp_path / "r.json").provenance["examples"] == 12


def test_rank_and_convert_on_the_command_line(source, corpus, tmp_path):
    out = tmp_path / "sensitivity.json"
    result = cli("rank", source, "--method", "sensitivity", "--corpus", corpus, "--max-length", 16, "--out", out)
    assert result.exit_code == 0, result.output
    ranking = Ranking.load(out)
    assert ranking.method == "sensitivity" and ranking.provenance["examples"] == 12
    assert ranking.provenance["corpus"] and ranking.scores == sorted(ranking.scores)
    ckpt = tmp_path / "ckpt"
    result = cli(
        "convert", source, "--fraction", 0.5, "--kind", "average", "--method", "sensitivity", "--corpus", corpus,
        "--max-length", 16, "--out", ckpt,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    config = json.loads((ckpt / "config.json").read_text())
    assert config["papa_method"] == "sensitivity"
    assert sorted(map(tuple, config["papa_constant_heads"])) == sorted(map(tuple, ranking.select(0.5)))
    # with calibrated constants the corpus is still read (the ranking runs the model on it), so it is not refused
    consts, again = tmp_path / "c.safetensors", tmp_path / "again.json"
    assert cli("calibrate", source, "--corpus", corpus, "--max-length", 16, "--out", consts).exit_code == 0
    result = cli("rank", source, "--method", "sensitivity", "--constants", consts, "--corpus", corpus, "--out", again)
    assert result.exit_code == 0, result.output
    assert Ranking.load(again).order == ranking.order
