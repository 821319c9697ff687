"""Sharpened constants with an exponent per head (``search="per-head"``, issue 32), fitted by gradient descent.

What it must be: each constant head's average raised to its own exponent (the heads not made constant untouched);
closer to the source than the average on held-out text by its own objective; never farther than the average on the
fitting text; the source untouched; the source at fraction 0; and, through the command line, a checkpoint that
loads in a fresh process and computes what the in-memory model computes.
"""

from __future__ import annotations

import json
import shutil
import warnings

import pytest
import torch
from conftest import FAMILY_TYPES, SENTENCES, cli
from test_sharpened import HEADS, L, _rows, loads_in_a_fresh_process

import papa_surgery
from papa_surgery import registry
from papa_surgery.calibration.average import calibrate
from papa_surgery.calibration.coverage import CoverageWarning
from papa_surgery.conversion.description import sharpness_text
from papa_surgery.healing.distillation import distillation_loss
from papa_surgery.healing.head_sharpness import step_batches
from papa_surgery.healing.sharpness import sharpen, sharpened_values

pytestmark = pytest.mark.usefixtures("one_thread")


def _shuffled(seed: int) -> list[str]:
    """18 sentences of the test sentences' words drawn at random: the fitting text (seed 1) and held-out text of the
    same make (seed 0)."""
    g = torch.Generator().manual_seed(seed)
    words = " ".join(SENTENCES).split()
    picks = [torch.randint(0, len(words), (n,), generator=g) for n in (6, 9, 14) * 6]
    return [" ".join(words[int(i)] for i in pick) for pick in picks]


@pytest.fixture(scope="module")
def average(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        return calibrate(model, tok, _shuffled(1), max_length=L, progress=False)


def _per_head(tiny, average, heads=HEADS, **options):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    options = {"steps": 40, "batch_size": 8, "progress": False, **options}
    return sharpen(model, tok, _shuffled(1), average, heads, search="per-head", **options)


def test_each_head_gets_its_own_exponent_and_the_held_out_text_comes_closer(tiny, average):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    weights = {name: p.detach().clone() for name, p in model.state_dict().items()}
    flags = [p.requires_grad for p in model.parameters()]
    fitted = _per_head(tiny, average)
    info = fitted.metadata["sharpened"]
    exponents = {int(la): {int(h): p for h, p in ps.items()} for la, ps in info["exponents"].items()}
    assert info["search"] == "per-head" and info["steps"] == 40 and len(info["losses"]) == 40
    assert {(la, h) for la, ps in exponents.items() for h in ps} == {tuple(h) for h in HEADS}
    assert len({round(p, 6) for ps in exponents.values() for p in ps.values()}) == len(HEADS)  # one each, all moved
    assert torch.equal(fitted.values, sharpened_values(average, exponents, HEADS))
    assert info["loss_sharpened"] < info["loss_average"]
    # the fit's own objective on text it never saw: closer than the average
    held_out = _shuffled(0)
    assert distillation_loss(model, tok, held_out, fitted, HEADS) < distillation_loss(
        model, tok, held_out, average, HEADS
    )
    # the source is untouched: its weights, their requires_grad, no gradient left on them
    assert all(torch.equal(weights[name], p) for name, p in model.state_dict().items())
    assert [p.requires_grad for p in model.parameters()] == flags and all(p.grad is None for p in model.parameters())
    assert sharpness_text(info).startswith("exponent per head, layer 0: ")


def test_a_head_raised_to_its_exponent_and_the_others_untouched(average):
    raised = sharpened_values(average, {0: {1: 2.0, 3: 1.0}, 1: {0: 0.5}}, [[0, 1], [0, 3], [1, 0], [1, 2]])
    assert torch.allclose(_rows(raised[0, 1]), _rows(average.values[0, 1].double().pow(2)), rtol=1e-6, atol=0)
    assert torch.allclose(_rows(raised[1, 0]), _rows(average.values[1, 0].double().pow(0.5)), rtol=1e-6, atol=0)
    for layer, head in ((0, 3), (1, 2), (0, 0), (1, 1)):  # exponent 1, missing, or not constant: bit-identical
        assert torch.equal(raised[layer, head], average.values[layer, head])


def test_a_fit_that_ends_farther_than_the_average_keeps_the_average(tiny, average, monkeypatch):
    """Steps on single batches can end worse on the whole fitting text: then the average is kept, as the walk's p = 1
    would keep it."""
    from papa_surgery.healing import sharpness

    scores = iter([1.0, 2.0])  # before, after
    monkeypatch.setattr(sharpness, "_objective", lambda papa, batches, first=1, skip=((), None): next(scores))
    fitted = _per_head(tiny, average, steps=3)
    info = fitted.metadata["sharpened"]
    assert info["exponents"] == {} and info["loss_sharpened"] == info["loss_average"] == 1.0
    assert torch.equal(fitted.values, average.values)


def test_fraction_0_is_the_source_and_bad_steps_are_refused(tiny, average):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    none = _per_head(tiny, average, heads=[])
    assert torch.equal(none.values, average.values) and none.metadata["sharpened"]["exponents"] == {}
    papa = papa_surgery.convert(model, none, "first-to-last", 0.0, tokenizer=tok)
    enc = tok(["the movie was good", "a film"], padding=True, return_tensors="pt")
    with torch.no_grad():
        assert torch.allclose(papa(**enc)[0], model(**enc)[0], atol=1e-6, rtol=0)
    for bad, error, words in ((0, ValueError, "steps: 0 is not in the range"), (2.5, TypeError, "steps: must be int"),
                              (True, TypeError, "steps: must be int")):  # fmt: skip
        with pytest.raises(error, match=words):
            _per_head(tiny, average, steps=bad)
    with pytest.raises(ValueError, match=r"lr: 0.0 is not in the range"):
        _per_head(tiny, average, lr=0.0)
    for bad, words in (("c.safetensors", "constants file 'c.safetensors' does not exist"),
                       (None, "constants: must be Constants"), ("all", None), (0.5, None)):  # fmt: skip
        arguments = {"heads": bad} if words is None else {"constants": bad}
        with pytest.raises((TypeError, FileNotFoundError), match=words or r"heads: must be a list of \[layer, head\]"):
            sharpen(model, tok, SENTENCES, arguments.get("constants", average), arguments.get("heads", HEADS))
    with pytest.raises(TypeError, match=r"lr: must be int or float, got the str '0.01'"):
        papa_surgery.distill(model, tok, SENTENCES, average, HEADS, lr="0.01")
    # what the functions took before their checks still goes: numpy's integers, no heads, a search's unused options
    import numpy as np

    numpy_heads = [tuple(np.int64(x) for x in h) for h in HEADS]
    assert papa_surgery.distill(model, tok, SENTENCES, average, None, steps=np.int64(1)).kind == "average"  # no head
    walked = sharpen(model, tok, SENTENCES, average, numpy_heads, search="walk", steps=0, lr=0.0, grid=(1.5,))
    assert walked.kind == "sharpened"
    with pytest.raises(ValueError, match=r"search: must be one of per-head, walk, grid, got 'heads'"):
        sharpen(model, tok, SENTENCES, average, HEADS, search="heads")


def test_convert_kind_sharpened_fits_per_head_by_default_and_loads_in_a_fresh_process(
    tiny_folder, tiny, corpus, tmp_path
):
    folder = tiny_folder("bert")
    out = tmp_path / "ckpt"
    args = ("convert", folder, "--kind", "sharpened", "--fraction", "0.5")  # no --sharpen-search: per-head
    result = cli(*args, "--max-length", L, "--corpus", corpus, "--out", out)
    assert result.exit_code == 0, result.output
    recipe = json.loads((out / "papa_recipe.json").read_text())
    fit = recipe["sharpened"]
    heads = json.loads((out / "config.json").read_text())["papa_constant_heads"]
    assert fit["search"] == "per-head" and len(fit["losses"]) == fit["steps"] == 64
    assert fit["batch_size"] == 32 and fit["step_tokens"] == registry.SHARPEN_STEP_TOKENS
    assert fit["step_examples"] == registry.SHARPEN_STEP_EXAMPLES == 16
    fitted = {(int(la), int(h)) for la, ps in fit["exponents"].items() for h in ps}
    assert fitted == {tuple(h) for h in heads} and fit["loss_sharpened"] < fit["loss_average"]
    assert "exponent per head" in (out / "README.md").read_text()
    loads_in_a_fresh_process(out, tiny.tokenizer("bert"), tmp_path)


def test_a_large_exponent_does_not_underflow_a_row_to_zeros(average):
    """A row of small values raised to a large power is divided by its largest value: the constants stay finite and
    every row keeps its mass (the fit ran into it on all-mpnet-base-v2's documents: NaN constants otherwise)."""
    flat = papa_surgery.Constants(average.values.clamp_min(1e-3) * 1e-2, "average", L, False)  # every cell <= 0.01
    up = sharpened_values(flat, {0: 40.0, 1: {2: 60.0}}, HEADS)  # 0.01 ** 40 underflows float32
    assert torch.isfinite(up).all() and (up[0].amax(-1) == 1).all() and (up[1, 2].amax(-1) == 1).all()
    assert papa_surgery.Constants(up, "sharpened", L, False).values.shape == average.values.shape


def test_the_objective_kept_is_the_one_of_the_constants_returned(tiny, average):
    """``loss_sharpened`` is the fitting text's objective with the constants as returned (the fit's model and the one
    a user converts from the result are the same)."""
    from papa_surgery.healing import sharpness

    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    fitted = _per_head(tiny, average)
    papa = papa_surgery.convert(model, fitted, "first-to-last", 1.0, tokenizer=tok, storage="dense")
    batches = sharpness._batches(model, tok, _shuffled(1), fitted, 8, torch.device("cpu"))
    again = sharpness._objective(papa, batches)
    assert again == pytest.approx(fitted.metadata["sharpened"]["loss_sharpened"], rel=1e-5)


def test_the_fit_does_not_depend_on_the_scale_of_the_rows(tiny, average, monkeypatch):
    """Rows are renormalised at use, so constants 1e-30 times smaller are the same constants: the fit takes the
    same steps to the same exponents. Raised without dividing each row by its largest value they underflow in
    float32 (1e-32 to the power 1.3), and the heads go silent (the fit gave NaN on all-mpnet-base-v2's documents). The
    kept-average rule is taken out of the way, so the exponents compared are the fitted ones."""
    from papa_surgery.healing import sharpness

    calls = iter(range(100))  # before, after, before, after: never farther
    monkeypatch.setattr(sharpness, "_objective", lambda papa, batches, first=1, skip=((), None): 1 - next(calls) % 2)
    tiny_rows = papa_surgery.Constants(average.values * 1e-30, "average", L, False, average.counts)
    fits = [_per_head(tiny, c, steps=12, lr=0.2).metadata["sharpened"] for c in (average, tiny_rows)]
    assert all(torch.isfinite(torch.tensor(f["losses"])).all() for f in fits)
    assert fits[1]["losses"] == pytest.approx(fits[0]["losses"], rel=1e-4)
    ps = [torch.tensor([p for ps in f["exponents"].values() for p in ps.values()]) for f in fits]
    assert ps[0].max() > 1.25 and torch.allclose(ps[1], ps[0], rtol=1e-4, atol=0)


@pytest.mark.parametrize("model_type", FAMILY_TYPES)
def test_every_constant_head_of_every_family_gets_a_gradient(tiny, model_type, monkeypatch):
    """Each family's constant heads run through the fitted exponents (a hook that did not fire would leave its heads
    at 1): after two steps every head's exponent has moved. The kept-average rule is taken out of the way."""
    from papa_surgery.healing import sharpness

    model, tok = tiny.model(model_type), tiny.tokenizer(model_type)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CoverageWarning)
        start = calibrate(model, tok, SENTENCES, max_length=L, progress=False)
    every = [[layer, h] for layer in range(start.num_layers) for h in range(start.num_heads)]
    scores = iter([1.0, 0.0])  # before, after: never farther
    monkeypatch.setattr(sharpness, "_objective", lambda papa, batches, first=1, skip=((), None): next(scores))
    fitted = sharpen(model, tok, SENTENCES, start, every, search="per-head", steps=2, batch_size=2, progress=False)
    exponents = fitted.metadata["sharpened"]["exponents"]
    moved = {(int(la), int(h)) for la, ps in exponents.items() for h, p in ps.items() if p != 1.0}
    assert moved == {tuple(h) for h in every}, model_type


def test_each_step_holds_at_most_the_token_budget_and_every_example_once(tiny, average, monkeypatch):
    """A step's activations follow its tokens: the fitting batches are cut into steps of at most ``STEP_TOKENS``
    tokens (one example at least), every example in exactly one step, its inputs and targets cut alike."""
    from papa_surgery.healing import sharpness

    seen = []
    real_fit = sharpness.fit_head_exponents

    def spy(papa, modules, starts, batches, **kwargs):
        seen.extend(batches)
        return real_fit(papa, modules, starts, batches, **kwargs)

    monkeypatch.setattr(sharpness, "fit_head_exponents", spy)
    monkeypatch.setattr(sharpness, "STEP_TOKENS", 40)
    fitted = _per_head(tiny, average, steps=3, batch_size=8)
    sizes = [inputs["attention_mask"].shape for inputs, _ in seen]  # (B, T) of each step
    assert all(b * t <= 40 or b == 1 for b, t in sizes) and max(b for b, _ in sizes) > 1, sizes
    assert sum(b for b, _ in sizes) == len(_shuffled(1)) and len(sizes) > -(-len(_shuffled(1)) // 8)
    for inputs, targets in seen:
        assert all(len(v) == len(inputs["attention_mask"]) for v in (*inputs.values(), *targets))
    assert fitted.metadata["sharpened"]["step_tokens"] == 40

    ids = torch.arange(24).reshape(6, 4)  # six examples of four tokens: at most two per step of nine tokens
    batches = [({"input_ids": ids, "attention_mask": torch.ones_like(ids)}, (ids.float()[..., None],))]
    cut = step_batches(batches, tokens=9)
    assert [len(i["input_ids"]) for i, _ in cut] == [2, 2, 2]
    assert torch.equal(torch.cat([i["input_ids"] for i, _ in cut]), ids)
    assert torch.equal(torch.cat([t[0] for _, t in cut]), batches[0][1][0])
    assert [len(i["input_ids"]) for i, _ in step_batches(batches, tokens=3)] == [1] * 6  # one example at least
    assert [len(i["input_ids"]) for i, _ in step_batches(batches, tokens=99, examples=4)] == [4, 2]

    mask = torch.tensor([[1, 1, 0, 0], [1, 0, 0, 0], [1, 1, 1, 0]])  # a step keeps the columns its examples use
    batches = [({"input_ids": ids[:3], "attention_mask": mask}, (ids[:3].float()[..., None],))]
    cut = step_batches(batches, tokens=99, examples=2)
    assert [tuple(i["attention_mask"].shape) for i, _ in cut] == [(2, 2), (1, 3)]
    assert torch.equal(cut[0][0]["input_ids"], ids[:2, :2]) and torch.equal(cut[1][1][0][..., 0], ids[2:3, :3].float())
    left = torch.tensor([[0, 0, 1, 1], [0, 1, 1, 1], [0, 0, 0, 1]])  # padded on the left: the positions stay
    batches = [({"input_ids": ids[:3], "attention_mask": left}, (ids[:3].float()[..., None],))]
    assert [tuple(i["input_ids"].shape) for i, _ in step_batches(batches, tokens=99)] == [(3, 4)]
    # a run of `examples` is cut by its own width: its two examples of 2 tokens make one step of 4 tokens, where the
    # batch's width (4) would allow one example a step
    mask = torch.tensor([[1, 1, 0, 0]] * 2 + [[1] * 4] * 2)
    batches = [({"input_ids": ids[:4], "attention_mask": mask}, ())]
    shapes = [tuple(i["input_ids"].shape) for i, _ in step_batches(batches, tokens=4, examples=2)]
    assert shapes == [(2, 2), (1, 4), (1, 4)]


def test_the_per_head_fit_is_the_same_for_batch_sizes_that_are_multiples_of_its_step(tiny, average, monkeypatch):
    """``--batch-size`` sets how the fitting text runs without gradients, not the fit: its steps take at most
    ``STEP_EXAMPLES`` examples (the text sorted by length: a batch of 8 cut in two is the two batches of 4), so the
    exponents are the same with any multiple of it; the recipe records the bound."""
    from papa_surgery.healing import sharpness

    monkeypatch.setattr(sharpness, "STEP_EXAMPLES", 4)
    monkeypatch.setattr(sharpness, "STEP_TOKENS", 24)  # some runs of 4 are cut again by their tokens
    by_four, by_eight = (_per_head(tiny, average, steps=12, batch_size=b) for b in (4, 8))
    info = by_eight.metadata["sharpened"]
    assert info["step_examples"] == 4 and info["batch_size"] == 8
    torch.testing.assert_close(torch.tensor(info["losses"]), torch.tensor(by_four.metadata["sharpened"]["losses"]))
    torch.testing.assert_close(by_eight.values, by_four.values)
    assert not torch.equal(by_eight.values, average.values)  # the fit moved them


def test_convert_without_kind_fits_sharpened_constants_up_to_512_slots_and_averages_above(
    tiny_folder, corpus, tmp_path
):
    """The convert default (``registry.DEFAULT_CONVERT_KIND``): sharpened constants, fitted per head for the heads
    the checkpoint makes constant, at the source's own length and at an asked one up to 512 slots; the average above,
    where it calibrates into the compact structure. Each checkpoint says its kind in its config, recipe and card."""
    assert registry.DEFAULT_CONVERT_KIND == "sharpened" and registry.DEFAULT_KIND_UP_TO == 512
    short = tiny_folder("bert")
    long = tiny_folder("modernbert", max_position_embeddings=600)
    made = {}
    own_long = tmp_path / "own-long-source"  # a source whose own length is 600: its tokenizer says so
    shutil.copytree(long, own_long)
    settings = json.loads((own_long / "tokenizer_config.json").read_text())
    (own_long / "tokenizer_config.json").write_text(json.dumps({**settings, "model_max_length": 600}))
    cases = (("own", short, None), ("short", short, L), ("long", long, 600), ("own-long", own_long, None))
    for name, folder, length in cases:
        out = tmp_path / name
        args = ("--fraction", "0.5", "--corpus", corpus) + (("--max-length", length) if length else ())
        result = cli("convert", folder, *args, "--out", out)
        assert result.exit_code == 0, result.output
        config = json.loads((out / "config.json").read_text())
        recipe = json.loads((out / "papa_recipe.json").read_text())
        assert config["papa_kind"] == recipe["kind"], name
        assert recipe["kind"] in (out / "README.md").read_text(), name
        made[name] = (recipe["kind"], config["papa_max_length"], recipe.get("sharpened", {}).get("search"))
        made[name] += (config["papa_method"],)
    assert made["own"][0] == made["short"][0] == "sharpened" and made["own"][1] <= 512
    assert made["own"][2] == made["short"][2] == "per-head"
    assert made["own"][3] == made["short"][3] == "sensitivity"  # the default ranking, up to 512 slots too
    assert made["long"] == ("average", 600, None, "variance")
    assert made["own-long"] == ("average", 600, None, "variance")  # the source's own length, known once it loaded


def test_convert_at_fraction_0_without_kind_records_the_average_and_is_the_source(
    tiny_folder, corpus, tmp_path, calibrations
):
    """At ``--fraction 0`` no head is made constant, so the default kind has nothing to fit: the checkpoint records the
    average (as a sweep's fraction 0 does), not sharpened constants of no head, and computes what its source computes;
    nothing is calibrated for it (the checkpoint stores no matrix), and the card and ``inspect`` say so; a
    sharpened-only option there is refused, naming why the kind is the average, before the model loads."""
    folder = tiny_folder("bert")
    out = tmp_path / "zero"
    result = cli("convert", folder, "--fraction", 0, "--corpus", corpus, "--max-length", L, "--out", out)
    assert result.exit_code == 0, result.output
    assert calibrations.calls == 0
    recipe = json.loads((out / "papa_recipe.json").read_text())
    assert recipe["kind"] == json.loads((out / "config.json").read_text())["papa_kind"] == "average"
    assert "sharpened" not in recipe and recipe["constant_heads"] == []
    assert recipe["corpus"]["description"] is None and recipe["coverage"] is None
    card = " ".join((out / "README.md").read_text().split())
    assert "| calibrated on | nothing: no head is constant, so no constants were made |" in card
    assert "| covered length | none: no head is constant, so nothing was calibrated |" in card
    shown = cli("inspect", out)
    assert shown.exit_code == 0 and "calibrated on   nothing: no head is constant" in shown.output, shown.output
    missing = cli("convert", folder, "--fraction", 0, "--corpus", tmp_path / "nope.txt", "--out", tmp_path / "m")
    assert missing.exit_code != 0 and "nope.txt" in missing.output and not (tmp_path / "m").exists()
    assert "--fraction 0.0 " in recipe["command"]  # a value of 0 is a value given, and retyping needs it
    papa, tok = papa_surgery.load(out)
    source = papa_surgery.load(folder)[0]
    enc = tok(SENTENCES[:3], padding="max_length", max_length=L, truncation=True, return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(papa(**enc).last_hidden_state, source(**enc).last_hidden_state)
    refused = tmp_path / "refused"
    result = cli("convert", folder, "--fraction", 0, "--corpus", corpus, "--sharpen-search", "walk", "--out", refused)
    assert result.exit_code == 2, result.output
    assert "these are average (the default at --fraction 0)" in " ".join(result.output.split())
    assert not refused.exists()
    empty = tmp_path / "empty"  # no model in it: refused before the model loads, as for an explicit --kind
    empty.mkdir()
    result = cli("convert", empty, "--fraction", 0, "--sharpen-search", "walk", "--out", refused)
    assert result.exit_code == 2 and "(the default at --fraction 0)" in " ".join(result.output.split()), result.output
    assert not refused.exists()


def test_float16_storage_warns_when_a_short_inputs_row_would_underflow_to_zeros(tiny, average):
    """A sharpened row whose mass on a short input's slots is all below float16's range is empty there once stored in
    float16: convert warns with the fix (bf16 or fp32); bf16, fp32 and an fp16 row that keeps its mass stay quiet."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    values = average.values.clone()
    values[0, 1, 2] = 1e-9  # row 2 of layer 0's head 1: nothing float16 keeps ...
    values[0, 1, 2, 5] = 1.0  # ... until column 5: empty for inputs of 3 to 5 tokens
    c = papa_surgery.Constants(values, "sharpened", L, False)
    with pytest.warns(UserWarning, match=r"^1 rows of these sharpened constants underflow to zeros in float16.*bf16"):
        papa_surgery.convert(model, c, "first-to-last", 1.0, tokenizer=tok, dtype="float16")
    values[0, 1, 2, 0] = 1e-3  # the first slot keeps some mass: nothing is lost
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        papa_surgery.convert(model, c, "first-to-last", 1.0, tokenizer=tok, dtype="float16")
        papa_surgery.convert(model, average, "first-to-last", 1.0, tokenizer=tok, dtype="float16")
        values[0, 1, 2, 0] = 1e-9
        papa_surgery.convert(model, c, "first-to-last", 1.0, tokenizer=tok, dtype="bfloat16")


def test_an_option_of_another_kind_is_refused_not_ignored(tiny_folder, corpus, tmp_path, calibrations):
    """``--sharpen-search`` (or a ``--distill-*`` option) where the constants made are of another kind would do
    nothing: refused with exit 2, naming the kind and the fix, before any calibration when the kind is known before
    the model loads; after it loads where the default kind depends on the source's length (above 512: the average)."""
    import dataclasses

    from papa_surgery.options import DistillOptions
    from papa_surgery.options.kind_options import KIND_OPTIONS

    tuned = {name for names in KIND_OPTIONS.values() for name in names}
    assert tuned == {f.name for f in dataclasses.fields(DistillOptions)}  # every option the CLI passes is known
    short, long = tiny_folder("bert"), tiny_folder("modernbert", max_position_embeddings=600)
    average = tmp_path / "average.safetensors"
    assert cli("calibrate", short, "--corpus", corpus, "--max-length", 16, "--out", average).exit_code == 0
    made = papa_surgery.Constants.load(average)
    sharpened = tmp_path / "sharpened.safetensors"
    papa_surgery.Constants(made.values, "sharpened", made.max_length, False, made.counts, made.variance).save(sharpened)
    calibrations.calls = 0
    cases = (
        (short, ("--kind", "average", "--sharpen-search", "walk"), "tunes sharpened constants, and these are average"),
        (short, ("--constants", sharpened, "--sharpen-search", "walk"), "already holds sharpened constants"),
        (short, ("--kind", "sharpened", "--distill-steps", 5), "tunes distilled constants, and these are sharpened"),
        (short, ("--constants", average, "--sharpen-search", "walk"), "add --kind sharpened"),
        (long, ("--max-length", 600, "--sharpen-search", "walk"), "these are average (the default kind at L=600)"),
    )
    for folder, args, expected in cases:
        out = tmp_path / "out"
        rest = () if "--constants" in args else ("--corpus", corpus)
        result = cli("convert", folder, "--fraction", 0.5, *rest, *args, "--out", out)
        assert result.exit_code == 2, result.output
        assert expected in " ".join(result.output.split()), result.output
        assert not out.exists()
    result = cli("calibrate", short, "--corpus", corpus, "--distill-lr", 0.1, "--out", tmp_path / "c.safetensors")
    assert result.exit_code == 2 and "tunes distilled constants, and these are average" in result.output
    assert calibrations.calls == 0
    result = cli(
        "convert", short, "--fraction", 0.5, "--corpus", corpus, "--sharpen-search", "walk", "--out", tmp_path / "ok"
    )
    assert result.exit_code == 0, result.output  # the default kind at L=16 is sharpened: the search is used
    assert json.loads((tmp_path / "ok" / "papa_recipe.json").read_text())["sharpened"]["search"] == "walk"
