"""No silent fallbacks (issue 31, item 4): what papa-surgery could not read is said in one line, and what it chose
instead is recorded in the recipe and the model card.

The Hub is out of reach in tests, so its failures are made at the client's edge (``datasets.load_dataset``) or with
a Hub id that is not in the cache under ``HF_HUB_OFFLINE=1``, as an offline user meets them.
"""

from __future__ import annotations

import json
import logging

import pytest
from test_clients import _sentence_transformers_folder

import papa_surgery
from papa_surgery.calibration.corpus import DEFAULT_HUB_EXAMPLES, default_corpus


@pytest.fixture
def converted(tiny_folder):
    """(PAPA model, tokenizer) of a tiny BERT at fraction 0.5, data-free constants."""
    model, tok = papa_surgery.load(str(tiny_folder("bert")))
    constants = papa_surgery.calibrate(model, tok, kind="uniform", max_length=16)
    return papa_surgery.convert(model, constants, papa_surgery.rank("first-to-last", constants=constants), 0.5), tok


def recipe_and_card(folder) -> tuple[dict, str]:
    return json.loads((folder / "papa_recipe.json").read_text()), (folder / "README.md").read_text()


# -------------------------------------------------------------------------------------- sentence-transformers


def test_a_source_whose_sentence_transformers_files_cannot_be_read_is_said_once_and_recorded(
    converted, tmp_path, caplog
):
    papa, tok = converted
    tok.name_or_path = "someone/a-model-not-in-the-cache"  # as loaded from the Hub, now offline (HF_HUB_OFFLINE=1)
    with caplog.at_level(logging.WARNING, logger="papa_surgery"):
        folder = papa_surgery.save(papa, tmp_path / "out", tokenizer=tok)
        papa_surgery.save(papa, tmp_path / "again", tokenizer=tok)
    said = [r.getMessage() for r in caplog.records if "sentence-transformers model" in r.getMessage()]
    assert len(said) == 1, said  # one line, once per source and cause
    assert said[0].startswith("whether someone/a-model-not-in-the-cache is a sentence-transformers model could not")
    assert "HF_HUB_OFFLINE=1" in said[0] and "treated as a plain transformers model" in said[0]
    recipe, card = recipe_and_card(folder)
    assert recipe["sentence_transformers"]["model"] is None and recipe["sentence_transformers"]["files"] == []
    assert "HF_HUB_OFFLINE=1" in recipe["sentence_transformers"]["why"]
    assert "| sentence-transformers | unknown: could not be checked (HF_HUB_OFFLINE=1" in card
    assert not (folder / "modules.json").exists()


def test_what_was_found_about_a_local_source_is_recorded_either_way(tiny, tmp_path):
    st_folder = _sentence_transformers_folder(tiny, "bert", tmp_path)
    for source, expected in ((st_folder, True), (tmp_path / "hf", False)):
        model, tok = papa_surgery.load(str(source))
        constants = papa_surgery.calibrate(model, tok, kind="uniform", max_length=16)
        papa = papa_surgery.convert(model, constants, papa_surgery.rank("first-to-last", constants=constants), 1.0)
        folder = papa_surgery.save(papa, tmp_path / f"out-{expected}", tokenizer=tok)
        recipe, card = recipe_and_card(folder)
        record = recipe["sentence_transformers"]
        assert record["model"] is expected
        if expected:
            assert {"modules.json", "1_Pooling", "2_Normalize"} <= set(record["files"])
            assert "| sentence-transformers | yes (its folder has modules.json): kept modules.json" in card
        else:
            assert record["files"] == [] and "| sentence-transformers | no (its folder has no modules.json) |" in card


# ------------------------------------------------------------------------------------------------- the corpus


class FakeStream:
    """What ``datasets.load_dataset(..., streaming=True)`` returns: rows of a ``text`` column, or a failure midway."""

    column_names = ["text"]

    def __init__(self, rows: int, fail_after: int | None = None):
        self.rows, self.fail_after = rows, fail_after

    def __iter__(self):
        for i in range(self.rows):
            if self.fail_after is not None and i >= self.fail_after:
                raise ConnectionError("the stream broke off")
            yield {"text": f"line {i} of the corpus"}


@pytest.fixture
def online(monkeypatch):
    """As if the Hub answered: offline mode off and the quick reachability check true."""
    from huggingface_hub import constants

    import papa_surgery.models.loading as loading

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(loading, "hub_reachable", lambda timeout=5.0: True)


def test_the_default_corpus_online_records_its_cap_and_honours_a_larger_one(online, monkeypatch):
    import datasets

    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: FakeStream(DEFAULT_HUB_EXAMPLES * 2))
    corpus = default_corpus()
    assert len(list(corpus)) == DEFAULT_HUB_EXAMPLES
    assert corpus.description.startswith("Hub dataset Salesforce/wikitext:wikitext-103-raw-v1:train:text")
    assert corpus.description.endswith(f", first {DEFAULT_HUB_EXAMPLES:,} lines (the default corpus's length; "
                                       "max_examples to change)")  # fmt: skip
    larger = default_corpus(max_examples=DEFAULT_HUB_EXAMPLES + 500)
    assert len(list(larger)) == DEFAULT_HUB_EXAMPLES + 500  # asked for more: no silent cap at 2,000
    assert larger.description.endswith(f"first {DEFAULT_HUB_EXAMPLES + 500:,} lines (max_examples)")


@pytest.mark.parametrize(
    ("stream", "cause"),
    [(None, "no route to the Hub"), (FakeStream(10, fail_after=0), "the stream broke off")],
    ids=["open", "first-read"],
)
def test_a_default_corpus_the_hub_cannot_serve_is_one_warning_and_recorded(online, monkeypatch, caplog, stream, cause):
    import datasets

    def load_dataset(*args, **kwargs):
        if stream is None:
            raise ConnectionError(cause)
        return stream

    monkeypatch.setattr(datasets, "load_dataset", load_dataset)
    with caplog.at_level(logging.INFO, logger="papa_surgery"):
        corpus = default_corpus(max_examples=8)
    said = [r for r in caplog.records if "bundled" in r.getMessage()]
    assert len(said) == 1 and said[0].levelno == logging.WARNING
    assert said[0].getMessage().startswith("WikiText-103 could not be opened (") and cause in said[0].getMessage()
    assert "wikitext2_valid_excerpt" in corpus.description and cause in corpus.description
    assert len(list(corpus)) == 8


def test_the_default_corpus_choice_reaches_the_recipe_and_the_card(tiny_folder, tmp_path):
    """Offline (the test environment): the bundled excerpt, and why, in what the checkpoint records."""
    model, tok = papa_surgery.load(str(tiny_folder("bert")))
    constants = papa_surgery.calibrate(model, tok, max_examples=12, max_length=16, progress=False)
    papa = papa_surgery.convert(
        model, constants, papa_surgery.rank("variance", constants=constants), 0.5, tokenizer=tok
    )
    folder = papa_surgery.save(papa, tmp_path / "out", tokenizer=tok)
    recipe, card = recipe_and_card(folder)
    expected = "text file wikitext2_valid_excerpt.txt (the default corpus's stand-in: HF_HUB_OFFLINE=1)"
    assert recipe["corpus"]["description"] == expected and recipe["corpus"]["examples"] == 12
    assert f"| calibration corpus | {expected}, 12 examples |" in card
