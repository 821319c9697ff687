"""Writing a PAPA checkpoint folder, all or nothing: weights, config, model code, tokenizer, recipe, card."""

from __future__ import annotations

import json
from pathlib import Path

from .st_files import copy_sentence_transformers_files

# How the source tokenizer was loaded, which transformers keeps in its init kwargs and writes back on save: not a
# property of the tokenizer, and wrong for whoever loads the checkpoint (local_files_only=True from the Hub).
LOADING_FLAGS = (
    "local_files_only", "is_local", "trust_remote_code", "revision", "cache_dir", "token", "use_auth_token",
    "force_download", "resume_download", "proxies", "subfolder", "_commit_hash", "local_dir",
)  # fmt: skip


def save_tokenizer(tokenizer, out_dir: str | Path, max_length: int) -> None:
    """Save ``tokenizer`` with ``model_max_length`` = L, so ``truncation=True`` and pipelines fit the slots.

    No loading flags (``local_files_only``, ``trust_remote_code``...) are written into the checkpoint. The
    tokenizer's class is declared in ``config.json`` (``tokenizer_class``, a field every config has) instead of
    ``tokenizer_config.json``: transformers 5.0's ``AutoTokenizer`` compares a ``tokenizer_config.json`` class with
    the one it maps the model type to, knows no ``papa_*`` type, and falls back to a generic tokenizer (no
    ``token_type_ids`` for BERT pairs); a class named by the model's config it loads as it is, as later releases
    do. Call it after the model's ``config.json`` is written.
    """
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    for name in LOADING_FLAGS:
        config.pop(name, None)
    config["model_max_length"] = int(max_length)
    declared = config.pop("tokenizer_class", None)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    model_config = Path(out_dir) / "config.json"
    if declared and model_config.is_file():
        fields = json.loads(model_config.read_text(encoding="utf-8"))
        fields["tokenizer_class"] = fields.get("tokenizer_class") or declared
        model_config.write_text(json.dumps(fields, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def save_checkpoint(
    model,
    out_dir: str | Path,
    tokenizer=None,
    recipe: dict | None = None,
    overwrite: bool = False,
    card: bool = True,
    results=None,
    reading=(),
) -> Path:
    """Write a standalone PAPA checkpoint folder, all or nothing.

    The folder is assembled in a hidden staging sibling and moved into place only when complete, with a
    rename that never replaces something this call did not create (``papa_surgery.outputs``): a failure,
    SIGTERM or Ctrl-C leaves no partial output, and a folder that appears at ``out_dir`` meanwhile is kept
    (the error names where the finished checkpoint went). A new path or an empty folder is written; an
    existing checkpoint is replaced only with ``overwrite``, and never the model being read (the model's and
    tokenizer's folders, and ``reading``) or a folder holding files papa-surgery did not write
    (``papa_surgery.outputs.overwrite``). ``results`` (a probe results JSONL file or rows) adds a results
    table to the model card.
    """
    from ..outputs.overwrite import local_sources
    from ..outputs.staging import staged_dir

    out_dir = Path(out_dir)
    # The model and tokenizer may still be read from their folders while the checkpoint is written.
    reading = [
        *local_sources(
            getattr(getattr(model, "config", None), "_name_or_path", None), getattr(tokenizer, "name_or_path", None)
        ),
        *local_sources(*reading),
    ]
    check_output_dir(out_dir, overwrite, reading=reading)
    if not hasattr(model.config, "papa_constant_heads"):
        raise ValueError("save_checkpoint needs a PAPA model (from papa_surgery.convert)")

    def check(target: Path) -> None:  # again just before an existing target is replaced: it may have changed
        check_output_dir(target, overwrite, reading=reading)

    with staged_dir(out_dir, overwrite=overwrite, check=check) as tmp:
        model.save_pretrained(tmp)  # the PAPA classes are registered for auto classes: code files ride along
        recipe = dict(recipe or {})
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp, int(model.config.papa_max_length))
            length = int(model.config.papa_max_length)
            recipe["sentence_transformers"] = copy_sentence_transformers_files(tokenizer.name_or_path, tmp, length)
        (tmp / "papa_recipe.json").write_text(json.dumps(recipe, indent=2, default=str) + "\n")
        if card:
            from .card import write_card

            write_card(tmp, results=results, command=recipe.get("command"))
    return out_dir


def check_output_dir(out_dir: str | Path, overwrite: bool = False, reading=()) -> None:
    """ValueError unless a checkpoint may be written to ``out_dir`` (checked again just before it is replaced).

    A new path or an empty folder is fine; ``overwrite`` replaces an earlier PAPA checkpoint holding only files
    papa-surgery writes, never anything else: not the model being read (``reading``), not a folder with other
    content (a typo such as ``--out .`` must not delete a project). See ``papa_surgery.outputs.overwrite``.
    """
    from ..outputs.overwrite import check_folder

    check_folder(out_dir, overwrite, reading=reading)
