"""Finding and loading models (papa_surgery.models): messages that name the problem and the fix."""

from __future__ import annotations

import shutil
from pathlib import Path

from click.testing import CliRunner
from conftest import CallCounter, cli  # noqa: F401
from fake_hub import build_tiny_checkpoint

from papa_surgery.cli import main

REPO_ROOT = Path(__file__).resolve().parents[1]


def test_model_messages_name_the_problem_and_the_fix(tmp_path, monkeypatch):
    result = cli("convert", tmp_path / "no" / "such" / "model", "--fraction", 0.5)
    assert result.exit_code == 1 and "does not exist" in result.output and "Repo id" not in result.output
    monkeypatch.chdir(tmp_path)
    result = cli("convert", "minlm", "--fraction", 0.5)
    assert result.exit_code == 1 and "'minilm'" in result.output, result.output
    a_file = tmp_path / "model.safetensors"
    a_file.write_bytes(b"x")
    result = cli("convert", a_file, "--fraction", 0.5)
    assert result.exit_code == 1 and "is a file" in result.output and "weights_only" not in result.output


def test_unreachable_hub_is_one_clear_line_without_retries(tmp_path, monkeypatch):
    from huggingface_hub import constants

    import papa_surgery.models.loading as loading

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=5.0: False)
    result = CliRunner().invoke(main, ["convert", "some-org/some-model", "--fraction", "0.5"])
    assert result.exit_code == 1
    assert "'some-org/some-model'" in result.output and "HF_HUB_OFFLINE=1" in result.output
    assert "Retry" not in result.output


def test_loading_a_checkpoint_runs_none_of_its_code_for_the_tokenizer_either(tmp_path, monkeypatch):
    import transformers

    from papa_surgery.models.loading import load_source

    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    seen = {}
    real = transformers.AutoTokenizer.from_pretrained

    def spy(*args, **kwargs):
        seen.update(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", spy)
    model, _ = load_source(str(folder))
    assert type(model).__module__ == "papa_surgery.hub_code.modeling_papa"  # the library's class, not the folder's
    assert seen.get("trust_remote_code") is False  # and the tokenizer reads the config with it too, never asking


def _code_that_marks(folder: Path, module: str, marker: Path) -> None:
    (folder / f"{module}.py").write_text(f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n")


def test_heal_runs_no_code_of_a_teacher_the_checkpoints_recipe_names(tmp_path, monkeypatch):
    """``heal CKPT --trust-remote-code`` loaded the teacher its recipe named with the same trust: an edited recipe
    naming a folder with code ran that code. A recorded source is a Hub id, never a path: a path is refused."""
    import json

    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    teacher, marker = tmp_path / "teacher", tmp_path / "ran"
    teacher.mkdir()
    (teacher / "config.json").write_text(json.dumps({"model_type": "bert", "auto_map": {"AutoModel": "evil.Model"}}))
    _code_that_marks(teacher, "evil", marker)
    recipe = json.loads((folder / "papa_recipe.json").read_text())
    recipe["source"] = {"hub_id": str(teacher)}
    (folder / "papa_recipe.json").write_text(json.dumps(recipe))
    args = ["heal", str(folder), "--trust-remote-code", "--steps", "1", "--out", str(tmp_path / "out")]
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "not a Hub id" in result.output and "--teacher" in result.output, result.output
    assert not marker.exists() and not (tmp_path / "out").exists()
    # a Hub id that a folder of the same name in the working folder would stand in for is refused too
    shutil.move(teacher, tmp_path / "org" / "teacher")
    recipe["source"] = {"hub_id": "org/teacher"}
    (folder / "papa_recipe.json").write_text(json.dumps(recipe))
    monkeypatch.chdir(tmp_path)
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 2 and "a folder of that name is in the working folder" in result.output, result.output


def test_heal_loads_a_recipe_named_teacher_without_running_its_code(tmp_path, monkeypatch):
    """``--trust-remote-code`` is for the models a user names: the teacher the recipe names is loaded without it
    (control: the same folder named with ``--teacher`` runs its code, as asked)."""
    import json

    import papa_surgery.healing.run as heal_run

    folder, _, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    teacher, marker = tmp_path / "teacher", tmp_path / "ran"
    shutil.copytree(folder, teacher, ignore=shutil.ignore_patterns("*.py", "papa_recipe.json", "README.md"))
    config = json.loads((teacher / "config.json").read_text())
    config = {k: v for k, v in config.items() if not k.startswith("papa_")}
    (teacher / "config.json").write_text(
        json.dumps({**config, "model_type": "bert", "auto_map": {"AutoModel": "evil.M"}})
    )
    (teacher / "evil.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\n"
        "from transformers import BertModel\n\n\nclass M(BertModel):  # its own: transformers marks it\n"
        "    pass\n"
    )
    monkeypatch.setattr(heal_run, "teacher_name", lambda papa, given=None: given or str(teacher))  # as if recorded
    args = ["heal", str(folder), "--trust-remote-code", "--steps", "1", "--heldout", "8", "--max-examples", "40"]
    CliRunner().invoke(main, [*args, "--out", str(tmp_path / "a")])
    assert not marker.exists()
    CliRunner().invoke(main, [*args, "--teacher", str(teacher), "--out", str(tmp_path / "b")])
    assert marker.exists()


def test_save_without_a_tokenizer_never_asks_to_run_a_tokenizers_code(tmp_path, monkeypatch):
    """``save(model)`` found the tokenizer of the folder the model came from with ``AutoTokenizer`` left to ask
    "run the custom code? [y/N]" on a terminal; such a tokenizer is refused, naming ``tokenizer``, and none runs."""
    import json
    import shutil

    import pytest

    import papa_surgery
    from papa_surgery.options import ArgumentError

    folder, papa, _ = build_tiny_checkpoint(tmp_path / "ckpt")
    tok_folder, marker = tmp_path / "tok", tmp_path / "ran"
    shutil.copytree(folder, tok_folder, ignore=shutil.ignore_patterns("*.py", "*.safetensors"))  # its tokenizer
    config = {"tokenizer_class": "EvilTokenizer", "auto_map": {"AutoTokenizer": ["evil_tok.EvilTokenizer", None]}}
    (tok_folder / "tokenizer_config.json").write_text(json.dumps(config))
    _code_that_marks(tok_folder, "evil_tok", marker)
    papa.config._name_or_path = str(tok_folder)
    import transformers

    seen, real = [], transformers.AutoTokenizer.from_pretrained
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: seen.append(k) or real(*a, **k))
    with pytest.raises(ArgumentError, match="tokenizer: none given"):
        papa_surgery.save(papa, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()
    assert seen and all(k.get("trust_remote_code") is False for k in seen)  # None asks on a terminal
