"""Keep a sentence-transformers source's pipeline (modules, pooling, normalisation, prompts) in a checkpoint.

A sentence-transformers model folder is a transformers model plus ``modules.json`` and one folder per
module after the encoder (``1_Pooling``, ``2_Normalize``, a ``Dense`` projection...). Without them
``SentenceTransformer(checkpoint)`` would rebuild a default pipeline (mean pooling, no normalisation,
``max_seq_length`` 512): a different embedding. The encoder module is the checkpoint itself, so only the
files around it are copied, with ``max_seq_length`` capped at the constants' slot count L.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

# Top-level files of a sentence-transformers folder besides the encoder's own.
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")


def sentence_transformers_folder(source: str | Path | None, revision: str | None = None) -> Path | None:
    """The folder holding ``source``'s sentence-transformers files, or ``None`` if it is not such a model.

    A local folder is read as it is; a Hub id is fetched with only those small files (and its module
    folders' configs), never the weights.
    """
    if not source:
        return None
    path = Path(str(source))
    if path.is_dir():
        return path if (path / "modules.json").is_file() else None
    if str(source).startswith(("/", ".", "~")):
        return None
    try:
        from huggingface_hub import constants, snapshot_download

        from ..models.loading import hub_reachable

        offline = constants.HF_HUB_OFFLINE or not hub_reachable()  # the cache only: no retries against a silent Hub
        folder = Path(
            snapshot_download(
                str(source),
                revision=revision,
                allow_patterns=[*ST_FILES, "*/config.json", "*/*.json"],
                local_files_only=offline,
            )
        )
    except Exception:  # offline, gated, or not on the Hub: a plain transformers model then
        return None
    return folder if (folder / "modules.json").is_file() else None


def sentence_transformers_max_length(source: str | Path | None) -> int | None:
    """The ``max_seq_length`` a sentence-transformers source truncates at (``None``: not such a model, or unset)."""
    folder = sentence_transformers_folder(source)
    path = None if folder is None else folder / "sentence_bert_config.json"
    if path is None or not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("max_seq_length")
    return int(value) if isinstance(value, int) and value > 0 else None


def copy_sentence_transformers_files(source: str | Path | None, out_dir: str | Path, max_length: int) -> list[str]:
    """Copy the sentence-transformers files of ``source`` into ``out_dir``; the names copied ([] if none).

    ``max_seq_length`` in ``sentence_bert_config.json`` becomes at most ``max_length`` (L), so
    ``SentenceTransformer.encode`` truncates inputs to what the constant attention covers.
    """
    folder = sentence_transformers_folder(source)
    if folder is None:
        return []
    out_dir = Path(out_dir)
    copied = []
    modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    for name in ST_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, out_dir / name)
            copied.append(name)
    for module in modules:
        sub = module.get("path") or ""
        if sub and (folder / sub).is_dir():
            shutil.copytree(folder / sub, out_dir / sub, dirs_exist_ok=True)
            copied.append(sub)
    config_path = out_dir / "sentence_bert_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    # sentence-transformers 2-5 keep max_seq_length here; 6 may leave it to the tokenizer's model_max_length.
    source_length = config.get("max_seq_length") or _tokenizer_max_length(folder) or max_length
    config["max_seq_length"] = min(int(source_length), int(max_length))
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if "sentence_bert_config.json" not in copied:
        copied.append("sentence_bert_config.json")
    return copied


def _tokenizer_max_length(folder: Path) -> int | None:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    return int(value) if isinstance(value, (int, float)) and value < 10**9 else None
