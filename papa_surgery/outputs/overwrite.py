"""What ``--overwrite`` (``overwrite=True``) may replace: only an output papa-surgery wrote, of the same kind.

Each output is recognised by what papa-surgery itself puts in it:

- ``convert`` / ``save``: a PAPA checkpoint folder (``config.json`` with a ``papa_*`` model type or
  ``papa_format_version``) that holds only what a checkpoint holds (config, weights, model code, tokenizer,
  ``papa_recipe.json``, card, sentence-transformers modules). Any other file in it is the user's: the refusal
  names it, and nothing is deleted;
- ``calibrate`` / ``Constants.save``: a constants safetensors file (metadata ``format: papa-constants``);
- ``rank`` / ``Ranking.save``: a ranking JSON (``"format": "papa-ranking"``);
- ``probe`` / ``finetune`` append to a results file (JSON lines of results rows), never to another file;
- ``report``: a report folder (``report.md`` headed ``# PAPA``, and the figures it links);
- ``analyze``: an analysis folder (``summary.json`` listing the files written beside it).

An output folder is never the working directory or a folder holding it (it is moved into place whole, which would
pull it from under the shell), nor a symbolic link (it would replace the link, not write through it).
The model being read is never replaced, whatever path reaches it (a symlink, a relative path, a folder that
holds it or lies inside it). An existing *empty* folder is no one's output: it is written into without
``overwrite``. The checks run before the first expensive step and again just before the finished output is
moved into place (:mod:`papa_surgery.outputs.staging`), so a refusal leaves nothing written.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from pathlib import Path

from ..failures import spell
from .places import check_file_path, check_not_cwd, check_not_link, empty_folder
from .places import out_flag as _out
from .st_modules import json_list, module_code_files

# The fields every results row has: the cell it scored (papa_surgery.experiments.results builds its resume key,
# KEY_FIELDS, from these and the corpus, which older rows lack).
RESULT_FIELDS = ("model", "task", "fraction", "kind", "method", "seed")
ROW_START = b'{"model": '  # how a results row begins as written (json.dumps of a Cell's fields first)

LABELS = {
    "checkpoint": "a PAPA checkpoint",
    "constants": "a constants file",
    "ranking": "a ranking",
    "results": "a results file",
    "report": "a report folder",
    "analysis": "an analysis folder",
}
# What an analysis puts in its folder (papa_surgery.analysis.summary and workflow.analysis_job).
ANALYSIS_FILES = {"summary.json", "norm-average.safetensors", "effective-average.safetensors", "token_shares.png",
                  "sep_mass.png", "heatmaps.png", "norm-ranking.json"}  # fmt: skip
# What write_report puts in a report folder: the report and the figures it may link.
REPORT_FILES = {"report.md", "fig2_fractions.png", "fig3.png", "fig5_methods.png", "fig2_finetuned.png",
                "fig4_constants.png"}  # fmt: skip

# Top-level files a checkpoint holds besides the model code (every .py of hub_code, listed below):
# save_pretrained's config and weights, the tokenizer files of the supported families, the card and recipe,
# and a sentence-transformers source's own files (its module folders are read from the folder's modules.json).
_CHECKPOINT_FILES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "model.safetensors.index.json",
    "papa_recipe.json",
    "README.md",
    "papa_constants.png",
    "modules.json",
    "sentence_bert_config.json",
    "config_sentence_transformers.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "spm.model",
    "sentencepiece.model",
    "sentencepiece.bpe.model",
    "tokenizer.model",
    "bpe.codes",
    "__pycache__",  # compiled from the checkpoint's own code
    ".DS_Store",
}
_SHARD = re.compile(r"^model-\d+-of-\d+\.safetensors$")
_MAX_HEADER = 100 * 2**20  # a safetensors header larger than this is not one papa-surgery wrote
_MAX_TEXT = 256 * 2**20  # rankings and results files are read whole only below this size


# ---------------------------------------------------------------------------------------------- recognising
def kind_of(path: str | Path) -> str | None:
    """Which papa-surgery output ``path`` is (a key of :data:`LABELS`), or ``None`` for anything else."""
    path = Path(path)
    if path.is_dir():
        if _papa_config(path) is not None:
            return "checkpoint"
        if _analysis_files(path) is not None:
            return "analysis"
        return "report" if _is_report(path) else None
    if not path.is_file():
        return None
    if _safetensors_format(path) == "papa-constants":
        return "constants"
    if path.stat().st_size > _MAX_TEXT:
        return None
    data = path.read_bytes()
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        parsed = None
    if isinstance(parsed, dict) and parsed.get("format") == "papa-ranking":
        return "ranking"
    return "results" if _is_results(data) else None


def _papa_config(folder: Path) -> dict | None:
    """``config.json`` of ``folder`` when it is a PAPA checkpoint's (a ``papa_*`` model type), else ``None``."""
    config = _json_dict(folder / "config.json")
    if config is None:
        return None
    if str(config.get("model_type", "")).startswith("papa_") or "papa_format_version" in config:
        return config
    return None


def _is_report(folder: Path) -> bool:
    """Whether ``folder`` holds a report ``write_report`` wrote (``report.md`` headed ``# PAPA``)."""
    try:
        with open(folder / "report.md", encoding="utf-8") as f:
            return f.readline().startswith("# PAPA ")
    except (OSError, UnicodeDecodeError):
        return False


def _analysis_files(folder: Path) -> set[str] | None:
    """The files an analysis folder's ``summary.json`` says were written with it, or ``None`` if it is not one."""
    summary = _json_dict(folder / "summary.json")
    files = summary.get("files") if summary is not None else None
    if not isinstance(files, list) or "summary.json" not in files:
        return None
    return {str(name) for name in files} & ANALYSIS_FILES  # only names an analysis writes: never a listed stranger


def _json_dict(path: Path) -> dict | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _safetensors_format(path: Path) -> str | None:
    """The ``format`` of a safetensors file's metadata, read from its header alone (``None`` if not one)."""
    try:
        with open(path, "rb") as f:
            size = int.from_bytes(f.read(8), "little")
            if not 2 <= size <= min(_MAX_HEADER, path.stat().st_size - 8):
                return None
            header = json.loads(f.read(size).decode("utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return None
    meta = header.get("__metadata__") if isinstance(header, dict) else None
    return meta.get("format") if isinstance(meta, dict) else None


def _is_results(data: bytes) -> bool:
    """JSON lines of results rows: every line an object, at least one a row; a torn last line (a sweep killed
    mid-write) is one of ours after rows, or alone when it begins as a row is written (its first field, the model):
    a sweep repairs the file by cutting that line off, so a torn line of other JSON alone in its file is not ours."""
    lines = [line for line in data.split(b"\n") if line.strip()]
    rows = 0
    for i, line in enumerate(lines):
        try:
            row = json.loads(line.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError):
            if i == len(lines) - 1 and rows > 0 and line.startswith(b'{"'):
                return True  # after rows of ours, a torn row cut anywhere
            if len(lines) == 1 and (line.startswith(ROW_START) or ROW_START.startswith(line)):
                return True  # alone: only what begins as a row is written (cut in its first field, or later)
            return False
        if not isinstance(row, dict):
            return False
        rows += all(k in row for k in RESULT_FIELDS)
    return rows > 0


def checkpoint_files(folder: str | Path) -> set[str]:
    """Names of the top-level entries a PAPA checkpoint folder may hold (what papa-surgery writes into it)."""
    from .. import hub_code

    names = set(_CHECKPOINT_FILES) | {p.name for p in Path(hub_code.__file__).parent.glob("*.py")}
    modules = json_list(Path(folder) / "modules.json")
    for module in modules:  # a sentence-transformers source's module folders: 1_Pooling, 2_Normalize...
        sub = str(module.get("path") or "") if isinstance(module, dict) else ""
        if sub and "/" not in sub.strip("/") and sub not in (".", ".."):
            names.add(sub.strip("/"))
    return names | set(module_code_files(folder))  # a sentence-transformers module's own code, carried


def foreign_entries(folder: str | Path) -> list[str]:
    """Top-level entries of ``folder`` papa-surgery did not write (folders end with ``/``), sorted."""
    folder = Path(folder)
    own = checkpoint_files(folder)
    return sorted(
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
        for p in folder.iterdir()
        if p.name not in own and not _SHARD.match(p.name)
    )


def _names(entries: list[str], limit: int = 8) -> str:
    shown = ", ".join(entries[:limit])
    return shown + (f" and {len(entries) - limit} more" if len(entries) > limit else "")


# ---------------------------------------------------------------------------------------------- the checks
def reading_relation(out: str | Path, source: str | Path) -> str | None:
    """How ``out`` relates to the ``source`` being read: "is", "holds", "lies inside", or ``None``."""
    try:
        out_r, src_r = Path(out).resolve(), Path(source).resolve()
    except (OSError, RuntimeError):  # a symlink loop: not the source
        return None
    if out_r == src_r:
        return "is"
    if out_r in src_r.parents:
        return "holds"
    if src_r in out_r.parents:
        return "lies inside"
    return None


def local_sources(*names) -> list[Path]:
    """The names that are existing local paths (a model's ``_name_or_path``, a tokenizer's ``name_or_path``)."""
    found = []
    for name in names:
        if name and isinstance(name, (str, Path)) and Path(name).exists():
            found.append(Path(name))
    return found


def check_folder(
    out_dir: str | Path, overwrite: bool, reading: Iterable[str | Path] = (), argument: str = "out_dir"
) -> None:
    """ValueError unless a checkpoint may be written to ``out_dir``.

    Allowed: a new path, an empty folder, or (with ``overwrite``) a PAPA checkpoint holding only files
    papa-surgery writes. Refused whatever ``overwrite`` says: a file, the model being read (``reading``: the
    source folder, also through a symlink, or a folder holding it or inside it), a folder that is not a
    PAPA checkpoint, or a checkpoint holding other files (they are named).
    """
    out = Path(out_dir)
    if out.is_file():
        raise ValueError(f"{_out(argument)} {str(out)!r} is a file; pass a folder path for the checkpoint")
    if not (out.exists() or out.is_symlink()):
        return
    for source in reading:
        relation = reading_relation(out, source)
        if relation is not None:
            raise ValueError(
                f"refusing to overwrite {str(out)!r}: it {relation} the model being read ({source}); "
                f"choose another {_out(argument)}"
            )
    check_not_link(out, argument)
    check_not_cwd(out, argument)
    if empty_folder(out):
        return  # an empty folder is written into
    config = _papa_config(out) if out.is_dir() else None
    if config is None:
        model_type = (_json_dict(out / "config.json") or {}).get("model_type") if out.is_dir() else None
        if model_type:
            what = f"it is a {model_type} model folder, not a PAPA checkpoint"
        else:
            entries = foreign_entries(out) if out.is_dir() else []
            what = "it is not a PAPA checkpoint" + (
                f" and holds other content, files papa-surgery did not write: {_names(entries)}" if entries else ""
            )
        raise ValueError(f"refusing to overwrite {str(out)!r}: {what}; choose another {_out(argument)}")
    entries = foreign_entries(out)
    if entries:
        raise ValueError(
            f"refusing to overwrite {str(out)!r}: it holds files papa-surgery did not write: {_names(entries)}; "
            f"move them or choose another {_out(argument)}"
        )
    if not overwrite:
        raise ValueError(f"output folder {str(out)!r} already exists; pass {spell('overwrite', True)} to replace it")


def check_output_folder(out_dir: str | Path, overwrite: bool, kind: str, argument: str = "out_dir") -> None:
    """ValueError unless a ``kind`` folder ("report" or "analysis") may be written to ``out_dir``: a new path, an
    empty folder, or (with ``overwrite``) an earlier folder of that kind holding only what papa-surgery wrote in it.
    Never a file, a folder of another kind, or one holding anything else (it is named)."""
    out = Path(out_dir)
    label = _noun(kind)
    if out.is_file():
        raise ValueError(f"{_out(argument)} {str(out)!r} is a file; pass a folder path for the {label}")
    if not (out.exists() or out.is_symlink()):
        return
    check_not_link(out, argument)
    check_not_cwd(out, argument)
    if empty_folder(out):
        return
    found = kind_of(out) if out.is_dir() else None
    if found != kind:
        what = f"it is {_ours(found)}" if found else f"it is not {LABELS[kind]} papa-surgery wrote"
        entries = sorted(p.name for p in out.iterdir()) if out.is_dir() and not found else []
        what += f" and holds {_names(entries)}" if entries else ""
        raise ValueError(f"refusing to overwrite {str(out)!r}: {what}; choose another {_out(argument)}")
    own = REPORT_FILES if kind == "report" else _analysis_files(out) or set()
    entries = sorted(p.name for p in out.iterdir() if p.name not in own and p.name != ".DS_Store")
    if entries:
        raise ValueError(
            f"refusing to overwrite {str(out)!r}: it holds files papa-surgery did not write: {_names(entries)}; "
            f"move them or choose another {_out(argument)}"
        )
    if not overwrite:
        raise ValueError(f"{label} {str(out)!r} already exists; pass {spell('overwrite', True)} to replace it")


def check_file(path: str | Path, overwrite: bool, kind: str, argument: str = "out") -> Path:
    """ValueError unless ``path`` may be written as a ``kind`` output ("constants" or "ranking"): a new path,
    or (with ``overwrite``) an earlier output of the same kind. Never a folder or another kind of file."""
    label = _noun(kind)
    check_file_path(path, label, "constants.safetensors" if kind == "constants" else f"{kind}.json", argument)
    path = Path(path)
    check_not_link(path, argument, "file")
    if path.is_dir():
        raise ValueError(f"{_out(argument)} {str(path)!r} is a folder; pass a file path for the {label}")
    if not path.exists():
        return path
    found = kind_of(path)
    if found != kind:
        what = f"it is {_ours(found)}, not {LABELS[kind]}" if found else f"it is not {LABELS[kind]} papa-surgery wrote"
        raise ValueError(f"refusing to overwrite {str(path)!r}: {what}; move it or choose another {_out(argument)}")
    if not overwrite:
        raise ValueError(f"{label} {str(path)!r} already exists; pass {spell('overwrite', True)} to replace it")
    return path


def check_results_file(path: str | Path, argument: str = "out_path") -> None:
    """ValueError unless results rows may be appended to ``path``: a new or empty file, or a results file."""
    check_file_path(path, "results (JSONL)", "results.jsonl", argument)
    path = Path(path)
    if path.is_symlink() and not path.exists():  # appending would make a file where it leads, silently
        raise ValueError(
            f"{_out(argument)} {str(path)!r} is a symbolic link to {path.resolve()}, which does not exist; pass the "
            "results file itself"
        )
    if path.is_dir():
        raise ValueError(f"{_out(argument)} {str(path)!r} is a folder; pass a file path for the results (JSONL)")
    if not path.is_file() or path.stat().st_size == 0:
        return
    found = kind_of(path)
    if found != "results":
        what = f"it is {_ours(found)}" if found else "it is not a results file papa-surgery wrote"
        raise ValueError(f"refusing to append results to {str(path)!r}: {what}; choose another {_out(argument)}")


def _noun(kind: str) -> str:
    """The label of ``kind`` without its article: ``an analysis folder`` -> ``analysis folder``."""
    return LABELS[kind].split(" ", 1)[1]


def _ours(kind: str) -> str:
    """``a constants file`` -> ``a papa-surgery constants file`` (a checkpoint is named as it is)."""
    return LABELS[kind] if kind == "checkpoint" else f"a papa-surgery {_noun(kind)}"
