"""The probe on tiny local models: shapes, masking, reproducibility, PAPA slot counts, MLM and errors."""

from __future__ import annotations

import json
import os
import random

import pytest
import torch
from conftest import FAMILY_TYPES, make_constants
from metric_values import is_accuracy_of, is_f1_of

from papa_surgery.probing import SentenceProbe, TokenProbe, probe
from papa_surgery.probing.features import FeatureStore, backbone_of, encode_split
from papa_surgery.tasks.registry import CONLL_NER_LABELS

POSITIVE = ["charming", "fun", "astounding", "affecting", "good", "great"]
NEGATIVE = ["bleak", "desperate", "dull", "bad", "awful", "boring"]
FILLER = ["the", "a", "movie", "is", "and", "journey", "acting", "music", "ride", "."]


def _sentence(rng: random.Random) -> tuple[str, int]:
    label = rng.randrange(2)
    words = rng.choices(FILLER, k=rng.randrange(2, 14)) + [rng.choice(POSITIVE if label else NEGATIVE)]
    rng.shuffle(words)
    return " ".join(words), label


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory):
    """A local folder laid out like ../shared/data with small synthetic SST-2, MRPC, CoNLL and WikiText files."""
    root = tmp_path_factory.mktemp("probe-data")
    rng = random.Random(0)
    for name, n in (("train", 96), ("dev", 40)):
        rows = [_sentence(rng) for _ in range(n)]
        (root / "glue/sst2").mkdir(parents=True, exist_ok=True)
        (root / f"glue/sst2/{name}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s} \t{y}\n" for s, y in rows))
        pairs = [(_sentence(rng)[0], _sentence(rng)[0], rng.randrange(2)) for _ in range(n // 2)]
        (root / "glue/mrpc").mkdir(parents=True, exist_ok=True)
        head = "\ufeffQuality\t#1 ID\t#2 ID\t#1 String\t#2 String\n"
        body = "".join(f"{y}\t{i}\t{i + 1}\t{a}\t{b}\n" for i, (a, b, y) in enumerate(pairs))
        (root / f"glue/mrpc/{name}.tsv").write_text(head + body)
    (root / "conll2003").mkdir()
    for name, n in (("train", 48), ("valid", 16)):
        lines = ["-DOCSTART- -X- -X- O", ""]
        for _ in range(n):
            for w in rng.choices(FILLER + ["paris", "london"], k=rng.randrange(3, 10)):
                tag = "B-LOC" if w in ("paris", "london") else "O"
                lines.append(f"{w} NN O {tag}")
            lines.append("")
        (root / f"conll2003/{name}.txt").write_text("\n".join(lines))
    (root / "wikitext/wikitext-2").mkdir(parents=True)
    text = "\n".join(" ".join(rng.choices(FILLER + POSITIVE, k=12)) for _ in range(12))
    (root / "wikitext/wikitext-2/wiki.valid.tokens").write_text(" = Title = \n" + text + "\n")
    return root


QUICK = dict(epochs=2, progress=False, lr=1e-3)


# ------------------------------------------------------------------------------------------------- heads
def test_sentence_probe_padding_never_changes_a_prediction():
    torch.manual_seed(0)
    head = SentenceProbe(num_layers=3, hidden_size=8, max_length=16, num_labels=3).eval()
    assert torch.allclose(head.slot_weights, torch.full((3, 16), 1 / 16))
    with torch.no_grad():
        head.slot_weights.normal_()
    feats = torch.randn(2, 5, 3, 8)  # (B, N, Ly, H)
    slots = torch.tensor([[0, 1, 2, 3, 15], [0, 1, 15, -1, -1]])
    logits = head(feats, slots)  # (B, 3)
    assert logits.shape == (2, 3)
    padded = torch.cat([feats, 100 * torch.randn(2, 4, 3, 8)], dim=1)  # garbage in the padding
    padded_slots = torch.cat([slots, torch.full((2, 4), -1)], dim=1)
    padded[1, 3:5] = 100.0  # existing padding positions too
    assert torch.allclose(head(padded, padded_slots), logits, atol=1e-6)
    assert torch.allclose(head(feats[1:, :3], slots[1:, :3]), logits[1:], atol=1e-6)  # batch of one


def test_token_probe_padding_never_changes_a_prediction():
    torch.manual_seed(0)
    head = TokenProbe(num_layers=3, hidden_size=8, num_labels=5).eval()
    feats = torch.randn(2, 4, 3, 8)
    logits = head(feats)  # (B, N, 5)
    assert logits.shape == (2, 4, 5)
    padded = torch.cat([feats, torch.randn(2, 3, 3, 8)], dim=1)
    assert torch.allclose(head(padded)[:, :4], logits, atol=1e-6)
    assert torch.allclose(head(feats[:1]), logits[:1], atol=1e-6)


def test_features_do_not_depend_on_batch_composition(tiny_model, tiny_tokenizer):
    from conftest import SENTENCES

    model, tok = tiny_model("bert"), tiny_tokenizer("bert")
    enc = encode_split(tok, SENTENCES, [0, 1, 1, 0], "sentence", False, 32, tok.sep_token_id)
    cached = FeatureStore(model, enc, tok.pad_token_id, "cpu", cache_bytes=2**30, progress=False)
    streamed = FeatureStore(model, enc, tok.pad_token_id, "cpu", cache_bytes=0, progress=False)
    assert cached.cached and not streamed.cached
    torch.manual_seed(0)
    head = SentenceProbe(3, 32, 32, 2).eval()
    with torch.no_grad():
        head.slot_weights.normal_()
        together = head(*cached.batch([0, 1, 2, 3]))  # short examples padded next to the long one
        for i in range(4):
            alone = head(*cached.batch([i]))  # batch of one
            assert torch.allclose(alone[0], together[i], atol=1e-5)
            assert torch.allclose(head(*streamed.batch([i]))[0], alone[0], atol=1e-4)
        assert torch.equal(head(*streamed.batch([0, 1, 2, 3])).argmax(-1), together.argmax(-1))


def test_pair_slots_follow_the_layout(tiny_tokenizer):
    from conftest import PAIRS

    tok = tiny_tokenizer("bert")
    enc = encode_split(tok, PAIRS, [0, 1, 0], "sentence", True, 32, tok.sep_token_id)
    for ids, slots in zip(enc.ids, enc.slots, strict=True):
        assert int(slots[0]) == 0 and int(slots[-1]) == 31
        middle = (ids == tok.sep_token_id).nonzero()[0]
        assert int(slots[middle]) == 16


def test_token_labels_sit_on_first_subtokens(tiny_tokenizer):
    tok = tiny_tokenizer("bert")
    enc = encode_split(tok, [["a", "fun", "ride"]], [[0, 5, 0]], "token", False, 16, tok.sep_token_id)
    assert enc.labels[0].tolist() == [-100, 0, 5, 0, -100]  # [CLS] a fun ride [SEP]


# ------------------------------------------------------------------------------------------------- probe()
def test_probe_sentence_task_is_reproducible(tiny_model, tiny_tokenizer, data_dir):
    model, tok = tiny_model("bert"), tiny_tokenizer("bert")
    model.train()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    first = probe(model, tok, "sst2", data_dir=data_dir, seed=0, **QUICK)
    second = probe(model, tok, "sst2", data_dir=data_dir, seed=0, **QUICK)
    assert first["score"] == second["score"]
    assert {"task", "metric", "score", "examples", "steps", "seconds"} <= set(first)
    assert (first["task"], first["metric"], first["examples"], first["eval_examples"]) == ("sst2", "accuracy", 96, 40)
    assert first["steps"] == 2 * 3 and first["cached"] and first["max_length"] == 64
    assert model.training  # the caller's mode is restored
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the backbone is frozen
    json.dumps(first)  # a results line


def test_probe_pairs_token_tasks_and_streaming(tiny_model, tiny_tokenizer, data_dir):
    model, tok = tiny_model("roberta"), tiny_tokenizer("roberta")
    mrpc = probe(model, tok, "mrpc", data_dir=data_dir, max_length=48, max_train_examples=20, **QUICK)
    assert mrpc["metric"] == "f1" and mrpc["examples"] == 20 and mrpc["eval_examples"] == 20
    dev = (data_dir / "glue/mrpc/dev.tsv").read_text().splitlines()[1:]
    positives = sum(line.startswith("1\t") for line in dev)
    assert is_f1_of(mrpc["score"], gold=positives, most_predicted=len(dev)), mrpc["score"]  # F1 of the dev split
    bert, btok = tiny_model("bert"), tiny_tokenizer("bert")
    ner = probe(bert, btok, "ner", data_dir=data_dir, max_length=32, batch_size=8, **QUICK)
    assert ner["metric"] == "seqeval_f1" and ner["steps"] == 2 * 6
    valid = (data_dir / "conll2003/valid.txt").read_text().splitlines()
    entities = sum(line.endswith("B-LOC") for line in valid)
    words = sum(line.endswith((" O", "-LOC")) for line in valid)
    assert is_f1_of(ner["score"], gold=entities, most_predicted=words), ner["score"]  # entity F1 of the valid split
    cached = probe(bert, btok, "sst2", data_dir=data_dir, **QUICK)
    streamed = probe(bert, btok, "sst2", data_dir=data_dir, cache_gb=0, **QUICK)
    assert not streamed["cached"] and abs(streamed["score"] - cached["score"]) <= 0.05


def test_probe_papa_model_uses_its_slot_count(tiny_model, tiny_tokenizer, papa, data_dir):
    src, tok = tiny_model("bert"), tiny_tokenizer("bert")
    model = papa(src, [[0, 0], [1, 2]], max_length=48, sep_token_id=tok.sep_token_id)
    result = probe(model, tok, "sst2", data_dir=data_dir, **QUICK)
    assert result["max_length"] == 48
    with pytest.raises(ValueError, match="papa_max_length=48"):
        probe(model, tok, "sst2", data_dir=data_dir, max_length=64, **QUICK)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_a_converted_task_head_model_probes_its_encoder_with_slots(model_type, tiny_model, tiny_tokenizer, papa):
    """The probe reads a task-head PAPA model's encoder (its base_model computes no slots) through
    ``papa_base_forward``: the same hidden states as the whole model's forward."""
    src, tok = tiny_model(model_type, head="AutoModelForSequenceClassification"), tiny_tokenizer(model_type)
    layers, heads = src.config.num_hidden_layers, src.config.num_attention_heads
    model = papa(src, [[0, 0], [layers - 1, heads - 1]], make_constants("random", layers, heads, 32), max_length=32)
    enc = tok(["the movie is good", "a dull and boring ride ."], padding=True, return_tensors="pt")
    encoder = backbone_of(model)
    with torch.no_grad():
        ours = encoder(**enc, output_hidden_states=True, return_dict=True).hidden_states
        full = model(**enc, output_hidden_states=True).hidden_states
    assert len(ours) == len(full) == layers + 1
    for a, b in zip(ours, full, strict=True):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_mlm(tiny_model, tiny_tokenizer, data_dir):
    tok = tiny_tokenizer("bert")
    with pytest.raises(ValueError, match="needs a model with a masked-LM head"):
        probe(tiny_model("bert"), tok, "mlm", data_dir=data_dir, progress=False)
    mlm = tiny_model("bert", head="AutoModelForMaskedLM")
    result = probe(mlm, tok, "mlm", data_dir=data_dir, progress=False, max_length=32)
    assert result["metric"] == "neg_log_perplexity" and result["masked_tokens"] > 0
    assert result["score"] < 0 and result["perplexity"] == pytest.approx(torch.tensor(-result["score"]).exp().item())
    assert probe(mlm, tok, "mlm", data_dir=data_dir, progress=False, max_length=32)["score"] == result["score"]


def test_probe_bad_inputs(tiny_model, tiny_tokenizer, data_dir, tmp_path):
    model, tok = tiny_model("bert"), tiny_tokenizer("bert")
    with pytest.raises(ValueError, match="did you mean 'sst2'"):
        probe(model, tok, "sst-3", data_dir=data_dir)
    with pytest.raises(ValueError, match="'eval' split is missing"):
        probe(model, tok, "cola", data_dir=data_dir)
    (tmp_path / "glue/sst2").mkdir(parents=True)
    (tmp_path / "glue/sst2/train.tsv").write_text("sentence\tlabel\na\t0\n")
    (tmp_path / "glue/sst2/dev.tsv").write_text("sentence\tlabel\na\tpositive\nb\t7\n")
    with pytest.raises(ValueError, match="label 7 is outside the label set"):
        probe(model, tok, "sst2", data_dir=tmp_path)
    assert len(CONLL_NER_LABELS) == 9


# ------------------------------------------------------------------------------------------------- distributed
def _ddp_worker(rank: int, world: int, folder: str, data_dir: str, port: int, out: str) -> None:
    import torch.distributed as dist
    from transformers import AutoModel, AutoTokenizer

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
        result = probe(model, tok, "sst2", data_dir=data_dir, **QUICK)
        with open(f"{out}.{rank}", "w") as f:
            json.dump(result["score"], f)
    finally:
        dist.destroy_process_group()


@pytest.mark.slow  # slow tier: two processes
def test_two_process_data_parallel_matches_one_process(tiny_folder, data_dir, tmp_path):
    import socket

    import torch.multiprocessing as mp
    from transformers import AutoModel, AutoTokenizer

    folder = tiny_folder("bert")
    single = probe(AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder), "sst2",
                   data_dir=data_dir, **QUICK)  # fmt: skip
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = str(tmp_path / "score")
    mp.spawn(_ddp_worker, args=(2, str(folder), str(data_dir), port, out), nprocs=2, join=True)
    scores = [json.loads(open(f"{out}.{r}").read()) for r in range(2)]
    assert scores == [single["score"], single["score"]]


def test_feature_cache_reuses_splits_across_seeds(tiny_model, tiny_tokenizer, data_dir):
    from papa_surgery.probing import FeatureCache

    model, tok = tiny_model("bert"), tiny_tokenizer("bert")
    cache = FeatureCache()
    fresh = probe(model, tok, "sst2", data_dir=data_dir, seed=1, **QUICK)
    first = probe(model, tok, "sst2", data_dir=data_dir, seed=1, reuse=cache, **QUICK)
    probe(model, tok, "sst2", data_dir=data_dir, seed=2, reuse=cache, **QUICK)
    assert first["score"] == fresh["score"] and len(cache._stores) == 2  # train + eval, computed once
    assert cache.get(tiny_model("bert"), next(iter(cache._stores))[1]) is None  # another model: no reuse


def test_pseudo_perplexity_masks_one_token_at_a_time(tiny_model, tiny_tokenizer):
    """masked_nll('pseudo') equals scoring each token with only that token masked, by hand."""
    from papa_surgery.probing.features import Encoded
    from papa_surgery.probing.mlm import masked_nll

    tok = tiny_tokenizer("bert")
    model = tiny_model("bert", head="AutoModelForMaskedLM")
    texts = ["the movie is good", "a dull ride"]
    encs = [tok(t, return_tensors="pt")["input_ids"][0] for t in texts]
    enc = Encoded(ids=encs, type_ids=None, slots=[torch.arange(len(x)) for x in encs], labels=[0, 0])
    total, count = masked_nll(model, tok, enc, seed=0, batch_size=3, device="cpu", progress=False)
    want, n = 0.0, 0
    with torch.no_grad():
        for ids in encs:
            for p in range(1, len(ids) - 1):  # every token but [CLS] and [SEP]
                masked = ids.clone()
                masked[p] = tok.mask_token_id
                logp = model(input_ids=masked[None]).logits[0, p].log_softmax(-1)
                want -= float(logp[ids[p]])
                n += 1
    assert count == n
    assert total == pytest.approx(want, rel=1e-5)


def test_probe_beats_chance_on_a_learnable_task_and_not_on_shuffled_labels(tiny_model, tiny_tokenizer, tmp_path):
    """The label is one sentiment word among 1-4 fillers: even a random encoder's hidden states carry it, so the
    probe must learn it; the same sentences with shuffled labels leave it near the majority baseline."""

    def sentence(rng: random.Random) -> tuple[str, int]:
        label = rng.randrange(2)
        words = rng.choices(FILLER, k=rng.randrange(1, 5)) + [rng.choice(POSITIVE if label else NEGATIVE)]
        rng.shuffle(words)
        return " ".join(words), label

    rng = random.Random(1)
    rows = {"train": [sentence(rng) for _ in range(160)], "dev": [sentence(rng) for _ in range(64)]}
    shuffled = [y for _, y in rows["train"]]
    rng.shuffle(shuffled)
    for root, train_labels in ((tmp_path / "real", None), (tmp_path / "shuffled", shuffled)):
        (root / "glue/sst2").mkdir(parents=True)
        for name, split in rows.items():
            labels = train_labels if name == "train" and train_labels else [y for _, y in split]
            text = "".join(f"{s}\t{y}\n" for (s, _), y in zip(split, labels, strict=True))
            (root / f"glue/sst2/{name}.tsv").write_text("sentence\tlabel\n" + text)
    majority = max(sum(y for _, y in rows["dev"]), sum(1 - y for _, y in rows["dev"])) / len(rows["dev"])
    model, tok = tiny_model("bert"), tiny_tokenizer("bert")
    options = dict(epochs=20, lr=1e-2, batch_size=16, max_length=16, progress=False)
    learnt = probe(model, tok, "sst2", data_dir=tmp_path / "real", **options)
    control = probe(model, tok, "sst2", data_dir=tmp_path / "shuffled", **options)
    assert learnt["eval_examples"] == 64 and is_accuracy_of(learnt["score"], 64)
    assert learnt["score"] >= majority + 0.3, (learnt["score"], majority)
    assert control["score"] <= majority + 0.15 < learnt["score"], (control["score"], majority)
