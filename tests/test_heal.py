"""Healing on tiny models: it lowers the held-out objective, trains only what it says, folds back into a plain PAPA
model (no peft, no papa-surgery needed to load it), keeps the sentence-transformers pipeline, is deterministic for a
seed, and a stopped run resumes to exactly the uninterrupted result."""

from __future__ import annotations

import json

import pytest
import torch
from conftest import SENTENCES, cli
from test_checkpoint import fresh_python

from papa_surgery.calibration.constants import Constants
from papa_surgery.conversion.checkpoint import save_checkpoint
from papa_surgery.conversion.surgery import convert
from papa_surgery.healing.run import heal_model
from papa_surgery.options import HealOptions
from papa_surgery.registry import DEFAULT_TRAIN

pytestmark = pytest.mark.usefixtures("one_thread")

L = 32
HEADS = [[0, 0], [0, 2], [1, 0], [1, 1], [1, 2], [1, 3]]  # layer 1 attention-free, layer 0 mixed
WORDS = "the cat sat on a mat and it was good fun but the film is bleak , dull and long .".split()
CORPUS = [" ".join(WORDS[(i * 7 + j * 3) % len(WORDS)] for j in range(4 + i % 11)) for i in range(72)]
QUICK = {"steps": 12, "heldout": 12, "eval_every": 4, "lr": 1e-3, "constants_lr": 0.05}


@pytest.fixture(scope="module")
def source(tiny):
    """The tiny BERT, its tokenizer and uniform constants (far enough from its attention for healing to show)."""
    return tiny.model("bert"), tiny.tokenizer("bert"), Constants.from_kind("uniform", 2, 4, L)


def converted(source):
    model, tok, constants = source
    return convert(model, constants, HEADS, tokenizer=tok, kind="average", fraction=0.75)


def heal(source, papa=None, batch_size=8, **options):
    model, tok, _ = source
    papa = papa if papa is not None else converted(source)
    settings = HealOptions(**{**QUICK, **options})
    return heal_model(papa, model, tok, CORPUS, settings, batch_size=batch_size, progress=False, teacher_name="tiny")


def state(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.mark.parametrize("train", ["lora", "full", "constants"])
def test_healing_lowers_the_heldout_objective(source, train):
    healed = heal(source, train=train)
    record = healed.papa_recipe["healing"]
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < 0.9 * before["loss"], (before, after)
    assert after["token_cosine"] > before["token_cosine"]
    assert record["train"] == train and record["steps"] == 12 and record["heldout_examples"] == 12
    assert [e["step"] for e in record["heldout_during"]] == [4, 8]  # every 4 steps, the last one is "after"
    assert record["training_examples"] == len(CORPUS) - 12
    assert record["objective"] == "layers"  # a plain transformers source: no sentence-transformers pipeline


def test_constants_training_leaves_every_other_weight_bit_identical(source):
    papa = converted(source)
    start = state(papa)
    healed = heal(source, papa, train="constants")
    assert state(papa).keys() == start.keys() and all(torch.equal(v, start[k]) for k, v in state(papa).items())
    after = state(healed)
    assert after.keys() == start.keys()
    moved = sorted(k for k in after if not torch.equal(after[k], start[k]))
    assert moved and all(k.endswith("papa_constants") for k in moved), moved
    assert all((after[k] >= 0).all() for k in moved)


def test_lora_and_full_change_only_what_they_train_and_keep_the_architecture(source):
    papa = converted(source)
    start = state(papa)
    for train in ("lora", "full"):
        after = state(heal(source, papa, train=train))
        assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in start.items()}  # no Q/K back
        moved = {k for k in after if not torch.equal(after[k], start[k])}
        assert not any("embeddings" in k for k in moved), sorted(moved)
        assert any(k.endswith("attention.self.value.weight") for k in moved)
        assert any(k.endswith("intermediate.dense.weight") for k in moved)
        assert any(k.endswith("papa_constants") for k in moved)
        if train == "full":  # every layer weight, the kept heads' query/key included
            assert any(k.endswith("LayerNorm.weight") for k in moved) and any(".query." in k for k in moved)
        else:  # LoRA adapts the value, output and feed-forward weights only, merged: no bias, norm or query/key
            assert not any(k.endswith(("bias", "LayerNorm.weight")) for k in moved), sorted(moved)
            assert not any(".query." in k or ".key." in k for k in moved), sorted(moved)


@pytest.mark.parametrize("train", ["lora", "full"])
def test_frozen_constants_stay_as_stored_while_the_rest_heals(source, train):
    """``freeze_constants``: the constants keep their storage and values bit for bit (no rebuild into dense
    matrices; dense and compact alike), the other weights train, and the held-out agreement still improves."""
    from papa_surgery.hub_code.compact_constants import COMPACT_PARTS

    model, tok, constants = source
    compact = convert(model, constants, HEADS, tokenizer=tok, storage="compact", compact_band=2, compact_rank=1)
    labeled = convert(model, constants, HEADS, tokenizer=tok, trainable_constants=True)  # constants a parameter
    for papa in (converted(source), compact, labeled):
        start = state(papa)
        healed = heal(source, papa, train=train, freeze_constants=True)
        assert all(torch.equal(v, start[k]) for k, v in state(papa).items())  # the input is not changed
        after = state(healed)
        assert {k: v.shape for k, v in after.items()} == {k: v.shape for k, v in start.items()}
        kept = [k for k in start if k.rpartition(".")[2] in (*COMPACT_PARTS, "papa_constants")]
        assert kept and all(torch.equal(after[k], start[k]) for k in kept)
        assert any(k.endswith("intermediate.dense.weight") and not torch.equal(after[k], start[k]) for k in after)
        for field in ("papa_compact_band", "papa_compact_rank", "papa_constants_dtype", "papa_kind"):
            assert getattr(healed.config, field) == getattr(papa.config, field)
        assert all(p.requires_grad for p in healed.parameters()) and not healed.training  # as from_pretrained
        record = healed.papa_recipe["healing"]
        assert record["freeze_constants"] is True and record["constants_lr"] is None and record["train"] == train
    # with the constants fixed, training the rest alone still lowers the held-out objective
    papa = converted(source)
    with torch.no_grad():  # run first: its copy keeps the output-capturing hooks the objective reads through
        papa(**tok(CORPUS[:2], padding=True, return_tensors="pt"), output_hidden_states=True)
    record = heal(source, papa, train=train, freeze_constants=True, lr=3e-3).papa_recipe["healing"]
    before, after = record["heldout_before"], record["heldout_after"]
    assert after["loss"] < 0.9 * before["loss"], (before, after)


def test_frozen_constants_with_the_constants_mode_is_refused(source, tiny, tmp_path):
    from click.testing import CliRunner

    from papa_surgery.cli import main
    from papa_surgery.failures import ArgumentError

    with pytest.raises(ArgumentError, match="freeze_constants: leaves nothing to train"):
        HealOptions(train="constants", freeze_constants=True)
    src = tiny.save("bert", tmp_path / "src")
    result = CliRunner().invoke(main, ["heal", str(src), "--train", "constants", "--freeze-constants",
                                       "--out", str(tmp_path / "o")])  # fmt: skip
    assert result.exit_code == 2 and "--freeze-constants" in result.output and "leaves nothing" in result.output
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("storage", ["dense", "compact"])
def test_a_model_converted_under_inference_mode_runs_and_heals(source, storage):
    """Constants made under ``torch.inference_mode()`` are inference tensors, which have no version counter: the
    runtime's caches keyed on versions must still run them (in and out of inference mode), and healing copies them."""
    model, tok, constants = source
    kwargs = {"storage": storage, **({"compact_band": 2, "compact_rank": 1} if storage == "compact" else {})}
    expected = convert(model, constants, HEADS, tokenizer=tok, **kwargs)
    enc = tok(CORPUS[:3], padding=True, return_tensors="pt")
    with torch.inference_mode():
        papa = convert(model, constants, HEADS, tokenizer=tok, **kwargs)
        inside = papa(**enc).last_hidden_state
    with torch.no_grad():
        torch.testing.assert_close(inside.clone(), expected(**enc).last_hidden_state, rtol=0, atol=0)
        torch.testing.assert_close(papa(**enc).last_hidden_state, inside.clone(), rtol=0, atol=0)
    for freeze in (False, True):
        healed = heal(source, papa, train="full", freeze_constants=freeze, steps=2, eval_every=2)
        assert healed.papa_recipe["healing"]["steps"] == 2


def test_healed_rows_written_before_an_option_existed_resume_at_its_default():
    """A results file's healed rows recorded every HealOptions field of their time: a field added since
    (``freeze_constants``) was at its default there, so the same settings resume and another value is refused."""
    from papa_surgery.experiments.results import Cell, check_options

    now = HealOptions(steps=4).kwargs()
    before = {k: v for k, v in now.items() if k != "freeze_constants"}
    rows = [{"model": "m", "task": "sst2", "kind": "average+healed", "options": {"heal_options": before}}]
    cell = Cell("m", "sst2", 1.0, "average+healed", "variance", 0)
    check_options(rows, cell, {"heal_options": now}, "r.jsonl")
    frozen = HealOptions(steps=4, freeze_constants=True).kwargs()
    with pytest.raises(ValueError, match="r.jsonl holds sst2 results of m made with heal_options"):
        check_options(rows, cell, {"heal_options": frozen}, "r.jsonl")


def test_deterministic_for_a_seed(source):
    import warnings

    model, tok, _ = source
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        first, second = state(heal(source, train="lora")), state(heal(source, train="lora"))
    # peft reads transformers' deprecated is_gradient_checkpointing: the user should not see that FutureWarning
    assert not [w for w in seen if "is_gradient_checkpointing" in str(w.message)]
    assert all(torch.equal(v, second[k]) for k, v in first.items())
    papa = converted(source)
    other = heal_model(papa, model, tok, CORPUS, HealOptions(**QUICK), batch_size=8, seed=1, progress=False)
    assert any(not torch.equal(v, state(other)[k]) for k, v in first.items())


def test_batches_are_grouped_by_length_cover_each_epoch_once_and_split_across_processes(monkeypatch):
    import random

    from papa_surgery import distributed
    from papa_surgery.healing.loop import GROUPED, GroupedBatches

    rng = random.Random(3)
    lengths = [rng.randint(3, 128) for _ in range(2 * 32 * GROUPED + 70)]  # two full groups and a partial one
    steps = len(lengths) // 32
    grouped = GroupedBatches(lengths, 32, seed=0)
    order = [i for step in range(2 * steps + 2) for i in grouped.indices(step)]
    assert sorted(order[: len(lengths)]) == list(range(len(lengths)))  # the first epoch: every example once
    assert sorted(order[len(lengths) : 2 * len(lengths)]) == list(range(len(lengths)))  # and the second
    assert order[: len(lengths)] != order[len(lengths) : 2 * len(lengths)]  # in another order
    batches = [[lengths[i] for i in grouped.indices(step)] for step in range(steps)]
    padded = sum(max(b) for b in batches) / len(batches)
    assert padded < 1.15 * sum(lengths) / len(lengths)  # random batches of 32 pad to about 124 here
    assert grouped.indices(0) == GroupedBatches(lengths, 32, seed=0).indices(0)
    assert grouped.indices(0) != GroupedBatches(lengths, 32, seed=1).indices(0)
    # two processes with 16 each take the slices of one process's batch of 32
    one = [grouped.indices(step) for step in range(5)]
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    for me in (0, 1):
        monkeypatch.setattr(distributed, "rank", lambda me=me: me)
        assert [GroupedBatches(lengths, 16, seed=0).indices(step) for step in range(5)] == [
            b[16 * me : 16 * (me + 1)] for b in one
        ]


def test_a_stopped_run_resumes_to_the_uninterrupted_result(source, tmp_path, monkeypatch, caplog):
    import logging

    from papa_surgery.healing import state as state_module

    uninterrupted = state(heal(source, train="full"))
    path = tmp_path / "state.safetensors"
    real_save, saves = state_module.HealState.save, []

    def save_then_stop(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        saves.append(args[-1])
        if len(saves) == 2:
            raise KeyboardInterrupt  # stopped right after the state of step 8 was written

    monkeypatch.setattr(state_module.HealState, "save", save_then_stop)
    model, tok, _ = source
    options = HealOptions(**{**QUICK, "train": "full"})
    caplog.set_level(logging.WARNING, logger="papa_surgery")
    with pytest.raises(KeyboardInterrupt):
        heal_model(converted(source), model, tok, CORPUS, options, batch_size=8, progress=False, state_path=path)
    assert saves == [4, 8] and path.is_file() and [p.name for p in tmp_path.iterdir()] == ["state.safetensors"]
    said = [r.getMessage() for r in caplog.records if "resume state" in r.getMessage()]  # hidden in the CLI: said
    assert len(said) == 1 and str(path) in said[0] and "delete it to start afresh" in said[0], said
    monkeypatch.setattr(state_module.HealState, "save", real_save)
    resumed = heal_model(converted(source), model, tok, CORPUS, options, batch_size=8, progress=False, state_path=path)
    assert resumed.papa_recipe["healing"]["resumed_from_step"] == 8
    assert all(torch.equal(v, uninterrupted[k]) for k, v in state(resumed).items())
    # Other settings do not resume from that state: they start afresh.
    other = heal_model(converted(source), model, tok, CORPUS, HealOptions(**{**QUICK, "train": "full", "lr": 2e-3}),
                       batch_size=8, progress=False, state_path=path)  # fmt: skip
    assert other.papa_recipe["healing"]["resumed_from_step"] is None


def test_state_path_refuses_a_file_that_is_not_a_state_and_keeps_its_own_at_the_end(source, tmp_path):
    """``papa_surgery.heal(state_path=...)`` removed whatever the path held (a user's file named by mistake: warned
    "starting afresh", then deleted), and removed its own state before the caller could save the healed model."""
    from safetensors.torch import save_file

    import papa_surgery

    model, tok, constants = source
    papa = convert(model, constants, HEADS, tokenizer=tok)
    mine = tmp_path / "my_embeddings.safetensors"
    save_file({"e": torch.ones(3)}, str(mine))
    notes = tmp_path / "notes.txt"
    notes.write_text("finish the paper")
    for path in (mine, notes, tmp_path):
        before = None if path.is_dir() else path.read_bytes()
        with pytest.raises(ValueError, match="state_path: .* is (a file that is not a healing run's state|a folder)"):
            papa_surgery.heal(papa, tok, CORPUS, teacher=model, progress=False, batch_size=8, state_path=path, **QUICK)
        assert path.is_dir() if before is None else path.read_bytes() == before
    state = tmp_path / "run.safetensors"
    options = dict(teacher=model, progress=False, batch_size=8, state_path=state, **{**QUICK, "eval_every": 4})
    first = papa_surgery.heal(papa, tok, CORPUS, **options)
    assert state.is_file()  # kept: the caller has not saved the healed model yet
    again = papa_surgery.heal(papa, tok, CORPUS, **options)  # its own state: taken, and the same result
    assert again.papa_recipe["healing"]["resumed_from_step"] is not None
    assert all(torch.equal(v, w) for v, w in zip(first.state_dict().values(), again.state_dict().values(), strict=True))


LOADER = """
import sys
sys.modules["papa_surgery"] = None  # the healed checkpoint needs neither papa-surgery
sys.modules["peft"] = None  # nor peft
import torch, transformers
from safetensors.torch import load_file
folder, data = sys.argv[1], load_file(sys.argv[2])
model = transformers.AutoModel.from_pretrained(folder, trust_remote_code=True, attn_implementation="eager").eval()
inputs = {k: v for k, v in data.items() if k != "expected"}
with torch.no_grad():
    got = model(**inputs).last_hidden_state
print("DIFF", float((got - data["expected"]).abs().max()))
"""


@pytest.mark.parametrize("freeze", [False, True])
def test_a_healed_checkpoint_loads_in_a_fresh_process_without_papa_surgery_or_peft(source, tmp_path, freeze):
    from safetensors.torch import save_file

    model, tok, constants = source
    papa = convert(model, constants, HEADS, tokenizer=tok, storage="compact", compact_band=2, compact_rank=1)
    healed = heal(source, papa if freeze else None, train="lora", freeze_constants=freeze)
    out = save_checkpoint(healed, tmp_path / "healed", tokenizer=tok, recipe=healed.papa_recipe)
    recipe = json.loads((out / "papa_recipe.json").read_text())
    assert recipe["healing"]["train"] == "lora" and recipe["healing"]["heldout_after"]["loss"] > 0
    assert recipe["healing"]["freeze_constants"] is freeze
    card = (out / "README.md").read_text()
    assert card.count("## Healing") == 1
    assert ("the constants kept as stored" in card and "(constants frozen)" in card) is freeze
    assert ("plus the constants" in card) is not freeze
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = healed(**enc).last_hidden_state
    save_file({**{k: v.contiguous() for k, v in enc.items()}, "expected": expected}, str(tmp_path / "io.safetensors"))
    result = fresh_python(LOADER, str(out), str(tmp_path / "io.safetensors"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(result.stdout.split("DIFF")[1]) <= 1e-6


def test_a_healed_sentence_transformers_checkpoint_still_encodes(tiny, tmp_path):
    st = pytest.importorskip("sentence_transformers")
    from test_clients import _sentence_transformers_folder
    from transformers import AutoModel, AutoTokenizer

    folder = _sentence_transformers_folder(tiny, "bert", tmp_path)
    model, tok = AutoModel.from_pretrained(folder).eval(), AutoTokenizer.from_pretrained(folder)
    papa = convert(model, Constants.from_kind("uniform", 2, 4, L), HEADS, tokenizer=tok)
    healed = heal_model(papa, model, tok, CORPUS, HealOptions(**QUICK), batch_size=8, progress=False)
    record = healed.papa_recipe["healing"]
    assert record["objective"] == "layers+embedding"  # the source's pooling and normalisation
    assert record["heldout_after"]["sentence_cosine"] > record["heldout_before"]["sentence_cosine"]
    out = save_checkpoint(healed, tmp_path / "healed", tokenizer=tok, recipe=healed.papa_recipe, card=False)
    encoder = st.SentenceTransformer(str(out), device="cpu", trust_remote_code=True)
    got = encoder.encode(SENTENCES, convert_to_tensor=True)
    enc = tok(SENTENCES, padding=True, return_tensors="pt")
    with torch.no_grad():
        hidden = healed(**enc).last_hidden_state
    mask = enc["attention_mask"].unsqueeze(-1).float()
    by_hand = torch.nn.functional.normalize((hidden * mask).sum(1) / mask.sum(1), dim=-1)
    assert float((got - by_hand).abs().max()) <= 1e-5


def test_bad_teachers_and_options(source, tiny):
    import papa_surgery

    model, tok, _ = source
    papa = converted(source)
    with pytest.raises(ValueError, match="token embeddings differ"):
        heal_model(papa, tiny.model("bert", seed=1), tok, CORPUS, HealOptions(**QUICK), progress=False)
    with pytest.raises(ValueError, match="not the architecture"):
        heal_model(papa, tiny.model("roberta"), tok, CORPUS, HealOptions(**QUICK), progress=False)
    with pytest.raises(ValueError, match="teacher is a PAPA model"):
        heal_model(papa, converted(source), tok, CORPUS, HealOptions(**QUICK), progress=False)
    with pytest.raises(ValueError, match="heldout: 80 held-out examples leave none"):
        heal_model(papa, model, tok, CORPUS, HealOptions(heldout=80), progress=False)
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        papa_surgery.heal(papa, tok, CORPUS, teacher=model, stepz=3)
    with pytest.raises(ValueError, match="steps"):
        papa_surgery.heal(papa, tok, CORPUS, teacher=model, steps=0)
    with pytest.raises(ValueError, match="is not a PAPA model"):
        papa_surgery.heal(model, tok, CORPUS, teacher=model)
    with pytest.raises(ValueError, match="objective"):
        papa_surgery.heal(papa, tok, CORPUS, teacher=model, objective="embedding", steps=1, heldout=8)  # no ST


def test_public_heal_returns_a_new_model_and_leaves_the_input(source):
    import papa_surgery

    model, tok, _ = source
    papa = converted(source)
    start = state(papa)
    healed = papa_surgery.heal(papa, tok, CORPUS, teacher=model, progress=False, batch_size=8, **QUICK)
    assert healed is not papa and all(torch.equal(v, start[k]) for k, v in state(papa).items())
    assert type(healed).__name__ == type(papa).__name__ and healed.papa_recipe["healing"]["steps"] == 12
    assert healed.config.papa_kind == "average" and healed.config.papa_fraction == 0.75


def test_healing_stores_the_constants_back_in_the_checkpoints_own_compact_layout(source):
    """A checkpoint converted with its own band and rank is healed back into them, not into L's default layout
    (with which L=32 and the default band 16 would not even fit)."""
    import papa_surgery

    model, tok, constants = source
    papa = convert(model, constants, HEADS, tokenizer=tok, storage="compact", compact_band=2, compact_rank=1)
    healed = papa_surgery.heal(papa, tok, CORPUS, teacher=model, progress=False, batch_size=8, **QUICK)
    assert (healed.config.papa_compact_band, healed.config.papa_compact_rank) == (2, 1)


def test_cli_convert_with_heal_steps_and_heal_a_checkpoint(tiny, tmp_path):
    from click.testing import CliRunner

    from papa_surgery.cli import main

    src = tiny.save("bert", tmp_path / "src")
    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    runner = CliRunner()
    common = ["--corpus", str(tmp_path / "corpus.txt"), "--batch-size", "8"]
    convert_args = ["-q", "convert", str(src), "--fraction", "0.75", "--max-length", str(L), *common]
    healing = ["--heal-steps", "4", "--heal-heldout", "8", "--heal-warmup", "0"]
    result = runner.invoke(main, [*convert_args, *healing, "--out", str(tmp_path / "a")])
    assert result.exit_code == 0, result.output
    recipe = json.loads((tmp_path / "a" / "papa_recipe.json").read_text())
    assert recipe["healing"]["steps"] == 4 and recipe["healing"]["train"] == DEFAULT_TRAIN == "full"
    assert "corpus.txt" in recipe["healing"]["corpus"] and "corpus.txt" in recipe["corpus"]["description"]
    assert "--heal-steps 4" in recipe["command"]
    # an option given as 0 is used and recorded (0 == False: it was dropped as if not given)
    assert "warm-up over 0 of the steps" in recipe["healing"]["schedule"] and "--heal-warmup 0.0" in recipe["command"]
    cosines = [f"{recipe['healing'][f'heldout_{t}']['sentence_cosine']:.4f}" for t in ("before", "after")]
    assert (
        f"healed: full for 4 steps toward src on text file corpus.txt (64 of its examples trained on); held-out "
        f"sentence cosine {cosines[0]} -> {cosines[1]}" in result.output
    ), result.output
    # heal an unhealed checkpoint: the teacher must be named (the source was a local folder)
    result = runner.invoke(main, [*convert_args, "--out", str(tmp_path / "b")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["heal", str(tmp_path / "b"), *common, "--steps", "4", "--heldout", "8",
                                  "--out", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 2 and "--teacher" in result.output, result.output
    result = runner.invoke(main, ["-q", "heal", str(tmp_path / "b"), *common, "--steps", "4", "--heldout", "8",
                                  "--train", "full", "--teacher", str(src), "--out", str(tmp_path / "c")])  # fmt: skip
    assert result.exit_code == 0, result.output
    healing = json.loads((tmp_path / "c" / "papa_recipe.json").read_text())["healing"]
    assert healing["train"] == "full" and healing["command"].startswith("papa-surgery heal")
    cosines = f"{healing['heldout_before']['sentence_cosine']:.4f} -> {healing['heldout_after']['sentence_cosine']:.4f}"
    assert "healed: full for 4 steps toward src" in result.output and cosines in result.output, result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "c", "corpus.txt", "src"]  # no state left
    # a healing option without --heal-steps does nothing: refused
    result = runner.invoke(main, ["convert", str(src), "--fraction", "0.5", "--heal-train", "full", *common,
                                  "--out", str(tmp_path / "d")])  # fmt: skip
    assert result.exit_code == 2 and "--heal-train" in result.output and "--heal-steps" in result.output
    # the constants kept as converted; a mode that would train nothing is refused under convert's own flag names
    frozen = ["--heal-steps", "4", "--heal-heldout", "8", "--heal-freeze-constants"]
    result = runner.invoke(main, [*convert_args, *frozen, "--out", str(tmp_path / "e")])
    assert result.exit_code == 0, result.output
    recipe = json.loads((tmp_path / "e" / "papa_recipe.json").read_text())
    assert recipe["healing"]["freeze_constants"] is True and "--heal-freeze-constants" in recipe["command"]
    result = runner.invoke(main, [*convert_args, *frozen, "--heal-train", "constants", "--out", str(tmp_path / "f")])
    assert result.exit_code == 2 and "'--heal-freeze-constants'" in result.output, result.output
    assert not (tmp_path / "f").exists()


def test_a_model_with_no_constant_head_is_not_healed(tiny, tmp_path):
    """With no constant head the student is its teacher: healing could only move it away from its source (it did:
    hidden states up to 0.23 away after 2 steps). ``convert --fraction 0 --heal-steps`` is refused before the model
    loads, naming the flag; ``heal`` refuses such a checkpoint as CHECKPOINT (its positional name, not a
    ``--checkpoint`` flag that does not exist); the Python API says why. Nothing is written."""
    from click.testing import CliRunner

    import papa_surgery
    from papa_surgery.cli import main
    from papa_surgery.ranking.order import head_count

    src = tiny.save("bert", tmp_path / "src")
    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    runner = CliRunner()
    common = ["--corpus", str(tmp_path / "corpus.txt"), "--batch-size", "8", "--max-length", str(L)]
    result = runner.invoke(main, ["convert", str(src), "--fraction", "0", *common, "--heal-steps", "2",
                                  "--out", str(tmp_path / "a")])  # fmt: skip
    assert result.exit_code == 2 and "'--heal-steps'" in result.output, result.output
    assert "--fraction 0 makes no head constant" in " ".join(result.output.split())
    assert not (tmp_path / "a").exists()
    heads = tiny.model("bert").config.num_attention_heads * tiny.model("bert").config.num_hidden_layers
    small = 0.4 / heads  # rounds to no head: refused the same way, naming the smallest fraction that heals
    result = runner.invoke(main, ["convert", str(src), "--fraction", str(small), *common, "--heal-steps", "2",
                                  "--out", str(tmp_path / "a")])  # fmt: skip
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "'--heal-steps'" in result.output and "rounds to none" in said, result.output
    smallest = float(said.split("convert at --fraction ")[1].split()[0])  # the fraction it names makes one head
    assert (
        head_count(smallest, heads) == 1 and head_count(smallest - 0.001, heads) == 0 and not (tmp_path / "a").exists()
    )
    result = runner.invoke(main, ["-q", "convert", str(src), "--fraction", "0", *common, "--out", str(tmp_path / "z")])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["heal", str(tmp_path / "z"), "--corpus", str(tmp_path / "corpus.txt"),
                                  "--teacher", str(src), "--steps", "2", "--out", str(tmp_path / "h")])  # fmt: skip
    assert result.exit_code == 2 and "'CHECKPOINT'" in result.output and "--checkpoint" not in result.output
    assert "has no constant head" in " ".join(result.output.split()) and not (tmp_path / "h").exists()
    result = runner.invoke(main, ["heal", str(src), "--steps", "2", "--out", str(tmp_path / "h")])
    assert result.exit_code == 2 and "'CHECKPOINT'" in result.output and "not a PAPA checkpoint" in result.output
    papa, tok = papa_surgery.load(tmp_path / "z")
    with pytest.raises(ValueError, match="no constant head"):
        papa_surgery.heal(papa, tok, CORPUS, teacher=tiny.model("bert"), steps=2)


def test_heal_without_out_writes_beside_as_convert_does(tiny, tmp_path, monkeypatch):
    """``heal`` without ``--out`` writes ``<checkpoint's name>-healed`` in the working folder, as ``convert`` writes
    ``<model's name>-papa-<fraction>``; from inside the checkpoint, beside it (never into what it reads)."""
    src = tiny.save("bert", tmp_path / "src")
    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    common = ["--corpus", tmp_path / "corpus.txt", "--batch-size", 8]
    result = cli("convert", src, "--fraction", 1, "--max-length", L, *common, "--out", tmp_path / "ckpt")
    assert result.exit_code == 0, result.output
    heal = ["--teacher", src, *common, "--steps", 2, "--heldout", 8]
    monkeypatch.chdir(tmp_path)
    result = cli("heal", "ckpt/", *heal)
    assert result.exit_code == 0 and "wrote ckpt-healed" in result.output, result.output
    assert json.loads((tmp_path / "ckpt-healed" / "papa_recipe.json").read_text())["healing"]["steps"] == 2
    result = cli("heal", "ckpt", *heal)  # it exists now: replaced only with --overwrite, as convert's
    assert result.exit_code == 1 and "already exists; pass --overwrite" in " ".join(result.output.split())
    monkeypatch.chdir(tmp_path / "ckpt")  # from inside it: "." named by its folder, written beside it, not into it
    inside = sorted(p.name for p in (tmp_path / "ckpt").iterdir())
    result = cli("heal", ".", *heal, "--overwrite")
    assert result.exit_code == 0 and f"wrote {tmp_path / 'ckpt-healed'}" in result.output, result.output
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == inside


def test_without_a_corpus_healing_trains_on_the_bundled_ewt_sentences(tiny, tmp_path):
    """No --corpus: convert calibrates on the default corpus (offline the WikiText excerpt) and heals on the default
    healing corpus (the bundled UD English-EWT sentences and the excerpt), as `heal` and papa_surgery.heal do; a
    corpus given is used for both (the test above)."""
    from click.testing import CliRunner

    import papa_surgery
    from papa_surgery.cli import main

    src = tiny.save("bert", tmp_path / "src")
    runner = CliRunner()
    quick = ["--batch-size", "8", "--max-examples", "64"]
    healing = ["--heal-steps", "2", "--heal-heldout", "8"]
    result = runner.invoke(main, ["-q", "convert", str(src), "--fraction", "1", "--max-length", str(L), *quick,
                                  *healing, "--out", str(tmp_path / "a")])  # fmt: skip
    assert result.exit_code == 0, result.output
    recipe = json.loads((tmp_path / "a" / "papa_recipe.json").read_text())
    assert "wikitext2_valid_excerpt" in recipe["corpus"]["description"]
    assert recipe["healing"]["corpus"].startswith("the default healing corpus: the bundled UD English-EWT")
    assert recipe["healing"]["training_examples"] + recipe["healing"]["heldout_examples"] == 64  # --max-examples
    shown = runner.invoke(main, ["inspect", str(tmp_path / "a")]).output  # which text healed it, beside calibration's
    assert "steps toward" in shown and "on the default healing corpus: the bundled UD English-EWT" in shown, shown
    result = runner.invoke(main, ["-q", "heal", str(tmp_path / "a"), *quick, "--steps", "2", "--heldout", "8",
                                  "--teacher", str(src), "--out", str(tmp_path / "b")])  # fmt: skip
    assert result.exit_code == 0, result.output
    healing = json.loads((tmp_path / "b" / "papa_recipe.json").read_text())["healing"]
    assert "ud_ewt_train_sentences" in healing["corpus"]
    # inspect shows the command that healed it beside the one that converted it (one line when they are one command)
    assert "heal command" not in shown and "--heal-steps 2" in shown, shown
    shown = " ".join(runner.invoke(main, ["inspect", str(tmp_path / "b")]).output.split())
    assert "command papa-surgery convert '<local model>'" in shown, shown
    # recorded as a user retypes it, no local path (the recipe is published): the folder's name, the teacher's Hub id
    assert "heal command papa-surgery heal a --max-examples 64 --steps 2" in shown, shown
    assert "--teacher '<local model>'" in healing["command"] and str(tmp_path) not in healing["command"], healing
    help_text = " ".join(runner.invoke(main, ["heal", "--help"]).output.split())
    assert "Default: the texts bundled with papa-surgery, the UD English-EWT training sentences" in help_text
    # a checkpoint of sentence-pair constants: refused before anything loads, naming --corpus
    pairs = (f"{a}\t{b}" for a, b in zip(CORPUS[:-1], CORPUS[1:], strict=True))
    (tmp_path / "pairs.txt").write_text("\n".join(pairs) + "\n")
    pair_args = ["--pairs", "--corpus", str(tmp_path / "pairs.txt"), "--max-length", str(L), "--batch-size", "8"]
    result = runner.invoke(main, ["-q", "convert", str(src), "--fraction", "1", *pair_args, "--out", tmp_path / "p"])
    assert result.exit_code == 0, result.output
    result = runner.invoke(main, ["heal", str(tmp_path / "p"), "--teacher", str(src), "--out", str(tmp_path / "q")])
    assert result.exit_code == 2 and "'--corpus'" in result.output and "pairs" in result.output, result.output
    assert not (tmp_path / "q").exists()
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    papa = convert(model, Constants.from_kind("uniform", 2, 4, L), HEADS, tokenizer=tok, fraction=0.75)
    healed = papa_surgery.heal(papa, tok, teacher=model, progress=False, batch_size=8, max_examples=64, **QUICK)
    assert "ud_ewt_train_sentences" in healed.papa_recipe["healing"]["corpus"]


def test_heal_options_defaults_come_from_the_registry():
    from papa_surgery import registry

    assert HealOptions().learning_rate() == registry.TRAIN_MODES[registry.DEFAULT_TRAIN].lr
    assert HealOptions(train="full").learning_rate() == registry.TRAIN_MODES["full"].lr
    assert HealOptions(train="constants").learning_rate() == HealOptions().constants_lr
    assert HealOptions(steps=10).evaluation_interval() == 2
    with pytest.raises(ValueError, match="train"):
        HealOptions(train="everything")


def test_a_probe_sweep_scores_each_kind_converted_and_healed_and_the_report_shows_both(tiny, tmp_path):
    from test_sweep import write_sst2

    from papa_surgery.experiments import SweepConfig, run_sweep
    from papa_surgery.report import table_kinds

    src = tiny.save("bert", tmp_path / "src")
    data = write_sst2(tmp_path / "data", train=40, dev=16)
    heal_options = {"steps": 3, "heldout": 8, "train": "lora"}
    cfg = SweepConfig(model=str(src), tasks=("sst2",), fractions=(0.0, 1.0), seeds=1, data_dir=str(data), epochs=1,
                      max_length=L, calibration_batch_size=8, heal_options=heal_options)  # fmt: skip
    rows = run_sweep(cfg, tmp_path / "rows.jsonl", progress=False)
    by = {(r["kind"], r["fraction"]): r for r in rows}
    assert sorted(by) == [("average", 0.0), ("average", 1.0), ("average+healed", 0.0), ("average+healed", 1.0)]
    assert by[("average+healed", 0.0)]["reused_from"]["kind"] == "average"  # fraction 0: nothing to heal
    healing = by[("average+healed", 1.0)]["healing"]
    assert healing["steps"] == 3 and healing["train"] == "lora" and "sst2 training texts" in healing["corpus"]
    assert healing["heldout_sentence_cosine_after"] is not None and "healing" not in by[("average", 1.0)]
    assert by[("average+healed", 1.0)]["options"]["heal_options"]["steps"] == 3
    table = table_kinds(rows, fraction=1.0)
    assert table.index("| average |") < table.index("| average+healed |")
    # Resuming with other healing options is refused, naming the option.
    other = SweepConfig(**{**cfg.__dict__, "heal_options": {**heal_options, "steps": 4}})
    with pytest.raises(ValueError, match="heal_options"):
        run_sweep(other, tmp_path / "rows.jsonl", progress=False)
    with pytest.raises(ValueError, match="labeled-average"):
        SweepConfig(model=str(src), kinds=("labeled-average",), heal_options=heal_options).validate()
    # --corpus default: calibrated on the default corpus, healed on the default healing corpus
    default = SweepConfig(**{**cfg.__dict__, "corpus": "default", "fractions": (1.0,), "max_calibration_examples": 64})
    rows = run_sweep(default, tmp_path / "default.jsonl", progress=False)
    healed = next(r for r in rows if r["kind"] == "average+healed")
    assert "ud_ewt_train_sentences" in healed["healing"]["corpus"]
    # Rows record every healing option resolved, so a Python sweep given a few of them resumes, as does one given
    # them all; the same options in other words are the same.
    assert healed["options"]["heal_options"]["lr"] == 3e-3 and healed["options"]["heal_options"]["eval_every"] == 1
    every = {**healed["options"]["heal_options"], "lr": None}
    for given in (heal_options, every):
        again = SweepConfig(**{**default.__dict__, "heal_options": given})
        assert [r["score"] for r in run_sweep(again, tmp_path / "default.jsonl", progress=False)] == [
            r["score"] for r in rows
        ]
    with pytest.raises(ValueError, match=r"heal_options\['steps'\]=3 \(this run: 4\)"):
        run_sweep(
            SweepConfig(**{**default.__dict__, "heal_options": {**heal_options, "steps": 4}}),
            tmp_path / "default.jsonl",
        )
    # A file whose default-corpus rows healed before the default healing corpus (on calibration's corpus, recording
    # no healing text) is not resumed with new healed cells beside them: the two would not compare.
    old = {**healed, "healing": {k: v for k, v in healed["healing"].items() if k != "corpus"}}
    lines = [json.dumps(old if r is healed else r) for r in rows]
    (tmp_path / "old.jsonl").write_text("\n".join(lines) + "\n", encoding="utf-8")
    more = SweepConfig(**{**default.__dict__, "fractions": (0.5, 1.0)})
    refused = "healed on the calibration corpus .the row records no healing text.*default healing corpus.*another"
    with pytest.raises(ValueError, match=refused):
        run_sweep(more, tmp_path / "old.jsonl", progress=False)
    assert (tmp_path / "old.jsonl").read_text(encoding="utf-8").count("\n") == len(rows)  # nothing appended
    assert len(run_sweep(more, tmp_path / "default.jsonl", progress=False)) == 4  # rows healed on it: resumed


def test_cli_probe_sweep_resumed_with_another_healing_option_is_refused_naming_the_flag(tiny, tmp_path):
    from click.testing import CliRunner
    from test_sweep import write_sst2

    from papa_surgery.cli import main

    src = tiny.save("bert", tmp_path / "src")
    data = write_sst2(tmp_path / "data", train=40, dev=16)
    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    sweep = ["-q", "probe", str(src), "--task", "sst2", "--data-dir", str(data), "--fractions", "1", "--epochs", "1",
             "--max-length", str(L), "--corpus", str(tmp_path / "corpus.txt"), "--out", str(tmp_path / "rows.jsonl"),
             "--heal-heldout", "8", "--heal-train", "lora"]  # fmt: skip
    runner = CliRunner()
    result = runner.invoke(main, [*sweep, "--heal-steps", "2"])
    assert result.exit_code == 0, result.output
    written = (tmp_path / "rows.jsonl").read_text()
    assert runner.invoke(main, [*sweep, "--heal-steps", "2"]).exit_code == 0  # the same options: resumed, all done
    result = runner.invoke(main, [*sweep, "--heal-steps", "3"])
    assert result.exit_code != 0 and "--heal-steps 2 (this run: 3)" in " ".join(result.output.split()), result.output
    assert (tmp_path / "rows.jsonl").read_text() == written


def test_cli_heal_stopped_midway_writes_nothing_and_the_rerun_resumes(tiny, tmp_path, monkeypatch):
    from click.testing import CliRunner

    from papa_surgery.cli import main
    from papa_surgery.healing import state as state_module

    src = tiny.save("bert", tmp_path / "src")
    (tmp_path / "corpus.txt").write_text("\n".join(CORPUS) + "\n")
    runner = CliRunner()
    common = ["--corpus", str(tmp_path / "corpus.txt"), "--batch-size", "8", "--max-length", str(L)]
    assert runner.invoke(main, ["-q", "convert", str(src), "--fraction", "0.75", *common, "--out",
                                str(tmp_path / "ckpt")]).exit_code == 0  # fmt: skip
    heal_args = ["-q", "heal", str(tmp_path / "ckpt"), *common[:4], "--teacher", str(src), "--train", "full",
                 "--steps", "6", "--eval-every", "2", "--heldout", "8", "--lr", "1e-3"]  # fmt: skip
    assert runner.invoke(main, [*heal_args, "--out", str(tmp_path / "whole")]).exit_code == 0
    real_save = state_module.HealState.save

    def save_then_stop(self, *args, **kwargs):
        real_save(self, *args, **kwargs)
        if args[-1] == 4:
            raise KeyboardInterrupt  # Ctrl-C right after the state of step 4 was written

    monkeypatch.setattr(state_module.HealState, "save", save_then_stop)
    result = runner.invoke(main, [*heal_args, "--out", str(tmp_path / "resumed")])
    assert result.exit_code == 130, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert "resumed" not in names and not [n for n in names if "staging" in n]  # no checkpoint, no half of one
    assert ".resumed.papa-heal-state.safetensors" in names  # the resume state, whole
    monkeypatch.setattr(state_module.HealState, "save", real_save)
    result = runner.invoke(main, [*heal_args, "--out", str(tmp_path / "resumed")])
    assert result.exit_code == 0, result.output
    names = sorted(p.name for p in tmp_path.iterdir())
    assert ".resumed.papa-heal-state.safetensors" not in names  # removed once the checkpoint is written
    from safetensors.torch import load_file

    whole, resumed = (load_file(tmp_path / n / "model.safetensors") for n in ("whole", "resumed"))
    assert whole.keys() == resumed.keys() and all(torch.equal(whole[k], resumed[k]) for k in whole)
    record = json.loads((tmp_path / "resumed" / "papa_recipe.json").read_text())["healing"]
    assert record["resumed_from_step"] == 4


@pytest.mark.parametrize("modes", [("mean",), ("cls", "max"), ("weightedmean", "lasttoken"), ("mean_sqrt_len_tokens",)])
def test_the_sentence_pipeline_equals_sentence_transformers_encode(tiny, tmp_path, modes):
    """healing/sentence.py rebuilds Pooling, Dense and Normalize from the folder's files: the same numbers as
    ``SentenceTransformer.encode`` on padded batches of mixed lengths."""
    st = pytest.importorskip("sentence_transformers")
    from sentence_transformers import models

    from papa_surgery.healing.sentence import sentence_pipeline

    source = tiny.save("bert", tmp_path / "hf")
    encoder = models.Transformer(str(source), max_seq_length=L)
    width = encoder.get_word_embedding_dimension()
    pooling = models.Pooling(width, pooling_mode=list(modes))
    torch.manual_seed(0)
    dense = models.Dense(pooling.get_sentence_embedding_dimension(), 8, activation_function=torch.nn.Tanh())
    model = st.SentenceTransformer(modules=[encoder, pooling, dense, models.Normalize()], device="cpu")
    model.save(str(tmp_path / "st"))
    pipeline, why_not = sentence_pipeline(str(tmp_path / "st"))
    assert pipeline is not None, why_not
    texts = CORPUS[:6]
    expected = torch.as_tensor(model.encode(texts, batch_size=6, convert_to_numpy=True))
    tok, hf = model.tokenizer, model[0].auto_model.eval()
    enc = tok(texts, padding=True, truncation=True, max_length=L, return_tensors="pt")
    with torch.no_grad():
        got = pipeline(hf(**enc).last_hidden_state, enc["attention_mask"])
    assert got.shape == expected.shape and float((got - expected).abs().max()) <= 1e-5


def test_a_sweep_of_a_labelled_kind_with_healing_names_heal_steps(tiny_folder, tmp_path):
    """The refusal of healing a labelled kind's cells named ``--heal-options``, which no command has: it names the
    flag that asked for healing (``heal_options`` in Python, where that is the argument)."""
    from click.testing import CliRunner

    from papa_surgery.cli import main

    args = ["probe", str(tiny_folder("bert")), "--task", "sst2", "--kind", "labeled-average", "--heal-steps", "10"]
    result = CliRunner().invoke(main, [*args, "--out", str(tmp_path / "r.jsonl")])
    said = " ".join(result.output.split())
    assert result.exit_code == 2 and "'--heal-steps'" in said and "--heal-options" not in said, said
    assert "labeled-average" in said and not (tmp_path / "r.jsonl").exists()


def test_a_healing_error_names_the_option_as_the_command_spells_it(tiny_folder, tmp_path):
    """``convert``/``probe --heal-steps`` with too few examples for the held-out split named ``--heldout``, which only
    ``heal`` has: they name ``--heal-heldout``; ``heal`` still names ``--heldout``."""
    from click.testing import CliRunner
    from test_sweep import write_sst2

    from papa_surgery.cli import main

    src = str(tiny_folder("bert"))
    (tmp_path / "c.txt").write_text("\n".join(CORPUS[:16]) + "\n")
    few = ["--corpus", str(tmp_path / "c.txt"), "--max-length", str(L)]
    runner = CliRunner()
    result = runner.invoke(
        main, ["convert", src, "--fraction", "1", *few, "--heal-steps", "2", "--out", str(tmp_path / "a")]
    )
    assert result.exit_code == 2 and "'--heal-heldout'" in result.output, result.output
    assert not (tmp_path / "a").exists()
    data = write_sst2(tmp_path / "data", train=16, dev=8)
    sweep = ["probe", src, "--task", "sst2", "--data-dir", str(data), "--fractions", "1", "--max-length", str(L)]
    result = runner.invoke(main, [*sweep, "--heal-steps", "2", "--out", str(tmp_path / "r.jsonl")])
    assert result.exit_code == 2 and "'--heal-heldout'" in result.output, result.output
    assert (
        runner.invoke(main, ["-q", "convert", src, "--fraction", "1", *few, "--out", str(tmp_path / "b")]).exit_code
        == 0
    )
    result = runner.invoke(main, ["heal", str(tmp_path / "b"), "--corpus", str(tmp_path / "c.txt"), "--teacher", src,
                                  "--steps", "2", "--out", str(tmp_path / "h")])  # fmt: skip
    assert result.exit_code == 2 and "'--heldout'" in result.output, result.output


def test_healing_that_moves_away_from_the_source_says_so(source, caplog):
    """Healing that ends further from the source on its held-out text (too few steps, a learning rate too high) was
    written silently; a warning now gives both agreements and what to do. A run that gets closer warns nothing."""
    import logging

    model, tok, _ = source
    papa = converted(source)
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        healed = heal_model(papa, model, tok, CORPUS, HealOptions(**{**QUICK, "lr": 1.0}), progress=False)
    record = healed.papa_recipe["healing"]
    before, after = record["heldout_before"]["sentence_cosine"], record["heldout_after"]["sentence_cosine"]
    said = [r.getMessage() for r in caplog.records if "moved the model away" in r.getMessage()]
    assert after < before and len(said) == 1 and f"{before:.4f} -> {after:.4f}" in said[0], (before, after, said)
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        healed = heal_model(converted(source), model, tok, CORPUS, HealOptions(**QUICK), progress=False)
    record = healed.papa_recipe["healing"]
    assert record["heldout_after"]["sentence_cosine"] >= record["heldout_before"]["sentence_cosine"]
    assert not [r for r in caplog.records if "moved the model away" in r.getMessage()]
