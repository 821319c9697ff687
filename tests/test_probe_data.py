"""Task registry and data loading: local formats, the Hub path, and clear errors on bad input."""

from __future__ import annotations

import json

import pytest
from conftest import cli, needs_shared_data, shared_data_dir

from papa_surgery.tasks import TASKS, get_task, load_split

DATA = shared_data_dir()
needs_data = needs_shared_data()


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    return path


def test_registry_has_the_papers_tasks_and_app_b_defaults():
    assert set(TASKS) == {"sst2", "cola", "mrpc", "mnli", "ner", "pos", "pos-ud", "mlm"}
    sst2, mnli, pos = TASKS["sst2"], TASKS["mnli"], TASKS["pos"]
    assert (sst2.lr, sst2.batch_size, sst2.epochs, sst2.max_length) == (1e-4, 32, 4, 64)
    assert (mnli.lr, mnli.batch_size, mnli.epochs, mnli.max_length) == (2e-4, 8, 4, 256)
    assert (pos.lr, pos.batch_size, pos.epochs, pos.max_length) == (5e-4, 8, 4, 128)
    assert mnli.pairs and TASKS["mrpc"].pairs and not sst2.pairs
    assert "dev-matched" in mnli.note and mnli.hub.splits["eval"] == "validation_mismatched"
    assert [t.metric for t in (sst2, TASKS["cola"], TASKS["mrpc"], TASKS["ner"])] == [
        "accuracy",
        "mcc",
        "f1",
        "seqeval_f1",
    ]


def test_unknown_task_suggests_the_closest_name():
    with pytest.raises(ValueError, match=r"unknown task 'sst'.*did you mean 'sst2'"):
        get_task("sst")
    with pytest.raises(ValueError, match=r"did you mean 'pos-ud'"):
        get_task("posud")
    assert get_task("SST-2").name == "sst2"


def test_missing_split_in_a_local_folder(tmp_path):
    _write(tmp_path / "glue/sst2/train.tsv", "sentence\tlabel\na b\t0\n")
    with pytest.raises(ValueError, match=r"'eval' split is missing.*dev\.tsv"):
        load_split("sst2", "eval", tmp_path)
    with pytest.raises(ValueError, match="not a folder"):
        load_split("sst2", "train", tmp_path / "nope")


def test_missing_column_in_a_local_file(tmp_path):
    _write(tmp_path / "glue/sst2/train.tsv", "text\tlabel\na b\t0\n")
    with pytest.raises(ValueError, match=r"missing column\(s\) \['sentence'\]"):
        load_split("sst2", "train", tmp_path)
    _write(tmp_path / "conll2003/train.txt", "EU NNP B-NP\n")
    with pytest.raises(ValueError, match="expected at least 4 columns"):
        load_split("ner", "train", tmp_path)
    _write(tmp_path / "glue/mnli/multinli_1.0_dev_matched.csv", "pairID,premise,label\n1,a,neutral\n")
    with pytest.raises(ValueError, match="missing column"):
        load_split("mnli", "train", tmp_path)


def test_labels_outside_the_label_set(tmp_path):
    _write(tmp_path / "glue/sst2/train.tsv", "sentence\tlabel\na b\t0\nc d\t2\n")
    with pytest.raises(ValueError, match=r"train\.tsv:3: label 2 is outside the label set of task 'sst2'"):
        load_split("sst2", "train", tmp_path)
    _write(tmp_path / "conll2003/train.txt", "EU NNP B-NP B-FOO\n")
    with pytest.raises(ValueError, match="'B-FOO' is outside the label set of task 'ner'"):
        load_split("ner", "train", tmp_path)


def test_local_formats(tmp_path):
    _write(tmp_path / "glue/cola/train.tsv", "gj04\t1\t\tThe sailors rode.\ngj04\t0\t*\tRode sailors the.\n")
    cola = load_split("cola", "train", tmp_path)
    assert cola.texts == ["The sailors rode.", "Rode sailors the."] and cola.labels == [1, 0]
    _write(tmp_path / "glue/mnli/multinli_1.0_dev_matched.csv",
           'pairID,sentence1,sentence2,label\n1,"a, b",c,neutral\n2,d,e,-\n3,f,g,contradiction\n')  # fmt: skip
    mnli = load_split("mnli", "train", tmp_path)
    assert mnli.texts == [("a, b", "c"), ("f", "g")] and mnli.labels == [1, 2]  # '-' (no gold label) dropped
    _write(tmp_path / "conll2003/train.txt",
           "-DOCSTART- -X- -X- O\n\nEU NNP B-NP B-ORG\nrejects VBZ B-VP O\n\nPeter NNP B-NP B-PER\n")  # fmt: skip
    ner = load_split("ner", "train", tmp_path)
    assert ner.texts == [["EU", "rejects"], ["Peter"]] and ner.labels == [[3, 0], [1]]
    conllu = "# text = Don't\n1-2\tDon't\t_\t_\n1\tDo\tdo\tAUX\n2\tn't\tnot\tPART\n2.1\tx\tx\tX\n3\t!\t!\tPUNCT\n\n"
    _write(tmp_path / "ud_ewt/en_ewt-ud-train.conllu", conllu)
    ud = load_split("pos-ud", "train", tmp_path)
    assert ud.texts == [["Do", "n't", "!"]] and ud.labels == [[3, 9, 12]]
    _write(tmp_path / "wikitext/wikitext-2/wiki.valid.tokens", " \n = Title = \n a 1 @,@ 000 b @-@ c \n")
    assert load_split("mlm", "eval", tmp_path).texts == ["a 1,000 b-c"]
    # A task's file straight inside --data-dir works too.
    _write(tmp_path / "flat/dev.tsv", "sentence\tlabel\nx\t1\n")
    assert load_split("sst2", "eval", tmp_path / "flat").labels == [1]


def test_hub_path_maps_class_labels_by_name(monkeypatch):
    datasets = pytest.importorskip("datasets")
    # A ClassLabel order different from the task's: labels are mapped through their names.
    features = datasets.Features({
        "tokens": datasets.Sequence(datasets.Value("string")),
        "ner_tags": datasets.Sequence(datasets.ClassLabel(names=["O", "B-LOC", "I-LOC", "B-PER", "I-PER",
                                                                 "B-ORG", "I-ORG", "B-MISC", "I-MISC"])),
    })  # fmt: skip
    ds = datasets.Dataset.from_dict({"tokens": [["Paris", "is"]], "ner_tags": [[1, 0]]}, features=features)
    calls = []
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: calls.append((a, k)) or ds)
    split = load_split("ner", "train")
    assert split.labels == [[5, 0]]  # B-LOC is index 5 in the task's label set
    assert calls == [(("eriktks/conll2003", None), {"split": "train"})]
    bad = datasets.Dataset.from_dict({"words": [["x"]], "ner_tags": [[0]]})
    monkeypatch.setattr(datasets, "load_dataset", lambda *a, **k: bad)
    with pytest.raises(ValueError, match=r"missing column\(s\) \['tokens'\]"):
        load_split("ner", "train")


@needs_data
@pytest.mark.parametrize(
    "task,split,count",
    [("sst2", "eval", 872), ("cola", "eval", 1043), ("mrpc", "eval", 408), ("mnli", "train", 9815),
     ("mnli", "eval", 9832), ("ner", "eval", 3250), ("pos", "eval", 3250), ("pos-ud", "eval", 2001)],
)  # fmt: skip
def test_shared_data_counts(task, split, count):
    assert len(load_split(task, split, DATA)) == count


def test_probe_offline_without_data_dir_suggests_it(source, tmp_path):
    result = cli("probe", source, "--task", "sst2", "--fractions", "0", "--seeds", 1, "--out", tmp_path / "r.jsonl")
    assert result.exit_code == 1 and "could not be reached" in result.output and "--data-dir" in result.output


def test_file_format_errors_name_the_file_and_line(tmp_path):
    from papa_surgery.calibration.constants import Constants
    from papa_surgery.calibration.corpus import load_corpus
    from papa_surgery.experiments.results import read_rows
    from papa_surgery.ranking.order import Ranking

    bad = tmp_path / "corpus.txt"
    bad.write_bytes(b"fine line\nanother\nbroken \xff\xfe line\nlast\n")
    with pytest.raises(ValueError, match=r"corpus\.txt: line 3 is not valid UTF-8"):
        list(load_corpus(bad))
    results = tmp_path / "r.jsonl"
    results.write_bytes(b'{"a": 1}\n{"b": "\xff"}\n{"c": 3}\n')
    with pytest.raises(ValueError, match=r"r\.jsonl: line 2 is not valid UTF-8"):
        read_rows(results)

    ranking = tmp_path / "ranking.json"
    base = {"format": "papa-ranking", "method": "random", "num_layers": 1, "num_heads": 2, "order": [[0, 0], [0, 1]]}
    cases = [({"order": [[0], [1]]}, "order"), ({"order": None}, "order"), ({"num_layers": "1"}, "num_layers")]
    cases += [({"scores": [1.0]}, "scores"), ({"provenance": []}, "provenance")]
    for broken, field in cases:
        ranking.write_text(json.dumps({**base, **broken}))
        with pytest.raises(ValueError, match=field):
            Ranking.load(ranking)
    ranking.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a papa-surgery ranking"):
        Ranking.load(ranking)

    import torch
    from safetensors.torch import save_file

    consts = tmp_path / "c.safetensors"
    values = {"values": torch.full((1, 2, 4, 4), 0.25)}
    save_file(values, str(consts), metadata={"format": "papa-constants", "max_length": "4"})
    with pytest.raises(ValueError, match="lacks 'kind'"):
        Constants.load(consts)
    save_file(values, str(consts), metadata={"format": "papa-constants", "kind": "average", "max_length": "four"})
    with pytest.raises(ValueError, match="metadata is damaged"):
        Constants.load(consts)
    with pytest.raises(ValueError, match="is a folder"):
        Constants.load(tmp_path)


def test_empty_task_file_is_named(tmp_path):
    from papa_surgery.tasks import load_split

    (tmp_path / "glue" / "sst2").mkdir(parents=True)
    (tmp_path / "glue" / "sst2" / "train.tsv").write_text("")
    with pytest.raises(ValueError, match=r"train\.tsv is empty"):
        load_split("sst2", "train", tmp_path)


def test_an_unknown_task_is_bad_usage_of_the_flag_that_named_it(tmp_path):
    """``probe --task sst3`` was a failed run (exit 1) though a bad value is bad usage (exit 2); an unknown task named
    in ``--corpus task:NAME`` names ``--corpus``. Nothing is written."""
    from click.testing import CliRunner

    from papa_surgery.cli import main

    out = tmp_path / "r.jsonl"
    result = CliRunner().invoke(main, ["probe", "some-model", "--task", "sst3", "--out", str(out)])
    assert result.exit_code == 2 and "'--task'" in result.output and "did you mean 'sst2'" in result.output
    result = CliRunner().invoke(main, ["probe", "m", "--task", "sst2", "--corpus", "task:foo", "--out", str(out)])
    assert result.exit_code == 2 and "'--corpus'" in result.output and "unknown task 'foo'" in result.output
    assert not out.exists()
