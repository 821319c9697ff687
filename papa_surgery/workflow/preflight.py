"""Checks a job runs before its first expensive step, so a bad input fails fast and writes nothing."""

from __future__ import annotations

from pathlib import Path

from .. import registry
from ..options import ArgumentError, RankOptions, spell


def check_output_file(out, overwrite: bool, kind: str) -> Path:
    """ValueError unless ``out`` may be written as a ``kind`` output ("constants" or "ranking"): not a folder, not
    an existing file unless ``overwrite`` and an earlier output of that kind (:mod:`papa_surgery.outputs.overwrite`)."""
    from ..outputs.overwrite import check_file

    return check_file(out, overwrite, kind)


def write_output(out: Path, overwrite: bool, kind: str, save) -> None:
    """``save(path)`` into a staging file that becomes ``out``, replacing only an output of the same ``kind``
    (checked again at the end: the file may have changed while the command worked)."""
    from ..outputs.staging import staged_file

    with staged_file(out, overwrite=overwrite, check=lambda target: check_output_file(target, overwrite, kind)) as tmp:
        save(tmp)


def check_source_config(config, model_name: str) -> None:
    """ValueError for a PAPA checkpoint given where a source model is needed (with what to pass instead)."""
    from ..models.families import is_papa_config

    if is_papa_config(config):
        source = getattr(config, "papa_source_model", None)
        raise ValueError(
            f"{model_name} is already a PAPA checkpoint ({len(config.papa_constant_heads or [])} constant heads); "
            f"convert its source model{f' ({source})' if source else ''} instead, or probe it as it is"
        )


def check_task_read(chosen: registry.Method, task) -> None:
    """Refuse a labelled ``task`` given to a ranking that reads none (it would be ignored silently)."""
    if task is not None and not chosen.task:
        raise ArgumentError(
            "task",
            f"the {chosen.name!r} ranking reads no labelled task: drop {spell('task')}, or rank with a learned "
            f"method ({', '.join(registry.LEARNED_METHODS)})",
        )


def preflight_ranking(rank: RankOptions) -> None:
    """Check a ranking request's inputs (method, task, data) before the model loads or calibration runs."""
    if rank.ranking:
        return
    if registry.check_method(rank.resolved_method, rank.task).task:
        from ..tasks import get_task, task_split

        task_split(get_task(rank.task), "train", rank.data_dir, rank.max_train_examples)


def check_pairs_fit(tokenizer, max_length: int, pairs: bool) -> None:
    """Raise the slot layout's error for a pair length too small for any pair, before calibrating."""
    if pairs:
        from ..calibration.encoding import encode

        encode(tokenizer, [("a", "b")], max_length, pairs=True)
