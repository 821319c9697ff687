"""Sharpened constants (issue 32): the average with an exponent per layer fitted to the source, label-free.

What it must be: the average's matrices raised, per layer, to the exponent it fitted (the heads not made constant
untouched); closer to the source than the average on held-out text by its own objective; the source at fraction 0;
and, through the command line, a checkpoint that loads in a fresh process without the library and computes what
the in-memory model computes.
"""

from __future__ import annotations

import json
import warnings

import pytest
import torch
from conftest import FAMILY_TYPES, SENTENCES, cli
from test_checkpoint import LOADER, fresh_python, loader_job

import papa_surgery
from papa_surgery import registry
from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.coverage import CoverageWarning
from papa_surgery.healing.distillation import distillation_loss
from papa_surgery.healing.sharpness import sharpen, sharpened_values

pytestmark = pytest.mark.usefixtures("one_thread")

L = 32
HEADS = [[0, 0], [0, 1], [0, 2], [0, 3], [1, 0], [1, 1], [1, 2], [1, 3]]  # every head of the tiny BERT


def _texts():
    """The fitting text and held-out text of another make: the test sentences, and their words shuffled apart."""
    g = torch.Generator().manual_seed(0)
    words = " ".join(SENTENCES).split()
    picks = [torch.randint(0, len(words), (n,), generator=g) for n in (6, 9, 14) * 6]
    held_out = [" ".join(words[int(i)] for i in pick) for pick in picks]
    return list(SENTENCES), held_out


def _rows(matrix: torch.Tensor) -> torch.Tensor:
    """``matrix`` with rows summing to 1, as the runtime uses a constant (the stored scale of a row is free)."""
    matrix = matrix.double()
    return matrix / matrix.sum(-1, keepdim=True)


@pytest.fixture(scope="module")
def average(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        return calibrate(model, tok, _texts()[0], max_length=L, progress=False)


@pytest.fixture(scope="module")
def sharpened(tiny, average):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    return sharpen(model, tok, _texts()[0], average, HEADS, search="walk", batch_size=4, progress=False)


def test_the_average_raised_to_each_layers_fitted_exponent(tiny, average, sharpened):
    info = sharpened.metadata["sharpened"]
    exponents = {int(layer): p for layer, p in info["exponents"].items()}
    assert sharpened.kind == "sharpened" and info["from_kind"] == "average" and info["heads"] == HEADS
    assert set(exponents) == {0, 1} and all(p in info["grid"] for p in exponents.values()) and 1.0 in info["grid"]
    assert torch.equal(sharpened.values, sharpened_values(average, exponents, HEADS))
    assert info["loss_sharpened"] <= info["loss_average"]  # p = 1 is a candidate: never worse on the fitting text
    # The formula: each constant head's matrix raised to its layer's exponent, the other heads untouched.
    some = [[0, 1], [1, 3]]
    raised = sharpened_values(average, {0: 2.0, 1: 1.5}, some)
    assert torch.allclose(_rows(raised[0, 1]), _rows(average.values[0, 1].double().pow(2)), rtol=1e-6, atol=0)
    assert torch.allclose(_rows(raised[1, 3]), _rows(average.values[1, 3].double().pow(1.5)), rtol=1e-6, atol=0)
    assert torch.equal(raised[0, 0], average.values[0, 0]) and torch.equal(raised[1, 2], average.values[1, 2])


def test_each_layer_keeps_the_exponent_that_brings_it_closest(tiny, average, monkeypatch):
    """Greedy from the first layer up: a layer is scored with the layers below at their chosen exponents, and keeps
    its best; the constants returned are the average raised to those exponents."""
    from papa_surgery.healing import sharpness
    from papa_surgery.hub_code.modeling_papa import attention_modules

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    best = {1: 2.0, 2: 0.75}  # hidden states after layer 0 are closest at p = 2, after layer 1 at p = 0.75
    in_force, below = {}, []
    real_set = sharpness._set

    def set_exponent(module, start, p):
        in_force[id(module)] = p
        real_set(module, start, p)

    def objective(papa, batches, first=1, skip=((), None)):
        if first == 1 and not in_force:  # the whole objective, before any layer is fitted
            return 1.0
        current = [in_force.get(id(m), 1.0) for m in attention_modules(papa)]
        if first == 2:
            below.append(current[0])
        return abs(current[first - 1] - best[first])

    monkeypatch.setattr(sharpness, "_set", set_exponent)
    monkeypatch.setattr(sharpness, "_objective", objective)
    fitted = sharpen(model, tok, _texts()[0], average, HEADS, search="walk", batch_size=4, progress=False)
    assert fitted.metadata["sharpened"]["exponents"] == {"0": 2.0, "1": 0.75}
    assert below and set(below) == {2.0}  # layer 1 was scored with layer 0 at its choice
    assert torch.equal(fitted.values, sharpened_values(average, {0: 2.0, 1: 0.75}, HEADS))


@pytest.mark.slow
@pytest.mark.real
def test_closer_to_the_source_than_the_average_on_held_out_text(minilm):
    """On the real all-MiniLM-L6-v2, every head constant: fitted on lines of the bundled excerpt, the sharpened
    constants leave held-out lines closer to the source than the average does, by the fit's own objective."""
    from papa_surgery.calibration.corpus import bundled_corpus

    model, tok = minilm
    lines = [line for line in bundled_corpus() if len(line.split()) >= 8]
    fit, held_out = lines[:256], lines[-200:]
    every = [[layer, h] for layer in range(6) for h in range(12)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        average = calibrate(model, tok, fit, max_length=64, progress=False)
        sharpened = sharpen(model, tok, fit, average, every, search="walk", progress=False)
        start = distillation_loss(model, tok, held_out, average, every)
        end = distillation_loss(model, tok, held_out, sharpened, every)
    exponents = sharpened.metadata["sharpened"]["exponents"]
    assert any(p != 1.0 for p in exponents.values()), exponents
    assert end < start, (start, end, exponents)


def test_fraction_0_is_the_source(tiny, average):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    none = sharpen(model, tok, _texts()[0], average, [], progress=False)
    assert torch.equal(none.values, average.values) and none.metadata["sharpened"]["exponents"] == {}
    papa = papa_surgery.convert(model, none, "first-to-last", 0.0, tokenizer=tok)
    enc = tok(["the movie was good", "a film"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(papa(**enc)[0], model(**enc)[0], atol=1e-6, rtol=0)


def test_the_api_names_the_fitting_function(tiny, average):
    assert papa_surgery.sharpen is sharpen
    trained = [k for k in registry.KINDS.values() if k.made == registry.TRAINED]
    assert {k.name for k in trained} >= {"distilled", "sharpened"}
    for kind in trained:  # each names a public function, and calibrate's refusal names it
        assert callable(getattr(papa_surgery, kind.fitted_by))
        with pytest.raises(ValueError, match=rf"papa_surgery\.{kind.fitted_by}\(model, tokenizer, corpus, constants"):
            papa_surgery.calibrate(tiny.model("bert"), tiny.tokenizer("bert"), SENTENCES, kind=kind.name)
    with pytest.raises(ValueError, match="grid"):
        sharpen(tiny.model("bert"), tiny.tokenizer("bert"), SENTENCES, average, HEADS, grid=(0.0, 2.0))


def test_convert_kind_sharpened_through_the_cli_loads_in_a_fresh_process(tiny_folder, tiny, corpus, tmp_path):
    folder = tiny_folder("bert")
    out = tmp_path / "ckpt"
    args = ("convert", folder, "--kind", "sharpened", "--fraction", "0.5", "--max-length", L, "--corpus", corpus)
    result = cli(*args, "--out", out)
    assert result.exit_code == 0, result.output
    config = json.loads((out / "config.json").read_text())
    recipe = json.loads((out / "papa_recipe.json").read_text())
    assert config["papa_kind"] == "sharpened" and recipe["kind"] == "sharpened"
    assert "sharpened" in (out / "README.md").read_text()
    loads_in_a_fresh_process(out, tiny.tokenizer("bert"), tmp_path)


def loads_in_a_fresh_process(out, tokenizer, tmp_path) -> None:
    """The checkpoint at ``out`` loads by ``AutoModel`` in a fresh process and computes what the library loads."""
    papa = papa_surgery.load(out)[0]
    job = loader_job(papa, tokenizer, "AutoModel", out, "sharpened", tmp_path)
    (tmp_path / "jobs.json").write_text(json.dumps([job]))
    done = fresh_python(LOADER, str(tmp_path / "jobs.json"), cwd=tmp_path)
    assert "ALL-OK" in done.stdout, done.stderr[-3000:]


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_skipping_the_fitted_layers_scores_what_the_whole_model_scores(tiny, model_type, monkeypatch):
    """A layer's trials skip the layers below (they return what they returned with the exponents already fitted):
    every trial's score, the exponents and the losses equal those of running every layer, in every family. Five
    layers, constant heads in 1, 2 and 4: the kept input of layer 1 comes from a layer not fitted, of layer 2 from
    layer 1's best trial, of layer 4 from a pass that skips layers 0 to 2 and runs layer 3."""
    from papa_surgery.healing import sharpness

    depth = {"n_layers": 5} if model_type == "distilbert" else {"num_hidden_layers": 5}
    model, tok = tiny.model(model_type, **depth), tiny.tokenizer(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        average = calibrate(model, tok, SENTENCES, max_length=L, progress=False)
    layers, heads = average.num_layers, average.num_heads
    assert layers == 5
    some = [[layer, h] for layer in (1, 2, 4) for h in range(heads) if (layer + h) % 2 == 0]
    real_objective = sharpness._objective

    def fit(skipping: bool):
        scores = []

        def objective(papa, batches, first=1, skip=((), None)):
            scores.append(real_objective(papa, batches, first, skip if skipping else ((), None)))
            return scores[-1]

        def returned_by(papa, blocks, batches, k, known):
            return real_returned_by(papa, blocks, batches, k, known if skipping else None)

        monkeypatch.setattr(sharpness, "_objective", objective)
        monkeypatch.setattr(sharpness, "_returned_by", returned_by)
        fitted = sharpen(
            model, tok, SENTENCES, average, some, grid=(0.5, 2.0, 4.0), search="grid", batch_size=2, progress=False
        )
        return fitted, scores

    real_returned_by = sharpness._returned_by
    skipped, whole = fit(True), fit(False)
    assert len(skipped[1]) == 2 + 4 * len({layer for layer, _ in some})  # before, 4 trials per layer, after
    assert torch.allclose(torch.tensor(skipped[1]), torch.tensor(whole[1]), rtol=1e-5, atol=1e-7), model_type
    assert skipped[0].metadata["sharpened"]["exponents"] == whole[0].metadata["sharpened"]["exponents"]
    assert len(set(skipped[1])) > 3  # the trials differ: the exponents reach the scores


def test_a_skipped_block_gets_back_the_forward_it_had():
    """Skipping sets an instance ``forward`` for the duration; one already there (accelerate's offload hooks wrap
    ``forward`` so) is put back, and a block without one gets its class's again."""
    from papa_surgery.healing.blocks import skipped

    plain, hooked = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    wrapper = hooked.forward  # a bound method kept as an instance attribute, as a hook would
    hooked.forward = lambda x: wrapper(x) * 0
    own = hooked.forward
    with skipped([plain, hooked], "kept"):
        assert plain(torch.ones(2)) == "kept" and hooked(torch.ones(2)) == "kept"
    assert "forward" not in plain.__dict__ and hooked.forward is own
    assert torch.equal(hooked(torch.ones(2)), torch.zeros(2))


def test_auto_storage_compacts_sharpened_constants_and_keeps_distilled_ones_dense(tiny, average):
    """Above L=128 ``auto`` stores an average and sharpened constants compact (rows that would lose their mass drop
    their residual: finite outputs close to the dense model's), distilled ones as the dense matrices they were
    trained as; ``storage='dense'`` and ``'compact'`` are obeyed for every kind."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        long = calibrate(model, tok, _texts()[0], max_length=160, progress=False)
        raised = sharpen(model, tok, _texts()[0], long, HEADS, batch_size=4, progress=False)
    distilled = papa_surgery.Constants(raised.values, "distilled", 160, False)
    bands = {}
    for c in (long, raised, distilled):
        for storage in ("auto", "dense", "compact"):
            config = papa_surgery.convert(model, c, "first-to-last", 1.0, tokenizer=tok, storage=storage).config
            bands[c.kind, storage] = config.papa_compact_band
    assert bands == {
        **{(k, "auto"): 16 for k in ("average", "sharpened")},
        ("distilled", "auto"): None,
        **{(k, "dense"): None for k in ("average", "sharpened", "distilled")},
        **{(k, "compact"): 16 for k in ("average", "sharpened", "distilled")},
    }
    enc = tok([" ".join(_texts()[0][:6]), "a film"], padding=True, return_tensors="pt")
    with torch.no_grad():
        out = {
            s: papa_surgery.convert(model, raised, "first-to-last", 1.0, tokenizer=tok, storage=s)(**enc)[0]
            for s in ("auto", "dense")
        }
    assert torch.isfinite(out["auto"]).all()
    close = torch.nn.functional.cosine_similarity(out["auto"], out["dense"], dim=-1)[enc["attention_mask"].bool()]
    assert close.min() > 0.9, close


@pytest.mark.parametrize("model_type", ["bert", "modernbert"])
def test_walking_out_from_1_finds_what_trying_every_exponent_finds_in_fewer_trials(tiny, model_type):
    """The walk searches the grid out from 1 while the score improves: where each layer's scores have one
    minimum along the grid, the exponents, the constants and every score it took are those of trying them all."""
    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        average = calibrate(model, tok, _texts()[0], max_length=L, progress=False)
        heads = [[layer, h] for layer in range(average.num_layers) for h in range(average.num_heads)]
        fits = {
            search: sharpen(
                model,
                tok,
                _texts()[0],
                average,
                heads,
                grid=(0.5, 0.75, 0.9, 1.1, 1.2, 1.5, 2, 3),
                search=search,
                batch_size=2,
                progress=False,
            ).metadata["sharpened"]
            for search in ("grid", "walk")
        }
    grid, walk = fits["grid"], fits["walk"]
    for scores in grid["trials"].values():  # one minimum along the grid in each layer (else the test is moot)
        values = [scores[str(p)] for p in grid["grid"]]
        low = values.index(min(values))
        assert values[: low + 1] == sorted(values[: low + 1], reverse=True) and values[low:] == sorted(values[low:])
    assert walk["search"] == "walk" and walk["exponents"] == grid["exponents"]
    assert walk["exponents"] != dict.fromkeys(walk["exponents"], 1.0), grid["trials"]  # the walk went somewhere
    for layer, scores in walk["trials"].items():
        assert all(abs(score - grid["trials"][layer][p]) <= 1e-6 * abs(score) for p, score in scores.items())
    assert sum(map(len, walk["trials"].values())) < sum(map(len, grid["trials"].values()))
    assert walk["loss_sharpened"] == pytest.approx(grid["loss_sharpened"], rel=1e-6)


def test_the_walk_stops_at_the_first_minimum_from_1_and_breaks_ties_toward_1():
    """What the walk is: from 1 up while a step scores lower, down only if no step up did; ties go to the exponent
    nearer 1. With two minima along the grid it keeps the one nearer 1 (trying every exponent finds the lower)."""
    from papa_surgery.healing.sharpness import _search

    grid = (0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
    two_minima = {0.5: 0.1, 0.75: 0.6, 1.0: 0.5, 1.5: 0.4, 2.0: 0.45, 3.0: 0.2, 4.0: 0.3}
    for walk, best, tried in ((True, 1.5, {1.0, 1.5, 2.0}), (False, 0.5, set(grid))):
        scores = {}
        assert _search(grid, two_minima.get, scores, walk=walk) == best and set(scores) == tried
    scores = {}
    downhill = {0.5: 0.3, 0.75: 0.2, 1.0: 0.5, 1.5: 0.6, 2.0: 0.1, 3.0: 0.0, 4.0: 0.0}
    assert _search(grid, downhill.get, scores, walk=True) == 0.75 and set(scores) == {0.5, 0.75, 1.0, 1.5}
    flat = dict.fromkeys(grid, 0.5)
    assert _search(grid, flat.get, {}, walk=True) == 1.0 and _search(grid, flat.get, {}, walk=False) == 1.0


def test_an_unknown_search_is_refused_by_name(tiny, average):
    with pytest.raises(ValueError, match=r"search: must be one of per-head, walk, grid, got .best."):
        sharpen(tiny.model("bert"), tiny.tokenizer("bert"), _texts()[0], average, HEADS, search="best")
