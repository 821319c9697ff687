"""Model card and inspect: metadata the Hub reads, the body's facts, and a usage snippet that runs as written."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import cli
from fake_hub import TINY_SOURCE, build_tiny_checkpoint
from huggingface_hub import ModelCard

from papa_surgery.conversion.card import BIBTEX, IMAGE_NAME, REPO_PLACEHOLDER, render_card, write_card
from papa_surgery.conversion.description import format_description
from papa_surgery.conversion.inspection import describe
from papa_surgery.hub_code.configuration_papa import PAPA_FORMAT_VERSION

REPO_ROOT = Path(__file__).resolve().parents[1]
COMMAND = "papa-surgery convert papa-tests/tiny-bert --fraction 0.25 --max-length 16 --out tiny-papa"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    folder, _, tokenizer = build_tiny_checkpoint(tmp_path_factory.mktemp("card") / "tiny-papa")
    return folder, tokenizer


@pytest.fixture
def folder(built, tmp_path):
    """A private copy of the checkpoint: tests rewrite its card."""
    return Path(shutil.copytree(built[0], tmp_path / "tiny-papa"))


@pytest.fixture
def results_file(tmp_path):
    rows = [
        {
            "model": "tiny-papa",
            "task": "sst2",
            "fraction": 0.25,
            "kind": "average",
            "method": "variance",
            "seed": s,
            "metric": "accuracy",
            "score": 0.80 + 0.01 * s,
        }
        for s in range(3)
    ]
    rows.append(
        {
            "model": "tiny-papa",
            "task": "sst2",
            "fraction": 0.0,
            "kind": "average",
            "method": "variance",
            "seed": 0,
            "metric": "accuracy",
            "score": 0.85,
        }
    )
    path = tmp_path / "results.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_written_card_metadata_and_body(folder, results_file):
    path = write_card(folder, results=results_file, command=COMMAND)
    card = ModelCard.load(path)
    data = card.data
    assert data.base_model == TINY_SOURCE
    assert data.library_name == "transformers"
    assert {"papa", "attention-free"} <= set(data.tags)
    assert data.pipeline_tag == "feature-extraction"
    assert data.license == "apache-2.0"
    assert data.datasets == ["wikitext"]

    text = card.text
    assert "2 of its 8 attention heads" in text and "no query and key projections" in text
    assert "| 0 | · | **C** | · | · |" in text and "| 1 | **C** | · | · | · |" in text  # layer x head grid
    assert "`average`" in text and "`variance`" in text and "wikitext" in text
    assert "slots_seen 16" in text  # coverage from the recipe
    assert COMMAND in text
    ci95 = 4.302653 * 0.01 / 3**0.5  # t(0.975, df=2) * std / sqrt(n) of 0.80, 0.81, 0.82
    assert f"| tiny-papa | sst2 | accuracy | average | variance | 0.25 | 0.8100 ± {ci95:.4f} | 3 |" in text
    assert "trust_remote_code=True" in text and 'revision = "<commit>"' in text
    assert BIBTEX.splitlines()[0] in text and "How Much Does Attention Actually Attend" in text
    assert f"]({IMAGE_NAME})" in text and (folder / IMAGE_NAME).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_card_defaults_and_pipeline_tag_by_architecture(folder):
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["PapaBertForMaskedLM"]
    config["papa_source_model"] = str(folder.parent / "some-local-model")  # a path is not a Hub id
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "papa_recipe.json").write_text(json.dumps({"source": {"model": config["papa_source_model"]}}))
    card = render_card(folder, repo_id="user/tiny-papa", revision="abc123")
    assert card.data.pipeline_tag == "fill-mask"
    assert card.data.base_model is None and card.data.license is None
    assert "AutoModelForMaskedLM.from_pretrained" in card.text
    assert 'repo = "user/tiny-papa"' in card.text and 'revision = "abc123"' in card.text
    assert "## Probe results" not in card.text and "(not recorded)" in card.text
    config["architectures"] = ["PapaBertForSequenceClassification"]
    (folder / "config.json").write_text(json.dumps(config))
    assert render_card(folder).data.pipeline_tag == "text-classification"


def test_usage_snippet_runs_as_written_against_the_folder(folder, built, tmp_path):
    card = ModelCard.load(write_card(folder))
    snippet = re.search(r"## Usage.*?```python\n(.*?)```", card.text, re.S).group(1)
    assert REPO_PLACEHOLDER in snippet
    script = snippet.replace(REPO_PLACEHOLDER, str(folder))
    env = {
        "PATH": os.environ.get("PATH", ""),
        "HOME": str(tmp_path),
        "HF_HOME": str(tmp_path / "hf_home"),
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
    }
    proc = subprocess.run(
        [sys.executable, "-I", "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = re.search(r'tokenizer\(\["(.*?)"\]', snippet).group(1)
    n_tokens = len(built[1](text)["input_ids"])
    assert proc.stdout.strip().splitlines()[-1] == str((1, n_tokens, 32))


def test_describe_and_format(folder):
    d = describe(folder)
    assert d["family"] == "bert" and d["source_model"] == TINY_SOURCE
    assert d["constant_heads"] == [[0, 1], [1, 0]] and d["num_heads_total"] == 8 and d["fraction"] == 0.25
    assert d["grid"] == [[False, True, False, False], [True, False, False, False]]
    assert d["kind"] == "average" and d["method"] == "variance" and d["max_length"] == 16
    assert d["corpus"]["examples"] == 64 and d["coverage"]["slots_seen"] == 16
    assert d["files"]["model.safetensors"] > 0 and d["missing_files"] == []
    assert {k: v for k, v in d["constants"].items()} == {
        "encoder.layer.0.attention.self.papa_constants": [1, 16, 16],
        "encoder.layer.1.attention.self.papa_constants": [1, 16, 16],
    }
    assert d["format_version"] == PAPA_FORMAT_VERSION and "transformers" in d["library_versions"]
    text = format_description(d)
    assert "2 of 8" in text and "        0  . C . ." in text and "model.safetensors" in text


def test_not_a_papa_checkpoint_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="not a folder"):
        describe(tmp_path / "missing")
    with pytest.raises(ValueError, match="no config.json"):
        describe(tmp_path)
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "bert", "hidden_size": 32}))
    with pytest.raises(ValueError, match="not a PAPA checkpoint"):
        write_card(tmp_path)
    assert not (tmp_path / "README.md").exists()


@pytest.mark.parametrize("hub_id", [None, "org/tiny-bert"])
def test_recipe_and_card_do_not_record_local_paths(tiny_folder, tmp_path, hub_id):
    import shutil

    src = tmp_path / "home" / "someone" / "models" / "tiny"
    shutil.copytree(tiny_folder("bert"), src)
    if hub_id:
        (src / "README.md").write_text(f"---\nbase_model: {hub_id}\nlicense: mit\n---\n# tiny\n")
    out = tmp_path / "ckpt"
    result = cli(
        "convert", src, "--fraction", 0.5, "--kind", "identity", "--method", "first-to-last", "--max-length", 16,
        "--out", out,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    recipe = (out / "papa_recipe.json").read_text()
    card = (out / "README.md").read_text()
    for text in (recipe, card):
        assert str(tmp_path) not in text and "/home/someone" not in text
    data = json.loads(recipe)
    # A local folder is named by its own name; a model card's base_model is what it derives from, not what it is
    assert data["source"]["model"] == "tiny" and data["source"]["local"] is True
    assert data["source"].get("base_model") == hub_id and "'<local model>'" in data["command"]


def _set_coverage(folder: Path, **coverage) -> None:
    recipe = json.loads((folder / "papa_recipe.json").read_text())
    recipe["coverage"] = coverage
    (folder / "papa_recipe.json").write_text(json.dumps(recipe))


def test_the_card_says_how_many_examples_reached_the_slots(folder):
    """ "every constant was measured" was printed for slots measured from one example: the card gives the counts."""
    card = render_card(folder).text
    assert "| calibrated on | single sentences (one segment per input" in card
    assert (
        "| covered length | the corpus reached all 16 slots (slot 0 by 64 examples, the least-reached slot by 64)"
        in card
    )
    assert "every constant was measured" not in card and "fewer than 10" not in card
    _set_coverage(folder, slots_seen=16, slots_total=16, min_examples_per_seen_slot=1, examples_at_slot_0=500,
                  slots_with_10_examples=9)  # fmt: skip
    card = render_card(folder).text
    assert "the least-reached slot by 1)" in card
    assert "7 of the reached slots were averaged over fewer than 10 examples (noisy)" in card
    _set_coverage(folder, slots_seen=6, slots_total=16, min_examples_per_seen_slot=2, examples_at_slot_0=40,
                  slots_with_10_examples=6)  # fmt: skip
    card = render_card(folder).text
    assert "the corpus reached 6 of 16 slots (slot 0 by 40 examples" in card and "estimated, not measured" in card


def _convert_local(src: Path, out: Path, *extra) -> tuple[dict, str, str]:
    """Convert the local folder ``src``: (the recipe's source, the card, inspect's output)."""
    result = cli("convert", src, "--fraction", 0.5, "--kind", "identity", "--method", "first-to-last",
                 "--max-length", 16, "--out", out, *extra)  # fmt: skip
    assert result.exit_code == 0, result.output
    inspected = cli("inspect", out)
    assert inspected.exit_code == 0, inspected.output
    return (
        json.loads((out / "papa_recipe.json").read_text())["source"],
        (out / "README.md").read_text(),
        inspected.output,
    )


def test_a_local_source_is_named_by_its_folder_and_its_ancestry(tiny_folder, tmp_path):
    """A folder called "model" gave a card titled "model" with no base_model, and inspect said "source model"."""
    plain = Path(shutil.copytree(tiny_folder("bert"), tmp_path / "my-tiny-bert"))
    source, card, inspected = _convert_local(plain, tmp_path / "plain")
    assert source["model"] == "my-tiny-bert" and "base_model" not in source
    assert "# my-tiny-bert with PAPA constant attention" in card and "base_model" not in card.split("---")[1]
    assert (
        "This is **my-tiny-bert** (a local model) with" in card and "| source model | `my-tiny-bert` (a local" in card
    )
    assert "source          my-tiny-bert (a local model)" in inspected
    # identity constants are made without data: the card said they were calibrated on text, as the average is
    body = " ".join(card.split())
    assert "made without data, the same for every head: each token attends to itself (the identity kind)" in body
    assert "calibrated once on unlabeled text" not in body
    # an older transformers wrote the Hub id it loaded from as _name_or_path; a path there is never recorded
    config = json.loads((plain / "config.json").read_text())
    for name_or_path, base in (("org/base-bert", "org/base-bert"), (str(tmp_path / "elsewhere" / "m"), None)):
        (plain / "config.json").write_text(json.dumps({**config, "_name_or_path": name_or_path}))
        out = tmp_path / f"derived-{base is None}"
        source, card, inspected = _convert_local(plain, out)
        assert source["model"] == "my-tiny-bert" and source.get("base_model") == base
        assert str(tmp_path) not in card and str(tmp_path) not in (out / "papa_recipe.json").read_text()
        if base:
            assert ModelCard.load(out / "README.md").data.base_model == base
            assert (
                f"This is **my-tiny-bert** (a local model, derived from [{base}](https://huggingface.co/{base}))"
                in card
            )
            assert f"source          my-tiny-bert (a local model, derived from {base})" in inspected


def test_a_copy_of_a_hub_model_is_named_by_its_hub_id(tiny_folder, tmp_path):
    """A Hugging Face cache snapshot (with its commit) and a git clone of a Hub repository (its credentials dropped)."""
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = tmp_path / "hub" / "models--org--tiny-bert" / "snapshots" / commit
    shutil.copytree(tiny_folder("bert"), snapshot)
    source, card, inspected = _convert_local(snapshot, tmp_path / "from-cache")
    assert (source["model"], source["hub_id"], source["revision"]) == ("org/tiny-bert", "org/tiny-bert", commit)
    assert ModelCard.load(tmp_path / "from-cache" / "README.md").data.base_model == "org/tiny-bert"
    assert "This is **org/tiny-bert** with" in card and f"source          org/tiny-bert @ {commit}" in inspected
    assert "convert org/tiny-bert " in json.loads((tmp_path / "from-cache" / "papa_recipe.json").read_text())["command"]
    clone = Path(shutil.copytree(tiny_folder("bert"), tmp_path / "clone"))
    (clone / ".git").mkdir()
    (clone / ".git" / "config").write_text(
        '[remote "origin"]\n\turl = https://someone:hf_secret@huggingface.co/org/tiny-bert\n'
    )
    source, card, _ = _convert_local(clone, tmp_path / "from-clone")
    assert source["hub_id"] == "org/tiny-bert" and "hf_secret" not in card
    assert "hf_secret" not in (tmp_path / "from-clone" / "papa_recipe.json").read_text()
