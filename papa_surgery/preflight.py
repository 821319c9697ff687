"""Checks every command runs before its first expensive step, so a bad input fails fast and writes nothing."""

from __future__ import annotations

from pathlib import Path

from .options import RankOptions
from .sources import public_name_of


def check_output_file(out, overwrite: bool, kind: str) -> Path:
    """ValueError unless ``out`` may be written as a ``kind`` output ("constants" or "ranking"): not a folder,
    not an existing file unless ``overwrite`` and an earlier output of that kind (``papa_surgery.overwrite``)."""
    from .overwrite import CLI, check_file

    return check_file(out, overwrite, kind, CLI)


def check_max_length(config, max_length: int, model_name: str, option: str = "--max-length") -> None:
    """OptionError when ``max_length`` slots need more positions than the model has (before any work)."""
    from .architectures import is_papa_config
    from .loading import position_limit
    from .options import OptionError

    if is_papa_config(config):
        return
    limit = position_limit(config)
    if limit is not None and max_length > limit:
        raise OptionError(
            option,
            f"{max_length} slots exceed the {limit} positions {public_name_of(model_name)} has "
            f"(max_position_embeddings); pass {option} {limit} or less",
        )


def check_source_config(config, model_name: str) -> None:
    """ValueError for a PAPA checkpoint given where a source model is needed (with what to pass instead)."""
    from .architectures import is_papa_config

    if is_papa_config(config):
        source = getattr(config, "papa_source_model", None)
        raise ValueError(
            f"{model_name} is already a PAPA checkpoint ({len(config.papa_constant_heads or [])} constant heads); "
            f"convert its source model{f' ({source})' if source else ''} instead, or probe it as it is"
        )


def task_split(task, split: str, data_dir, max_examples=None):
    """``probe.load_split`` with the fix named when the Hub dataset cannot be reached (offline, no network)."""
    from .probe import get_task, load_split

    task = get_task(task)
    try:
        return load_split(task, split, data_dir, max_examples)
    except OSError as err:  # ConnectionError, offline mode
        if data_dir is not None:
            raise
        raise ValueError(
            f"task {task.name!r}: the Hub dataset could not be reached ({str(err).splitlines()[0]}); pass "
            "--data-dir with local files (e.g. --data-dir ../shared/data)"
        ) from None


def preflight_ranking(rank: RankOptions) -> None:
    """Check a ranking request's inputs (method, task, data) before the model loads or calibration runs."""
    from .ranking import check_rank_inputs

    if rank.ranking:
        return
    method = check_rank_inputs(rank.method or ("lambda" if rank.task else "variance"), rank.task)
    if method in ("lambda", "reversed-lambda"):
        from .probe import get_task

        task_split(get_task(rank.task), "train", rank.data_dir, rank.max_train_examples)


def needs_corpus(kind: str, constants_file, rank: RankOptions | None) -> bool:
    """Whether a run will calibrate on a corpus (so the corpus must be opened before the model loads)."""
    from .constants import DATA_FREE_KINDS

    if constants_file:
        return kind == "distilled"  # distilling a file's constants reads the corpus
    if kind not in DATA_FREE_KINDS:
        return True
    method = None if rank is None or rank.ranking else (rank.method or ("lambda" if rank.task else "variance"))
    return method in ("variance", "lambda", "reversed-lambda", "norm")


def check_pairs_fit(tokenizer, max_length: int, pairs: bool) -> None:
    """Raise the slot layout's error for a pair length too small for any pair, before calibrating."""
    if pairs:
        from .encoding import encode

        encode(tokenizer, [("a", "b")], max_length, pairs=True)
