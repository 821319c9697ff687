"""Writing a PAPA checkpoint folder, all or nothing: weights, config, model code, tokenizer, recipe, card."""

from __future__ import annotations

import json
from pathlib import Path

from .st_files import copy_sentence_transformers_files


def save_tokenizer(tokenizer, out_dir: str | Path, max_length: int) -> None:
    """Save ``tokenizer`` with ``model_max_length`` = L, so ``truncation=True`` and pipelines fit the slots."""
    tokenizer.save_pretrained(out_dir)
    path = Path(out_dir) / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
    config["model_max_length"] = int(max_length)
    path.write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def save_checkpoint(
    model,
    out_dir: str | Path,
    tokenizer=None,
    recipe: dict | None = None,
    overwrite: bool = False,
    card: bool = True,
    results=None,
) -> Path:
    """Write a standalone PAPA checkpoint folder, all or nothing.

    The folder is assembled in a hidden staging sibling and moved into place only when complete, with a
    rename that never replaces something this call did not create (``papa_surgery.atomic``): a failure,
    SIGTERM or Ctrl-C leaves no partial output, and a folder that appears at ``out_dir`` meanwhile is kept
    (the error names where the finished checkpoint went). An existing folder is an error unless
    ``overwrite``, which replaces only an earlier checkpoint or an empty folder. ``results`` (a probe results
    JSONL file or rows) adds a results table to the model card.
    """
    from ..outputs.staging import staged_dir

    out_dir = Path(out_dir)
    check_output_dir(out_dir, overwrite)
    if not hasattr(model.config, "papa_constant_heads"):
        raise ValueError("save_checkpoint needs a PAPA model (from papa_surgery.convert.convert)")
    with staged_dir(out_dir, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)  # the PAPA classes are registered for auto classes: code files ride along
        if tokenizer is not None:
            save_tokenizer(tokenizer, tmp, int(model.config.papa_max_length))
            copy_sentence_transformers_files(tokenizer.name_or_path, tmp, int(model.config.papa_max_length))
        (tmp / "papa_recipe.json").write_text(json.dumps(recipe or {}, indent=2, default=str) + "\n")
        if card:
            from .card import write_card

            write_card(tmp, results=results, command=(recipe or {}).get("command"))
    return out_dir


def check_output_dir(out_dir: str | Path, overwrite: bool = False) -> None:
    """ValueError unless a checkpoint may be written to ``out_dir`` (checked again, atomically, at the end).

    ``overwrite`` replaces an earlier PAPA checkpoint or an empty folder, never anything else (a typo such
    as ``--out .`` must not delete a project).
    """
    out_dir = Path(out_dir)
    if out_dir.is_file():
        raise ValueError(f"--out {str(out_dir)!r} is a file; pass a folder path for the checkpoint")
    if not out_dir.exists():
        return
    if not overwrite:
        raise ValueError(f"output folder {str(out_dir)!r} already exists; pass --overwrite to replace it")
    if any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
        raise ValueError(
            f"--overwrite replaces an earlier checkpoint, but {str(out_dir)!r} is a folder with other content "
            "(no config.json); choose another --out"
        )
