"""Issue 23 (data loss): ``--overwrite`` / ``overwrite=True`` replace only what papa-surgery wrote, of the same kind.

Never the model being read (however the path reaches it), never a folder holding the user's own files (they are
named), never another kind of file; a refusal leaves everything as it was and nothing half-written beside it.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import cli

import papa_surgery
from papa_surgery.calibration import Constants
from papa_surgery.ranking import Ranking

FAST_CONVERT = ["--fraction", "0.5", "--kind", "identity", "--method", "first-to-last", "--max-length", "16"]
ORDER = [[layer, head] for layer in range(2) for head in range(4)]
ROW = {"model": "tiny", "task": "sst2", "fraction": 0.5, "kind": "average", "method": "variance", "seed": 0}


def snapshot(folder: Path) -> dict:
    """Every entry under ``folder``: file bytes, symlink targets, folders (to prove nothing changed)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = Path(root, name)
            rel = str(path.relative_to(folder))
            if path.is_symlink():
                found[rel] = ("link", os.readlink(path))
            elif path.is_dir():
                found[rel] = ("dir",)
            else:
                found[rel] = ("file", path.read_bytes())
    return found


def staging_left(parent: Path) -> list[str]:
    return sorted(p.name for p in parent.iterdir() if ".papa-staging-" in p.name)


@pytest.fixture
def source(tiny_folder, tmp_path) -> Path:
    """A private copy of a tiny BERT source folder (a bug here must not destroy the session's shared one)."""
    src = tmp_path / "work" / "bert-src"
    shutil.copytree(tiny_folder("bert"), src)
    return src


@pytest.fixture
def checkpoint(source) -> Path:
    out = source.parent / "ckpt"
    result = cli("convert", source, *FAST_CONVERT, "--out", out)
    assert result.exit_code == 0, result.output
    return out


def constants_file(path: Path) -> Path:
    return Constants.from_kind("identity", 2, 4, 16).save(path)


# ---------------------------------------------------------------------------------------------- 1. the source model
def test_convert_out_src_overwrite_keeps_the_source(source):
    before = snapshot(source)
    result = cli("convert", source, *FAST_CONVERT, "--out", source, "--overwrite")
    assert result.exit_code == 1, result.output
    assert "model being read" in result.output and "--out" in result.output
    assert snapshot(source) == before and staging_left(source.parent) == []


def test_convert_out_symlink_to_src_keeps_the_source(source):
    link = source.parent / "link"
    link.symlink_to(source, target_is_directory=True)
    before = snapshot(source)
    result = cli("convert", source, *FAST_CONVERT, "--out", link, "--overwrite")
    assert result.exit_code == 1 and "model being read" in result.output, result.output
    assert link.is_symlink() and link.resolve() == source.resolve() and snapshot(source) == before


def test_convert_out_src_by_relative_path_keeps_the_source(source, monkeypatch):
    monkeypatch.chdir(source)
    before = snapshot(source)
    result = cli("convert", source, *FAST_CONVERT, "--out", "../bert-src/.", "--overwrite")
    assert result.exit_code == 1 and "model being read" in result.output, result.output
    assert snapshot(source) == before


def test_convert_out_a_folder_holding_the_source_keeps_it(source, tmp_path):
    # The old sentence-transformers layout: a model folder (config.json at the top) holding the encoder's folder.
    parent = tmp_path / "st-model"
    shutil.copytree(source, parent)
    inner = parent / "0_Transformer"
    shutil.copytree(source, inner)
    before = snapshot(parent)
    result = cli("convert", inner, *FAST_CONVERT, "--out", parent, "--overwrite")
    assert result.exit_code == 1 and "holds the model being read" in result.output, result.output
    assert snapshot(parent) == before


def test_convert_out_a_folder_inside_the_source_keeps_it(source):
    inner = source / "0_Transformer"  # a module folder of the source, itself a model folder
    shutil.copytree(source, inner, ignore=shutil.ignore_patterns("0_Transformer"))
    before = snapshot(source)
    result = cli("convert", source, *FAST_CONVERT, "--out", inner, "--overwrite")
    assert result.exit_code == 1 and "lies inside the model being read" in result.output, result.output
    assert snapshot(source) == before


def test_convert_overwrite_refuses_a_copy_of_another_model(source, tmp_path):
    other = tmp_path / "other-model"
    shutil.copytree(source, other)
    (other / "my_notes.txt").write_text("keep me")
    before = snapshot(other)
    result = cli("convert", source, *FAST_CONVERT, "--out", other, "--overwrite")
    assert result.exit_code == 1, result.output
    assert "not a PAPA checkpoint" in result.output and "choose another --out" in result.output
    assert snapshot(other) == before and staging_left(tmp_path) == []


# ---------------------------------------------------------------------------------------------- 1. the user's files
def test_convert_overwrite_names_the_user_files_in_a_checkpoint(source, checkpoint):
    (checkpoint / "notes.txt").write_text("my notes")
    (checkpoint / "vocab_extra.json").write_text("{}")
    before = snapshot(checkpoint)
    result = cli("convert", source, *FAST_CONVERT, "--out", checkpoint, "--overwrite")
    assert result.exit_code == 1, result.output
    line = result.output.strip().splitlines()[-1]
    assert "papa-surgery did not write: notes.txt, vocab_extra.json" in line, line
    assert "move them or choose another --out" in line
    assert snapshot(checkpoint) == before and staging_left(checkpoint.parent) == []
    (checkpoint / "notes.txt").unlink()
    (checkpoint / "vocab_extra.json").unlink()
    result = cli("convert", source, *FAST_CONVERT, "--out", checkpoint, "--overwrite")
    assert result.exit_code == 0, result.output  # an earlier checkpoint alone is replaced


# ---------------------------------------------------------------------------------------------- 2. other kinds of file
@pytest.mark.parametrize("existing", ["notes", "ranking", "results"])
def test_calibrate_overwrite_refuses_another_kind_of_file(source, tmp_path, existing):
    out = tmp_path / {"notes": "notes.md", "ranking": "r.safetensors", "results": "results.safetensors"}[existing]
    if existing == "notes":
        out.write_text("# my notes\n")
    elif existing == "ranking":
        Ranking("first-to-last", ORDER, 2, 4).save(tmp_path / "r.json")
        shutil.copy(tmp_path / "r.json", out)
    else:
        out.write_text(json.dumps(ROW) + "\n")
    before = out.read_bytes()
    result = cli("calibrate", source, "--max-length", 16, "--max-examples", 4, "--out", out, "--overwrite")
    assert result.exit_code == 1, result.output
    assert "refusing to overwrite" in result.output and "constants file" in result.output
    assert out.read_bytes() == before and staging_left(tmp_path) == []


def test_calibrate_overwrite_replaces_an_earlier_constants_file(source, tmp_path):
    out = constants_file(tmp_path / "c.safetensors")
    result = cli("calibrate", source, "--max-length", 8, "--max-examples", 4, "--out", out, "--overwrite")
    assert result.exit_code == 0, result.output
    assert Constants.load(out).max_length == 8


@pytest.mark.parametrize("command", ["calibrate", "rank"])
def test_a_file_output_ending_with_a_slash_is_refused_as_a_folder(source, tmp_path, command):
    """``--out dir/`` says a folder: it wrote a file named ``dir``. Refused before anything runs, with an example file
    path in that folder; nothing is written. The Python saves refuse the same."""
    extra = ["--method", "first-to-last"] if command == "rank" else ["--max-length", "8", "--max-examples", "4"]
    for out in (f"{tmp_path / 'made'}/", f"{tmp_path / 'made'}/.", f"{tmp_path / 'nd'}/.."):  # Path() drops / and .
        result = cli(command, source, *extra, "--out", out)
        said = " ".join(result.output.split())
        assert result.exit_code == 1 and "names a folder; pass a file path" in said, said
        assert f"e.g. {out.rstrip('/')}/" in said and staging_left(tmp_path) == []
    out = f"{tmp_path / 'made'}/"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]
    with pytest.raises(ValueError, match="names a folder"):
        Constants.from_kind("identity", 2, 4, 16).save(out)
    with pytest.raises(ValueError, match="names a folder"):
        Ranking("random", ORDER, 2, 4).save(out)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["work"]


@pytest.mark.parametrize("command", ["calibrate", "rank"])
def test_a_file_output_that_is_a_symbolic_link_is_refused_and_kept(source, tmp_path, command):
    """A link ``--out`` to an earlier output was replaced with ``--overwrite`` by a file of its own (the file it led
    to kept the old contents): refused, naming where it leads, before anything runs; the link and its file stay."""
    extra = ["--method", "first-to-last"] if command == "rank" else ["--max-length", "8", "--max-examples", "4"]
    earlier = tmp_path / "earlier.out"
    if command == "rank":
        Ranking("random", ORDER, 2, 4).save(earlier)
    else:
        Constants.from_kind("identity", 2, 4, 16).save(earlier)
    before = earlier.read_bytes()
    link = tmp_path / "link.out"
    link.symlink_to(earlier)
    result = cli(command, source, *extra, "--out", link, "--overwrite")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and f"is a symbolic link (to {earlier.resolve()})" in said, said
    assert "pass the file it points to" in said and staging_left(tmp_path) == []
    assert link.is_symlink() and earlier.read_bytes() == before
    save = Ranking("random", ORDER, 2, 4).save if command == "rank" else Constants.from_kind("uniform", 2, 4, 16).save
    with pytest.raises(ValueError, match="is a symbolic link"):
        save(link, overwrite=True)
    assert link.is_symlink() and earlier.read_bytes() == before
    result = cli(command, source, *extra, "--out", earlier, "--overwrite")  # the file itself: replaced
    assert result.exit_code == 0 and earlier.read_bytes() != before, result.output


def test_rank_overwrite_refuses_a_results_file(source, tmp_path):
    out = tmp_path / "results.jsonl"
    out.write_text(json.dumps({**ROW, "metric": "accuracy", "score": 0.9}) + "\n")
    before = out.read_bytes()
    result = cli("rank", source, "--method", "first-to-last", "--out", out, "--overwrite")
    assert result.exit_code == 1, result.output
    assert "it is a papa-surgery results file, not a ranking" in result.output
    assert out.read_bytes() == before and staging_left(tmp_path) == []
    earlier = Ranking("random", ORDER, 2, 4).save(tmp_path / "r.json")
    result = cli("rank", source, "--method", "first-to-last", "--out", earlier, "--overwrite")
    assert result.exit_code == 0 and Ranking.load(earlier).method == "first-to-last", result.output


def test_probe_results_ending_with_a_slash_are_refused_as_a_folder(tmp_path):
    """``probe --out results/`` names a folder: refused before the model loads, with an example file path."""
    from papa_surgery.outputs.overwrite import check_results_file

    for out in (f"{tmp_path / 'new'}/", f"{tmp_path}/."):
        with pytest.raises(ValueError, match="names a folder; pass a file path for the results"):
            check_results_file(out)
    result = cli("probe", "no-such-model", "--task", "sst2", "--out", f"{tmp_path / 'new'}/")
    assert result.exit_code == 1 and "names a folder" in result.output, result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("content", [b"my one-line notes", b"\x00binary", b'{"not": "a row"}\n'])
def test_probe_appends_only_to_a_results_file(source, tmp_path, content):
    data = tmp_path / "data" / "glue" / "sst2"
    data.mkdir(parents=True)
    for split in ("train", "dev"):
        (data / f"{split}.tsv").write_text("sentence\tlabel\n" + "a good movie\t1\na bad movie\t0\n" * 4)
    out = tmp_path / "notes.txt"
    out.write_bytes(content)
    args = ["--fractions", "0", "--seeds", 1, "--epochs", 1, "--max-length", 16]
    result = cli("probe", source, "--task", "sst2", "--data-dir", tmp_path / "data", *args, "--out", out)
    assert result.exit_code == 1 and "refusing to append results" in result.output, result.output
    assert out.read_bytes() == content


# ---------------------------------------------------------------------------------------------- the Python API
def test_api_save_refuses_the_model_being_read(source):
    model, tokenizer = papa_surgery.load(str(source))
    papa = papa_surgery.convert(
        model, Constants.from_kind("identity", 2, 4, 16), "first-to-last", 0.5, tokenizer=tokenizer
    )
    before = snapshot(source)
    with pytest.raises(ValueError, match="model being read") as info:
        papa_surgery.save(papa, source, tokenizer=tokenizer, overwrite=True)
    assert "out_dir" in str(info.value) and "--" not in str(info.value)
    assert snapshot(source) == before and staging_left(source.parent) == []


def test_api_save_overwrite_names_the_user_files(papa_model, tmp_path):
    model, tokenizer = papa_model
    out = papa_surgery.save(model, tmp_path / "ckpt", tokenizer=tokenizer)
    (out / "notes.txt").write_text("my notes")
    before = snapshot(out)
    with pytest.raises(ValueError, match="did not write: notes.txt; move them or choose another out_dir"):
        papa_surgery.save(model, out, tokenizer=tokenizer, overwrite=True)
    assert snapshot(out) == before and staging_left(tmp_path) == []


def test_api_save_speaks_of_arguments(papa_model, tmp_path):
    model, tokenizer = papa_model
    out = papa_surgery.save(model, tmp_path / "ckpt", tokenizer=tokenizer, card=False)
    with pytest.raises(ValueError, match=r"already exists; pass overwrite=True to replace it") as info:
        papa_surgery.save(model, out, tokenizer=tokenizer, card=False)
    assert "--" not in str(info.value)
    papa_surgery.save(model, out, tokenizer=tokenizer, card=False, overwrite=True)  # its own checkpoint: replaced


def test_api_save_into_an_existing_empty_folder(papa_model, tmp_path):
    model, tokenizer = papa_model
    out = tmp_path / "empty"
    out.mkdir()
    papa_surgery.save(model, out, tokenizer=tokenizer, card=False)
    loaded, _ = papa_surgery.load(str(out))
    assert loaded.config.papa_constant_heads == model.config.papa_constant_heads


def test_api_save_refuses_user_files_that_appear_while_it_writes(papa_model, tmp_path, monkeypatch):
    model, tokenizer = papa_model
    out = papa_surgery.save(model, tmp_path / "ckpt", tokenizer=tokenizer, card=False)
    original = type(model).save_pretrained

    def save_then_user_writes(self, folder, *args, **kwargs):  # checked before the work: the user adds a file
        original(self, folder, *args, **kwargs)
        (out / "notes.txt").write_text("written meanwhile")

    monkeypatch.setattr(type(model), "save_pretrained", save_then_user_writes)
    with pytest.raises(ValueError, match="did not write: notes.txt") as info:
        papa_surgery.save(model, out, tokenizer=tokenizer, card=False, overwrite=True)
    assert (out / "notes.txt").read_text() == "written meanwhile" and (out / "config.json").is_file()
    assert staging_left(tmp_path) == []
    kept = [p for p in tmp_path.iterdir() if p.name.startswith("ckpt.papa-")]  # the finished result, not lost
    assert len(kept) == 1 and str(kept[0]) in str(info.value) and (kept[0] / "model.safetensors").is_file()


@pytest.mark.parametrize("what", ["constants", "ranking"])
def test_api_file_saves_replace_only_their_own_kind(tmp_path, what):
    notes = tmp_path / "notes.md"
    notes.write_text("# my notes\n")
    results = tmp_path / "results.jsonl"
    results.write_text(json.dumps(ROW) + "\n")
    obj = Constants.from_kind("identity", 2, 4, 16) if what == "constants" else Ranking("random", ORDER, 2, 4)
    for path in (notes, results):
        before = path.read_bytes()
        with pytest.raises(ValueError, match="refusing to overwrite") as info:
            obj.save(path)  # overwrite defaults to True: still only a file of the same kind
        assert "choose another path" in str(info.value)
        assert path.read_bytes() == before
    earlier = tmp_path / f"earlier.{'safetensors' if what == 'constants' else 'json'}"
    obj.save(earlier)
    obj.save(earlier)  # its own kind: replaced
    assert staging_left(tmp_path) == []


def test_convert_into_the_working_folder_is_refused(source, checkpoint, monkeypatch):
    """A checkpoint folder is moved into place whole: an empty working folder (``--out .``) or a checkpoint the shell
    is in (``--overwrite``) would be pulled from under it. Refused before anything runs; the folder stays."""
    empty = source.parent / "empty"
    empty.mkdir()
    monkeypatch.chdir(empty)
    result = cli("convert", source, *FAST_CONVERT, "--out", ".")
    assert result.exit_code == 1 and "folder you are working in" in " ".join(result.output.split()), result.output
    assert list(empty.iterdir()) == [] and staging_left(source.parent) == []
    before = snapshot(checkpoint)
    monkeypatch.chdir(checkpoint)
    result = cli("convert", source, *FAST_CONVERT, "--out", ".", "--overwrite")
    assert result.exit_code == 1 and "refusing to write into" in result.output, result.output
    assert snapshot(checkpoint) == before
    papa, tokenizer = papa_surgery.load(checkpoint)
    copy = source.parent / "copy"
    shutil.copytree(checkpoint, copy)
    monkeypatch.chdir(copy)
    with pytest.raises(ValueError, match="folder you are working in"):
        papa_surgery.save(papa, ".", tokenizer, overwrite=True)
    assert snapshot(copy) == before
    assert snapshot(checkpoint) == before


def test_an_out_that_is_a_symbolic_link_is_refused_naming_it(source, checkpoint, tmp_path):
    """An output folder is moved into place whole: through a link to a checkpoint, ``--overwrite`` replaced the link
    with a folder (the checkpoint it named stayed as it was); a link to an empty folder was refused as 'not a PAPA
    checkpoint'. Both are refused as links, naming where they point; link and folder stay."""
    link = tmp_path / "link"
    link.symlink_to(checkpoint, target_is_directory=True)
    before = snapshot(checkpoint)
    result = cli("convert", source, *FAST_CONVERT, "--out", link, "--overwrite")
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and "is a symbolic link (to" in said and str(checkpoint) in said, said
    assert link.is_symlink() and snapshot(checkpoint) == before
    empty = tmp_path / "empty"
    empty.mkdir()
    to_empty = tmp_path / "to-empty"
    to_empty.symlink_to(empty, target_is_directory=True)
    result = cli("convert", source, *FAST_CONVERT, "--out", to_empty)
    assert result.exit_code == 1 and "pass the folder it points to" in " ".join(result.output.split())
    assert to_empty.is_symlink() and list(empty.iterdir()) == [] and staging_left(tmp_path) == []
    relative = tmp_path / "sub" / "rel"  # a relative link is named by where it leads, not by its text
    relative.parent.mkdir()
    relative.symlink_to(Path("..") / "gone", target_is_directory=True)
    result = cli("convert", source, *FAST_CONVERT, "--out", relative)
    said = " ".join(result.output.split())
    assert result.exit_code == 1 and f"(to {tmp_path / 'gone'}, which does not exist)" in said, said


def test_the_default_out_is_named_as_the_model_was_and_never_lies_in_it(source, tmp_path, monkeypatch):
    """Without --out: a symbolic link to a model names the folder by itself (not by where it leads), and from inside
    the model's folder (``convert .``) the folder goes beside it, not into the model being read."""
    (tmp_path / "mybert").symlink_to(source, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    result = cli("convert", "mybert", *FAST_CONVERT)
    assert result.exit_code == 0 and (tmp_path / "mybert-papa-0.5" / "config.json").is_file(), result.output
    before = snapshot(source)
    monkeypatch.chdir(source)
    result = cli("convert", ".", *FAST_CONVERT)
    assert result.exit_code == 0 and (source.parent / "bert-src-papa-0.5" / "config.json").is_file(), result.output
    assert snapshot(source) == before
