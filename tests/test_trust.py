"""A checkpoint you can trust: its format is gated, and no code of its runs unless the user asks (issue 31, items 1-2).

Through the doors a user takes: ``papa_surgery.load``, the command line, and ``AutoModel.from_pretrained`` in a fresh
process where papa-surgery is not importable (the checkpoint's own shipped code).
"""

from __future__ import annotations

import json
import shutil
import sys
import textwrap
import warnings
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner
from fake_hub import build_tiny_checkpoint
from test_checkpoint import floor_python, fresh_python

import papa_surgery
from papa_surgery.cli import main
from papa_surgery.hub_code.checkpoint_format import FORMAT_VERSION, OLDEST_FORMAT

TEXTS = ["the cat sat on the mat", "a dog"]
LIBRARY_MODULE = "papa_surgery.hub_code.modeling_papa"

# The shipped code alone: papa_surgery made unimportable, the folder loaded as a user without it loads it.
STANDALONE = textwrap.dedent(
    """
    import json, sys, warnings
    sys.modules["papa_surgery"] = None
    import transformers
    warnings.simplefilter("always")
    try:
        with warnings.catch_warnings(record=True) as caught:
            model = transformers.AutoModel.from_pretrained(sys.argv[1], trust_remote_code=True)
    except Exception as err:
        print(json.dumps({"refused": str(err)}))
    else:
        print(json.dumps({
            "module": type(model).__module__,
            "format": model.config.papa_format_version,
            "attributes": sorted(k for k in vars(model.config) if k.startswith("papa_")),
            "warnings": [str(w.message) for w in caught if issubclass(w.category, UserWarning)],
        }))
    """
)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """(folder, in-memory PAPA model, tokenizer) of a tiny BERT checkpoint, never changed by a test."""
    return build_tiny_checkpoint(tmp_path_factory.mktemp("trust") / "tiny-papa")


@pytest.fixture
def checkpoint(built, tmp_path):
    """A fresh copy of the checkpoint folder, for a test to alter."""
    folder = tmp_path / "tiny-papa"
    shutil.copytree(built[0], folder)
    return folder


def edit_config(folder: Path, **changes) -> None:
    """Set (or, with ``None``, remove) fields of ``config.json``."""
    config = json.loads((folder / "config.json").read_text())
    for key, value in changes.items():
        if value is None:
            config.pop(key, None)
        else:
            config[key] = value
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def plant_marker(folder: Path, marker: Path) -> None:
    """Append a line that writes ``marker`` to every shipped entry file, as an attacker's edit would."""
    for name in ("modeling_papa.py", "configuration_papa.py"):
        with (folder / name).open("a", encoding="utf-8") as f:
            f.write(f"\nopen({str(marker)!r}, 'a').write({name!r} + '\\n')\n")


def outputs(model, tokenizer) -> torch.Tensor:
    enc = tokenizer(TEXTS, return_tensors="pt", padding=True)
    with torch.no_grad():
        return model(**enc).last_hidden_state


def standalone(folder: Path, cwd: Path, python: str = sys.executable) -> dict:
    """What ``AutoModel.from_pretrained(folder, trust_remote_code=True)`` does in a fresh process, no papa-surgery."""
    result = fresh_python(STANDALONE, str(folder), cwd=cwd, python=python)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------------------------ the format gate


def test_a_newer_format_is_refused_by_papa_surgery_naming_both_versions_and_the_fixes(checkpoint):
    edit_config(checkpoint, papa_format_version=99)
    with pytest.raises(ValueError) as caught:
        papa_surgery.load(str(checkpoint))
    message = str(caught.value)
    assert f"is PAPA format v99, newer than the v{FORMAT_VERSION} papa-surgery" in message
    assert "pip install -U papa-surgery" in message and "trust_remote_code=True" in message
    assert "\n" not in message


def test_a_newer_format_is_refused_on_the_command_line_in_its_words(checkpoint, tmp_path):
    edit_config(checkpoint, papa_format_version=99)
    result = CliRunner().invoke(
        main, ["calibrate", str(checkpoint), "--kind", "uniform", "--out", str(tmp_path / "c.safetensors")]
    )
    assert result.exit_code == 1, result.output
    assert "format v99" in result.output and "pass --trust-remote-code" in result.output
    inspected = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert inspected.exit_code == 1
    assert "would not load" in inspected.output and f"format v99, newer than the v{FORMAT_VERSION}" in inspected.output


def assert_shipped_code_gates_the_format(checkpoint: Path, tmp_path: Path, python: str = sys.executable) -> None:
    """Format 99 refused, and a config without a format read as format 1, by the shipped code alone."""
    edit_config(checkpoint, papa_format_version=99)
    refused = standalone(checkpoint, tmp_path, python)["refused"]
    assert f"this PAPA checkpoint is format v99, newer than the v{FORMAT_VERSION} this code reads" in refused
    assert "pip install -U papa-surgery" in refused and "revision" in refused
    edit_config(checkpoint, papa_format_version=None)
    assert standalone(checkpoint, tmp_path, python)["format"] == OLDEST_FORMAT


def test_the_shipped_code_gates_the_format_without_papa_surgery(checkpoint, tmp_path):
    assert_shipped_code_gates_the_format(checkpoint, tmp_path)


def test_the_shipped_code_gates_the_format_on_the_oldest_supported_transformers(checkpoint, tmp_path):
    python = floor_python()
    if python is None:
        pytest.skip("no floor interpreter: scripts/test.sh makes .venv-floor (or set PAPA_FLOOR_PYTHON)")
    assert_shipped_code_gates_the_format(checkpoint, tmp_path, python)


@pytest.mark.parametrize("value", ["2", 0, True])
def test_a_format_that_is_no_format_number_is_refused(checkpoint, value):
    edit_config(checkpoint, papa_format_version=value)
    with pytest.raises(ValueError, match="which is no PAPA format"):
        papa_surgery.load(str(checkpoint))


def test_a_config_without_a_format_reads_as_the_oldest(checkpoint):
    edit_config(checkpoint, papa_format_version=None)
    model, _ = papa_surgery.load(str(checkpoint))
    assert model.config.papa_format_version == OLDEST_FORMAT == 1
    inspected = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert inspected.exit_code == 0, inspected.output
    assert "format          v1," in inspected.output


def test_a_compact_checkpoint_without_a_format_computes_as_format_1(tmp_path, tiny_folder):
    """Format 1 clamps compact constants at 0: a config stating no format must get that, not format 2's numbers."""
    model, tok = papa_surgery.load(str(tiny_folder("bert")))
    constants = papa_surgery.calibrate(model, tok, kind="toeplitz", max_length=16)
    ranking = papa_surgery.rank("first-to-last", constants=constants)
    papa = papa_surgery.convert(
        model, constants, ranking, 1.0, tokenizer=tok, storage="compact", compact_band=2, compact_rank=2
    )
    folder = papa_surgery.save(papa, tmp_path / "compact", tokenizer=tok, card=False)
    stated, _ = papa_surgery.load(str(folder))
    edit_config(folder, papa_format_version=None)
    unstated, _ = papa_surgery.load(str(folder))
    assert [compact_layout(m).clamped for m in (stated, unstated)] == [False, True]
    # a newer format: inspect says that, not five shape problems of compact parts it reads as this format's
    edit_config(folder, papa_format_version=99)
    inspected = CliRunner().invoke(main, ["inspect", str(folder)])
    assert inspected.exit_code == 1 and inspected.output.count("PROBLEM") == 1, inspected.output
    assert "format v99" in inspected.output and "do not match" not in inspected.output


def compact_layout(model):
    """The compact layout the model's first layer with constant heads computes with."""
    return next(m.papa_compact_layout for m in model.modules() if hasattr(m, "papa_compact_layout"))


def test_unknown_papa_fields_are_named_in_one_warning_and_ignored(checkpoint, built, tmp_path):
    _, papa, tokenizer = built
    edit_config(checkpoint, papa_from_a_newer_release=[1, 2])
    with pytest.warns(UserWarning, match=r"\['papa_from_a_newer_release'\] that this code .* does not know") as seen:
        model, tok = papa_surgery.load(str(checkpoint))
    assert len([w for w in seen if "papa_from_a_newer_release" in str(w.message)]) == 1  # config read twice, said once
    assert not hasattr(model.config, "papa_from_a_newer_release")
    torch.testing.assert_close(outputs(model, tok), outputs(papa, tokenizer), atol=0, rtol=0)
    result = standalone(checkpoint, tmp_path)
    assert "papa_from_a_newer_release" not in result["attributes"]
    assert any("papa_from_a_newer_release" in w and "ignored" in w for w in result["warnings"])
    inspected = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert inspected.exit_code == 0 and "ignored fields  papa_from_a_newer_release" in inspected.output


def test_the_current_checkpoints_state_their_format_and_warn_nothing(built):
    folder, _, _ = built
    assert json.loads((folder / "config.json").read_text())["papa_format_version"] == FORMAT_VERSION
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        papa_surgery.load(str(folder))


def test_healing_an_old_format_checkpoint_writes_the_current_format(tmp_path, tiny_folder):
    source, tok = papa_surgery.load(str(tiny_folder("bert")))
    constants = papa_surgery.calibrate(source, tok, kind="toeplitz", max_length=32)
    ranking = papa_surgery.rank("first-to-last", constants=constants)
    papa = papa_surgery.convert(source, constants, ranking, 0.5, tokenizer=tok, storage="compact")
    folder = papa_surgery.save(papa, tmp_path / "old", tokenizer=tok, card=False)
    edit_config(folder, papa_format_version=1)
    old, _ = papa_surgery.load(str(folder))
    corpus = ["the cat sat on the mat", "a dog ran off", "it was a good movie"] * 4
    healed = papa_surgery.heal(old, tok, corpus, teacher=source, steps=1, train="constants", heldout=2, progress=False)
    out = papa_surgery.save(healed, tmp_path / "healed", tokenizer=tok, card=False)
    assert json.loads((out / "config.json").read_text())["papa_format_version"] == FORMAT_VERSION


# ------------------------------------------------------------------------------------------ no code runs unasked


def test_an_altered_checkpoint_loads_through_papa_surgery_without_running_its_files(checkpoint, built, tmp_path):
    _, papa, tokenizer = built
    marker = tmp_path / "ran.txt"
    plant_marker(checkpoint, marker)
    model, tok = papa_surgery.load(str(checkpoint))
    assert type(model).__module__ == LIBRARY_MODULE
    torch.testing.assert_close(outputs(model, tok), outputs(papa, tokenizer), atol=0, rtol=0)
    result = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert result.exit_code == 0, result.output
    assert not marker.exists()


def test_an_altered_checkpoint_is_not_run_by_a_command_that_loads_it(checkpoint, tmp_path):
    marker = tmp_path / "ran.txt"
    plant_marker(checkpoint, marker)
    data = tmp_path / "data" / "glue" / "sst2"
    data.mkdir(parents=True)
    rows = [("the papa model is constant", 1), ("a text of attention heads", 0)] * 8
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    out = tmp_path / "r.jsonl"
    args = ["probe", str(checkpoint), "--task", "sst2", "--data-dir", str(tmp_path / "data"), "--seeds", "1"]
    result = CliRunner().invoke(main, [*args, "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert len(out.read_text().splitlines()) == 1 and not marker.exists()
    result = CliRunner().invoke(main, [*args, "--trust-remote-code", "--out", str(tmp_path / "trusted.jsonl")])
    assert result.exit_code == 0, result.output
    assert marker.exists()


def test_asking_for_the_folder_code_runs_it(checkpoint, built, tmp_path):
    _, papa, tokenizer = built
    marker = tmp_path / "ran.txt"
    plant_marker(checkpoint, marker)
    model, tok = papa_surgery.load(str(checkpoint), trust_remote_code=True)
    assert type(model).__module__.startswith("transformers_modules.")
    assert set(marker.read_text().split()) == {"modeling_papa.py", "configuration_papa.py"}
    torch.testing.assert_close(outputs(model, tok), outputs(papa, tokenizer), atol=0, rtol=0)


AFTER_A_LOAD = textwrap.dedent(
    """
    import json, sys, warnings
    warnings.simplefilter("ignore")
    import transformers
    import papa_surgery
    papa_surgery.load(sys.argv[1])  # the library's classes, for this load only
    model = transformers.AutoModel.from_pretrained(sys.argv[2], trust_remote_code=True)
    print(json.dumps({"module": type(model).__module__}))
    """
)


def test_a_papa_surgery_load_leaves_transformers_to_run_the_code_a_user_asks_for(checkpoint, built, tmp_path):
    """After ``papa_surgery.load(ckpt)`` the library's classes stayed registered with transformers, which prefers them
    to a folder's code: the user's own ``AutoModel.from_pretrained(other, trust_remote_code=True)`` in the same
    process ran papa-surgery's classes, not the checkpoint's, and refused a newer format its own code reads."""
    marker = tmp_path / "ran.txt"
    plant_marker(checkpoint, marker)
    result = fresh_python(AFTER_A_LOAD, str(built[0]), str(checkpoint), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert json.loads(result.stdout.strip().splitlines()[-1])["module"].startswith("transformers_modules.")
    assert set(marker.read_text().split()) == {"modeling_papa.py", "configuration_papa.py"}


def test_finetune_trains_the_checkpoints_own_code_when_asked_to_run_it(checkpoint, tmp_path, monkeypatch):
    """``finetune --trust-remote-code`` ran the folder's code to load it, then trained papa-surgery's own class."""
    import transformers

    data = tmp_path / "data" / "glue" / "sst2"
    data.mkdir(parents=True)
    rows = [("the papa model is constant", 1), ("a text of attention heads", 0)] * 8
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "".join(f"{s}\t{y}\n" for s, y in rows))
    trained, init = [], transformers.Trainer.__init__
    monkeypatch.setattr(
        transformers.Trainer, "__init__", lambda self, *a, **k: trained.append(k["model"]) or init(self, *a, **k)
    )  # noqa: E501
    for trust in (True, False):
        model, tok = papa_surgery.load(str(checkpoint), trust_remote_code=trust)
        papa_surgery.finetune(model, tok, "sst2", data_dir=str(tmp_path / "data"), epochs=1, progress=False)
    shipped, own = (type(m).__module__ for m in trained)
    assert shipped.startswith("transformers_modules.") and own == "papa_surgery.hub_code.modeling_papa"


def test_a_folder_that_ships_no_code_cannot_be_asked_to_run_it(checkpoint):
    edit_config(checkpoint, auto_map=None)
    with pytest.raises(ValueError, match="ships no model code of its own .* load it without trust_remote_code=True"):
        papa_surgery.load(str(checkpoint), trust_remote_code=True)
    model, _ = papa_surgery.load(str(checkpoint))
    assert type(model).__module__ == LIBRARY_MODULE


HUB_LOADER = textwrap.dedent(
    """
    import json, sys, torch, papa_surgery
    model, tok = papa_surgery.load(sys.argv[1])
    with torch.no_grad():
        out = model(**tok(json.loads(sys.argv[2]), return_tensors="pt", padding=True)).last_hidden_state
    print(json.dumps({"module": type(model).__module__, "out": out.tolist()}))
    """
)


def test_a_hub_checkpoint_loads_with_the_library_classes_without_trust_remote_code(
    checkpoint, built, fake_hub, tmp_path
):
    """A user's process: papa-surgery installed, the Hub at HF_ENDPOINT (set before huggingface_hub is imported)."""
    import os
    import subprocess
    import sys

    from papa_surgery.conversion import hub

    _, papa, tokenizer = built
    marker = tmp_path / "ran.txt"
    plant_marker(checkpoint, marker)
    hub.push(checkpoint, "user/tiny-papa", token="hf_user_token", endpoint=fake_hub.endpoint)
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HF_ENDPOINT": fake_hub.endpoint,
        "HF_HOME": str(tmp_path / "fresh_hf_home"),
        "HF_TOKEN": "hf_user_token",
        "HF_HUB_OFFLINE": "0",
        "TRANSFORMERS_OFFLINE": "0",
        "HF_HUB_DISABLE_TELEMETRY": "1",
        "HF_HUB_DISABLE_XET": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-c", HUB_LOADER, "user/tiny-papa", json.dumps(TEXTS)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["module"] == LIBRARY_MODULE and not marker.exists()
    torch.testing.assert_close(torch.tensor(result["out"]), outputs(papa, tokenizer), atol=1e-6, rtol=1e-6)
    assert any(p.endswith("/config.json") for _, p in fake_hub.requests if "/resolve/" in p)


@pytest.mark.parametrize("command", ["calibrate", "rank", "convert", "heal", "analyze", "probe", "finetune"])
def test_every_command_that_loads_a_model_takes_trust_remote_code(command):
    result = CliRunner().invoke(main, [command, "--help"])
    assert result.exit_code == 0 and "--trust-remote-code" in result.output


@pytest.mark.parametrize("command", ["inspect", "push", "report"])
def test_commands_that_load_no_model_do_not(command):
    assert "--trust-remote-code" not in CliRunner().invoke(main, [command, "--help"]).output


def test_inspect_asks_for_the_code_files_a_checkpoint_itself_imports(checkpoint):
    """A checkpoint saved before a sibling file existed (here: before compat.py) is complete with what its own code
    imports; a file its code imports and the folder lacks is named."""
    (checkpoint / "compat.py").unlink()
    for name in ("modeling_papa.py", "configuration_papa.py"):
        path = checkpoint / name
        path.write_text("".join(ln for ln in path.read_text().splitlines(True) if not ln.startswith("from .compat")))
    assert CliRunner().invoke(main, ["inspect", str(checkpoint)]).exit_code == 0
    (checkpoint / "slot_plan.py").unlink()
    result = CliRunner().invoke(main, ["inspect", str(checkpoint)])
    assert result.exit_code == 1 and "missing model code slot_plan.py" in result.output


def test_a_source_that_ships_code_of_its_own_says_it_was_not_run(tiny_folder, tmp_path, caplog):
    """A source folder whose config names model code of its own (``auto_map``) loads with transformers' registered
    class, running none of it, as asked; it said nothing, though such a model's own code may compute something else.
    One warning names the code and the class used. No warning where the code is a class of the same name (the
    native reimplementation papa-surgery supports, as for Nomic Embed), only a config or tokenizer, or none."""
    import logging
    import shutil

    def warned(**config) -> list[str]:
        edit_config(src, **config)
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="papa_surgery"):
            model, _ = papa_surgery.load(str(src))
        assert type(model).__name__ == "BertModel"
        return [r.getMessage() for r in caplog.records if "ships model code" in r.getMessage()]

    src = tmp_path / "custom"
    shutil.copytree(tiny_folder("bert"), src)
    (src / "modeling_custom.py").write_text("raise SystemExit('the folder code ran')\n")
    assert warned() == []
    assert warned(auto_map={"AutoModel": "modeling_custom.BertModel"}) == []
    assert warned(auto_map={"AutoConfig": "modeling_custom.BertConfig"}) == []
    said = warned(auto_map={"AutoConfig": "modeling_custom.C", "AutoModel": "modeling_custom.CustomBert"})
    assert len(said) == 1 and "(AutoModel: modeling_custom.CustomBert)" in said[0], said
    assert "transformers' BertModel built it" in said[0] and "AutoConfig" not in said[0]
