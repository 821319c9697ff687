"""Finding and loading models (papa_surgery.models): messages that name the problem and the fix."""

from __future__ import annotations

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
