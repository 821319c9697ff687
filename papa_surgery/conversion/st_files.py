"""Keep a sentence-transformers source's pipeline (modules, pooling, normalisation, prompts) in a checkpoint.

A sentence-transformers model folder is a transformers model plus ``modules.json`` and one folder per
module after the encoder (``1_Pooling``, ``2_Normalize``, a ``Dense`` projection...). Without them
``SentenceTransformer(checkpoint)`` would rebuild a default pipeline (mean pooling, no normalisation,
``max_seq_length`` 512): a different embedding. The encoder module is the checkpoint itself, so only the
files around it are copied, with ``max_seq_length`` capped at the constants' slot count L. A module of the
source's own code (``modules.json`` naming ``my_pooling.MyPooling``, loaded with ``trust_remote_code=True``) keeps
its ``.py`` file, and the files it imports relatively, beside it: the checkpoint loads where the source loads.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

from ..failures import one_line
from ..outputs.st_modules import json_object, module_code_files, module_entries

# Top-level files of a sentence-transformers folder besides the encoder's own.
ST_FILES = ("modules.json", "sentence_bert_config.json", "config_sentence_transformers.json")
logger = logging.getLogger("papa_surgery")
_SAID: set[tuple[str, str]] = set()  # (source, why) already warned about: once per process


@dataclass(frozen=True)
class Detection:
    """Whether a source is a sentence-transformers model, and how that is known.

    Attributes:
        folder: the folder holding its sentence-transformers files (``None``: not such a model, or not known).
        known: ``False`` when its files could not be read (offline and not cached, a gated or missing repository):
            it is then treated as a plain transformers model, which the warning and the recipe say.
        why: in words, what was found or why it could not be checked.
    """

    folder: Path | None
    known: bool
    why: str

    def record(self, copied: list[str]) -> dict:
        """The recipe's ``sentence_transformers`` entry: the answer, what was kept, and why."""
        return {"model": (self.folder is not None) if self.known else None, "files": copied, "why": self.why}


def detect_sentence_transformers(source: str | Path | None, revision: str | None = None) -> Detection:
    """Whether ``source`` is a sentence-transformers model (``modules.json``), and where its files are.

    A local folder is read as it is; a Hub id is fetched with only those small files (and its module folders'
    configs), never the weights. When a Hub id's files cannot be read the answer is unknown: one warning (once per
    source and cause) says so and what it changes; nothing falls back in silence.
    """
    if not source:
        return Detection(None, True, "no source named")
    path = Path(str(source))
    if path.is_dir():
        found = (path / "modules.json").is_file() and bool(module_entries(path))  # a bad modules.json: refused
        return Detection(path if found else None, True, f"its folder has {'' if found else 'no '}modules.json")
    if str(source).startswith(("/", ".", "~")):
        return Detection(None, True, "not a folder or a Hub id")
    from huggingface_hub import constants, snapshot_download

    from ..models.loading import hub_reachable

    offline = "HF_HUB_OFFLINE=1" if constants.HF_HUB_OFFLINE else None
    offline = offline or (None if hub_reachable() else "the Hub does not answer")  # then the cache, no retries
    try:
        folder = Path(
            snapshot_download(
                str(source),
                revision=revision,
                allow_patterns=[*ST_FILES, "*/config.json", "*/*.json", "*.py"],  # *.py: custom modules' code
                local_files_only=bool(offline),
            )
        )
    except Exception as err:  # not in the cache while offline, gated, not on the Hub: unknown, and said
        return _unknown(source, f"{offline} and its files are not in the cache" if offline else one_line(err)[:200])
    found = (folder / "modules.json").is_file() and bool(module_entries(folder))  # a bad modules.json: refused
    if not found and offline and not _known_absent(str(source), revision):
        return _unknown(source, f"{offline} and the cache does not say whether it has modules.json")
    return Detection(folder if found else None, True, f"its Hub repository has {'' if found else 'no '}modules.json")


def _known_absent(repo_id: str, revision: str | None) -> bool:
    """Whether the cache recorded that ``repo_id`` has no ``modules.json`` (an earlier download found none)."""
    from huggingface_hub import try_to_load_from_cache

    cached = try_to_load_from_cache(repo_id, "modules.json", revision=revision)
    return cached is not None and not isinstance(cached, str)  # a path: present; None: never asked


def _unknown(source, cause: str) -> Detection:
    why = f"could not be checked ({cause})"
    if (str(source), why) not in _SAID:
        _SAID.add((str(source), why))
        logger.warning(
            "whether %s is a sentence-transformers model %s: it is treated as a plain transformers model (no pooling "
            "or normalisation files kept, L from its tokenizer), as the recipe records; run once online or pass a "
            "local folder to keep them",
            source,
            why,
        )
    return Detection(None, False, why)


def sentence_transformers_folder(source: str | Path | None, revision: str | None = None) -> Path | None:
    """The folder holding ``source``'s sentence-transformers files, or ``None`` if it is not such a model (or that
    could not be checked, which :func:`detect_sentence_transformers` warns about)."""
    return detect_sentence_transformers(source, revision).folder


def sentence_transformers_max_length(source: str | Path | None) -> int | None:
    """The ``max_seq_length`` a sentence-transformers source truncates at (``None``: not such a model, or unset)."""
    folder = sentence_transformers_folder(source)
    if folder is None:
        return None
    value = _encoder_config(folder, module_entries(folder)[0]).get("max_seq_length")
    return int(value) if isinstance(value, int) and value > 0 else None


def copy_sentence_transformers_files(source: str | Path | None, out_dir: str | Path, max_length: int) -> dict:
    """Copy the sentence-transformers files of ``source`` into ``out_dir``; the recipe's record of it
    (:meth:`Detection.record`: whether ``source`` is such a model, the names copied, and why).

    ``max_seq_length`` in ``sentence_bert_config.json`` becomes at most ``max_length`` (L), so
    ``SentenceTransformer.encode`` truncates inputs to what the constant attention covers.
    """
    detection = detect_sentence_transformers(source)
    folder = detection.folder
    if folder is None:
        return detection.record([])
    out_dir = Path(out_dir)
    encoder, *others = module_entries(folder)
    # The checkpoint is the encoder module: at its root, whatever folder the source kept it in (older models kept
    # it in 0_Transformer/, whose copy would load the source's own weights in place of the converted model).
    modules = [{**encoder, "path": ""}, *others]
    (out_dir / "modules.json").write_text(json.dumps(modules, indent=2) + "\n", encoding="utf-8")
    copied = ["modules.json"]
    for name in ST_FILES[1:]:
        if (folder / name).is_file():
            shutil.copy2(folder / name, out_dir / name)
            copied.append(name)
    for module in others:
        sub = module.get("path") or ""
        if sub and (folder / sub).is_dir():
            shutil.copytree(folder / sub, out_dir / sub, dirs_exist_ok=True)
            copied.append(sub)
    for name in module_code_files(folder):
        shutil.copy2(folder / name, out_dir / name)
        copied.append(name)
    config_path = out_dir / "sentence_bert_config.json"
    config = json_object(config_path) or _encoder_config(folder, encoder)
    # sentence-transformers 2-5 keep max_seq_length here; 6 may leave it to the tokenizer's model_max_length.
    source_length = config.get("max_seq_length") or _tokenizer_max_length(folder) or max_length
    config["max_seq_length"] = min(int(source_length), int(max_length))
    config_path.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    if "sentence_bert_config.json" not in copied:
        copied.append("sentence_bert_config.json")
    return detection.record(copied)


def _encoder_config(folder: Path, encoder: dict) -> dict:
    """The encoder module's ``sentence_bert_config.json``: beside ``modules.json``, or in the encoder's own folder
    (``0_Transformer/``), where older models keep it."""
    name = "sentence_bert_config.json"
    return json_object(folder / name) or json_object(folder / (encoder.get("path") or "") / name)


def _tokenizer_max_length(folder: Path) -> int | None:
    path = folder / "tokenizer_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text(encoding="utf-8")).get("model_max_length")
    return int(value) if isinstance(value, (int, float)) and value < 10**9 else None
