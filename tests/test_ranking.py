"""Head rankings: label-free orders, the Ranking file, fractions, conversion from a ranking, bad input."""

from __future__ import annotations

import json
import random

import pytest
import torch
from conftest import SENTENCES, make_constants

from papa_surgery.calibration.constants import Constants
from papa_surgery.calibration.encoding import encode
from papa_surgery.conversion.surgery import constant_heads_of, convert
from papa_surgery.ranking.methods import label_free_ranking, rank_heads
from papa_surgery.ranking.order import Ranking, order_by_scores, reversed_ranking
from papa_surgery.registry import LABEL_FREE_METHODS, METHODS, check_method

LAYERS, HEADS, L = 2, 4, 32
EVERY = [[layer, head] for layer in range(LAYERS) for head in range(HEADS)]


pytestmark = pytest.mark.usefixtures("one_thread")  # conftest: tiny models run on one thread


def _constants(variance=None) -> Constants:
    return Constants(make_constants("random", LAYERS, HEADS, L), "average", L, variance=variance)


def _sst2(tmp_path, n: int = 32) -> str:
    rng = random.Random(0)
    rows = [
        (" ".join(rng.choices(["the", "fun", "bleak", "movie", "a"], k=rng.randrange(2, 8))), i % 2) for i in range(n)
    ]
    (tmp_path / "glue/sst2").mkdir(parents=True, exist_ok=True)
    (tmp_path / "glue/sst2/train.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    return str(tmp_path)


# ------------------------------------------------------------------------------------------- label-free
def test_layer_orders_keep_in_layer_head_order(tiny):
    model = tiny.model("bert")
    first = rank_heads("first-to-last", model)
    last = rank_heads("last-to-first", model)
    assert first.order == EVERY
    assert last.order == [[1, 0], [1, 1], [1, 2], [1, 3], [0, 0], [0, 1], [0, 2], [0, 3]]
    assert first.scores is None and first.provenance["task"] is None


def test_random_is_seeded(tiny):
    model = tiny.model("distilbert")
    a, b, c = (
        rank_heads("random", model, seed=0),
        rank_heads("random", model, seed=0),
        rank_heads("random", model, seed=1),
    )
    assert a.order == b.order and a.order != c.order
    assert sorted(a.order) == EVERY and a.provenance["seed"] == 0


def test_variance_ranks_lowest_first_with_deterministic_ties(tiny):
    variance = torch.tensor([[0.3, 0.1, 0.2, 0.1], [0.1, 0.5, 0.0, 0.2]], dtype=torch.float64)
    ranking = rank_heads("variance", tiny.model("mpnet"), constants=_constants(variance))
    assert ranking.order == [[1, 2], [0, 1], [0, 3], [1, 0], [0, 2], [1, 3], [0, 0], [1, 1]]
    assert ranking.scores == sorted(ranking.scores)
    assert order_by_scores([[1.0, 1.0], [1.0, 0.5]], ascending=False)[0] == [[0, 0], [0, 1], [1, 0], [1, 1]]


def test_reversed_ranking_reads_from_the_top():
    base = Ranking("lambda", EVERY, LAYERS, HEADS, [i / 10 for i in range(8)], {"task": "sst2", "seed": 3})
    rev = reversed_ranking(base)
    assert rev.method == "reversed-lambda" and rev.order == EVERY[::-1] and rev.scores == base.scores[::-1]
    assert rev.provenance["task"] == "sst2" and rev.provenance["reversed_from"] == "lambda"
    assert rev.select(0.25) == [[1, 2], [1, 3]]


# --------------------------------------------------------------------------------- files and fractions
def test_ranking_round_trips_through_json(tmp_path):
    prov = {"task": "sst2", "data": "train.tsv", "seed": 4, "steps": 12, "source_model": "tiny"}
    scores = [0.1, 0.2, 0.25, 0.3, 0.5, 0.6, 0.7, 0.9]
    ranking = Ranking("lambda", [[1, 3], [0, 0], [0, 2], [1, 1], [0, 1], [1, 0], [0, 3], [1, 2]], 2, 4, scores, prov)
    path = ranking.save(tmp_path / "sub" / "ranking.json")
    data = json.loads(path.read_text())
    assert data["format"] == "papa-ranking" and data["order"][0] == [1, 3] and data["provenance"]["steps"] == 12
    loaded = Ranking.load(path)
    assert loaded == ranking
    assert [loaded.select(f) for f in (0, 0.25, 0.5, 1)] == [ranking.select(f) for f in (0, 0.25, 0.5, 1)]


def test_fractions_pick_the_first_heads():
    ranking = Ranking("random", [[1, 3], [0, 0], [0, 2], [1, 1], [0, 1], [1, 0], [0, 3], [1, 2]], 2, 4)
    assert ranking.select(0) == [] and ranking.select(0.0) == []
    assert ranking.select(1) == EVERY
    assert ranking.select(0.25) == [[0, 0], [1, 3]]  # the first two, sorted by (layer, head)
    assert ranking.count(0.5) == 4 and ranking.count(1 / 16) == 1 and ranking.count(0.05) == 0  # round half up
    for bad in (-0.1, 1.5, float("nan")):
        with pytest.raises(ValueError, match="between 0 and 1"):
            ranking.select(bad)


@pytest.mark.parametrize("model_type", ["bert", "deberta"])
def test_convert_from_a_ranking_file_reproduces_the_heads(tiny, tmp_path, model_type):
    src, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    constants = _constants()
    ranking = rank_heads("random", src, seed=5)
    path = ranking.save(tmp_path / "ranking.json")
    batch = encode(tok, SENTENCES, L)
    mask = batch["attention_mask"].bool()
    with torch.no_grad():
        source_out = src(**batch).last_hidden_state[mask]
    for fraction in (0.0, 0.5, 1.0):
        loaded = Ranking.load(path)
        loaded.check_compatible(src.config)
        heads = loaded.select(fraction)
        papa = convert(src, constants, heads, tokenizer=tok, method=loaded.method, fraction=fraction)
        assert constant_heads_of(papa) == ranking.select(fraction) == papa.config.papa_constant_heads
        assert papa.config.papa_method == "random" and papa.config.papa_fraction == fraction
        assert len(heads) == {0.0: 0, 0.5: 4, 1.0: 8}[fraction]
        with torch.no_grad():
            out = papa(**batch).last_hidden_state[mask]
        if fraction == 0:
            assert (out - source_out).abs().max() <= 1e-5  # no constant heads: the source exactly


def test_rank_heads_lambda_and_reversed_agree(tiny, tmp_path):
    src, tok = tiny.model("electra"), tiny.tokenizer("electra")
    data = _sst2(tmp_path)
    opts = dict(steps=3, batch_size=8, lr=1e-2, lambda_lr=0.1, progress=False)
    lam = rank_heads("lambda", src, tok, _constants(), task="sst2", data_dir=data, seed=2, **opts)
    rev = rank_heads("reversed-lambda", src, tok, _constants(), task="sst2", data_dir=data, seed=2, **opts)
    assert lam.method == "lambda" and rev.method == "reversed-lambda"
    assert rev.order == lam.order[::-1] and rev.scores == lam.scores[::-1]
    for key in ("task", "data", "seed", "steps", "source_model", "papa_surgery_version"):
        assert key in lam.provenance
    assert lam.provenance["steps"] == 3 and lam.provenance["seed"] == 2 and lam.provenance["task"] == "sst2"


# ------------------------------------------------------------------------------------------- bad input
def test_ranking_for_another_shape_is_refused(tiny):
    ranking = Ranking("first-to-last", [[layer, head] for layer in range(3) for head in range(4)], 3, 4)
    with pytest.raises(ValueError, match="3 layers x 4 heads but the model has 2 x 4"):
        ranking.check_compatible(tiny.model("bert").config)
    with pytest.raises(ValueError, match="every one of the 8 heads"):
        Ranking("random", EVERY[:-1], 2, 4)
    with pytest.raises(ValueError, match="every one of the 8 heads"):
        Ranking("random", EVERY[:-1] + [[0, 0]], 2, 4)


def test_unknown_method_gets_a_suggestion(tiny):
    with pytest.raises(ValueError, match="(?i)did you mean 'lambda'"):
        rank_heads("lamda", tiny.model("bert"))
    with pytest.raises(ValueError, match="(?i)did you mean 'first-to-last'"):
        check_method("first_to_last")
    with pytest.raises(ValueError, match="choose one of"):
        check_method("zzz")
    assert set(LABEL_FREE_METHODS) < set(METHODS)


@pytest.mark.parametrize("method", ["lambda", "reversed-lambda"])
def test_lambda_without_task_or_constants_is_refused(tiny, method):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with pytest.raises(ValueError, match="pass task="):
        rank_heads(method, model, tok, _constants())
    with pytest.raises(ValueError, match="pass task="):
        check_method(method)  # before any calibration
    assert check_method(method, "sst2").name == method and check_method("variance").name == "variance"
    with pytest.raises(ValueError, match="pass constants="):
        rank_heads(method, model, tok, None, task="sst2")
    with pytest.raises(ValueError, match="unknown task"):
        rank_heads(method, model, tok, _constants(), task="sst3", steps=1)


def test_other_bad_inputs(tiny, tmp_path):
    model = tiny.model("bert")
    with pytest.raises(ValueError, match="variance"):
        rank_heads("variance", model)  # no constants
    with pytest.raises(ValueError, match="variance"):
        label_free_ranking("variance", LAYERS, HEADS, constants=_constants())  # data-free: no variance
    wrong = Constants(make_constants("random", 3, HEADS, L), "average", L, variance=torch.zeros(3, HEADS))
    with pytest.raises(ValueError, match="3 layers x 4 heads but the model has 2 x 4"):
        rank_heads("variance", model, constants=wrong)
    # Lambda options are ignored by label-free methods (a caller passes one option set to every method).
    assert (
        rank_heads("random", model, seed=1, steps=10, progress=False).order == rank_heads("random", model, seed=1).order
    )
    with pytest.raises(FileNotFoundError, match="does not exist"):
        Ranking.load(tmp_path / "missing.json")
    (tmp_path / "other.json").write_text(json.dumps({"order": []}))
    with pytest.raises(ValueError, match="not a papa-surgery ranking"):
        Ranking.load(tmp_path / "other.json")
    (tmp_path / "broken.json").write_text("{")
    with pytest.raises(ValueError, match="not JSON"):
        Ranking.load(tmp_path / "broken.json")


def test_a_task_given_to_a_ranking_that_reads_none_is_refused(tiny_folder, tmp_path):
    """``--task sst2 --method variance`` ranked by variance and ignored the task silently: refused on the command line
    (rank, convert) and in Python, naming the learned methods; nothing is written."""
    from click.testing import CliRunner

    import papa_surgery
    from papa_surgery.calibration import Constants
    from papa_surgery.cli import main

    src = str(tiny_folder("bert"))
    for command in ("rank", "convert"):
        out = tmp_path / f"{command}-out"
        fraction = ["--fraction", "0.5"] if command == "convert" else []
        args = [
            command,
            src,
            *fraction,
            "--method",
            "variance",
            "--task",
            "sst2",
            "--max-length",
            "16",
            "--out",
            str(out),
        ]
        result = CliRunner().invoke(main, args)
        said = " ".join(result.output.split())
        assert result.exit_code == 2 and "'--task'" in said and "reads no labelled task" in said, said
        assert "lambda" in said and not out.exists()
    result = CliRunner().invoke(main, ["rank", "no-such/model", "--method", "variance", "--task", "sst2", "--out", "r"])
    assert result.exit_code == 2 and "'--task'" in result.output, result.output  # before the model is looked for
    with pytest.raises(ValueError, match="reads no labelled task: drop task="):
        papa_surgery.rank("variance", constants=Constants.from_kind("identity", 2, 4, 16), task="sst2")
