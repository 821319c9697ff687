"""The whole jobs behind the CLI commands, as library calls taking the option dataclasses.

``sources`` says where the model comes from and ``preflight`` checks the inputs; this module does the work.

``run_convert`` is ``papa-surgery convert``: load the source, get constants (a file, a data-free kind,
or a calibration on a corpus), get a ranking (a file, or a method), convert, write the checkpoint folder
with its recipe and card, and optionally push it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .distributed import agree, is_main_process, on_main, world_size
from .options import CalibrationOptions, ConvertOptions, DistillOptions, PushOptions, RankOptions, RunOptions
from .preflight import (
    check_max_length,
    check_output_file,
    check_pairs_fit,
    check_source_config,
    needs_corpus,
    preflight_ranking,
)
from .sources import (
    default_device,
    default_out_dir,
    load_model,
    public_name_of,
    resolve_model,
    source_info,
    source_record,
)

logger = logging.getLogger("papa_surgery")

DEFAULT_HUB_EXAMPLES = 2000


def open_corpus(cal: CalibrationOptions):
    """The calibration corpus; with none given, WikiText-103 train from the Hub or, offline, the bundled excerpt."""
    from .corpus import DEFAULT_HUB_CORPUS, default_corpus, load_corpus

    if cal.corpus:
        return load_corpus(cal.corpus, pairs=cal.pairs, max_examples=cal.max_examples)
    if cal.pairs:
        raise ValueError("--pairs needs a --corpus of sentence pairs (the default corpus is single sentences)")
    limit = cal.max_examples or DEFAULT_HUB_EXAMPLES
    if os.environ.get("HF_HUB_OFFLINE", "0") not in ("1", "true", "True", "ON"):
        try:
            return load_corpus(DEFAULT_HUB_CORPUS, max_examples=limit)
        except ValueError as err:
            logger.warning("%s", err)
    corpus = default_corpus(max_examples=cal.max_examples)
    logger.warning(
        "Hub not reachable: calibrating on the bundled WikiText-2 excerpt (%s); pass --corpus to choose",
        corpus.description,
    )
    return corpus


def obtain_constants(
    model,
    tokenizer,
    source: str,
    cal: CalibrationOptions,
    run: RunOptions,
    kind="average",
    constants_file=None,
    progress=True,
    corpus=None,
):
    """Constants for ``model``: a file, a data-free kind, or an average over the corpus (calibration or analysis).

    ``corpus``: the corpus already opened by a preflight (default: ``open_corpus(cal)``).
    """
    from .architectures import num_heads_layers
    from .constants import DATA_FREE_KINDS, Constants

    if constants_file:
        constants = Constants.load(constants_file)
        constants.check_compatible(model.config, source, model=model)
        return constants
    if kind in DATA_FREE_KINDS:
        heads, layers = num_heads_layers(model.config)
        return Constants.from_kind(kind, layers, heads, cal.max_length, source_model=source)
    from .analysis import corpus_constants

    corpus = corpus if corpus is not None else open_corpus(cal)
    return corpus_constants(
        "average" if kind == "distilled" else kind,  # distillation starts from the average
        model,
        tokenizer,
        corpus,
        max_length=cal.max_length,
        pairs=corpus.pairs,
        batch_size=run.batch_size,
        progress=progress,
        source_name=source,
    )


def obtain_ranking(
    model, tokenizer, rank: RankOptions, constants, run: RunOptions, source: str, cal=None, progress=True
):
    """A ranking from a file, or made with ``rank.method`` (default: lambda with a task, else variance)."""
    from .rank_methods import rank_heads
    from .ranking import Ranking, check_rank_inputs

    if rank.ranking:
        if rank.method:
            raise ValueError("pass either --ranking FILE or --method, not both")
        ranking = Ranking.load(rank.ranking)
        ranking.check_compatible(model.config)
        return ranking
    method = check_rank_inputs(rank.method or ("lambda" if rank.task else "variance"), rank.task)
    if method == "norm" and (constants is None or "contribution" not in constants.metadata):
        # The norm ranking reads each head's mean contribution ||alpha f||, measured with norm-average constants.
        constants = obtain_constants(
            model, tokenizer, source, cal or CalibrationOptions(), run, kind="norm-average", progress=progress
        )
    if method in ("variance", "lambda", "reversed-lambda") and (constants is None or constants.variance is None):
        # Data-free kinds carry no calibration: the ranking still needs calibrated averages.
        constants = obtain_constants(model, tokenizer, source, cal or CalibrationOptions(), run, progress=progress)
    lambda_options = {
        "steps": rank.steps,
        "max_train_examples": rank.max_train_examples,
        "batch_size": run.batch_size,
        "device": default_device(run.device),
        "progress": progress,
    }
    return rank_heads(
        method,
        model,
        tokenizer=tokenizer,
        constants=constants,
        task=rank.task,
        data_dir=rank.data_dir,
        seed=run.seed,
        **lambda_options,
    )


def run_convert(
    model_name: str,
    cal: CalibrationOptions,
    rank: RankOptions,
    conv: ConvertOptions,
    push: PushOptions,
    run: RunOptions,
    do_push: bool = False,
    command: str | None = None,
    progress: bool = True,
    distill: DistillOptions | None = None,
) -> Path:
    """``papa-surgery convert``: the whole job; returns the checkpoint folder.

    Every input (output folder, constants and ranking files, push target, model, slot count, corpus, task
    data) is checked before the first expensive step (loading weights, calibrating, training lambdas).
    """
    from .constants import Constants
    from .convert import build_recipe, check_output_dir, convert, save_checkpoint
    from .loading import load_config
    from .overwrite import CLI, local_sources
    from .ranking import Ranking, check_fraction

    check_fraction(conv.fraction)
    out = Path(conv.out) if conv.out else default_out_dir(model_name, conv.fraction)
    reading = local_sources(resolve_model(model_name))  # --out must not be (or hold, or lie in) the source
    check_output_dir(out, conv.overwrite, reading=reading, words=CLI)
    constants_file = Constants.load(conv.constants) if conv.constants else None
    ranking_file = Ranking.load(rank.ranking) if rank.ranking else None
    if rank.ranking and rank.method:
        raise ValueError("pass either --ranking FILE or --method, not both")
    if not rank.ranking:
        from .ranking import check_rank_inputs

        check_rank_inputs(rank.method or ("lambda" if rank.task else "variance"), rank.task)
    repo_id = None
    if do_push:
        from .hub import resolve_push_target

        repo_id = resolve_push_target(push.repo_id, out.resolve().name)
    path = resolve_model(model_name)
    config = load_config(path)
    check_source_config(config, model_name)
    length = constants_file.max_length if constants_file else cal.max_length
    check_max_length(config, length, model_name)
    if ranking_file is not None:
        ranking_file.check_compatible(config)
    corpus = open_corpus(cal) if needs_corpus(conv.kind, conv.constants, rank) else None
    preflight_ranking(rank)
    info = source_info(path)
    source = info["hub_id"] or public_name_of(model_name)
    model, tokenizer = load_model(model_name, run)
    check_pairs_fit(tokenizer, cal.max_length, cal.pairs and corpus is not None)
    if constants_file is not None:
        constants_file.check_compatible(model.config, source, model=model)
        constants = constants_file
    else:
        constants = obtain_constants(model, tokenizer, source, cal, run, conv.kind, None, progress, corpus=corpus)
    ranking = ranking_file or obtain_ranking(model, tokenizer, rank, constants, run, source, cal, progress)
    heads = ranking.select(conv.fraction)
    if conv.kind == "distilled":
        corpus = corpus if corpus is not None else open_corpus(cal)
        constants = distil_constants(model, tokenizer, corpus, constants, heads, distill, run, progress)
    papa = convert(
        model,
        constants,
        heads,
        tokenizer=tokenizer,
        kind=conv.kind,
        method=ranking.method,
        fraction=conv.fraction,
        dtype=conv.dtype,
        storage=conv.storage,
        trainable_constants=conv.trainable_constants,
        source_name=source,
    )
    recipe = build_recipe(papa, constants, ranking, command=command)
    recipe["source"].update(source_record(model_name, path, info))
    recipe["processes"] = world_size()
    agree()  # under torchrun / accelerate launch: rank 0 writes and pushes, once every rank is done
    if not is_main_process():
        return out
    save_checkpoint(
        papa, out, tokenizer=tokenizer, recipe=recipe, overwrite=conv.overwrite, results=conv.results, words=CLI
    )
    if do_push:
        from .hub import push as hub_push

        hub_push(out, repo_id, private=push.private, revision=push.revision, create_pr=push.create_pr)
    return out


def run_calibrate(
    model_name: str,
    cal: CalibrationOptions,
    run: RunOptions,
    out: str,
    progress=True,
    overwrite: bool = False,
    kind: str = "average",
    distill: DistillOptions | None = None,
) -> Path:
    """``papa-surgery calibrate``: write a constants file (an existing one only with ``overwrite``)."""
    from .loading import load_config

    out = check_output_file(out, overwrite, "constants")
    path = resolve_model(model_name)
    config = load_config(path)
    check_source_config(config, model_name)
    check_max_length(config, cal.max_length, model_name)
    corpus = open_corpus(cal)
    source = source_info(path)["hub_id"] or public_name_of(model_name)
    model, tokenizer = load_model(model_name, run)
    check_pairs_fit(tokenizer, cal.max_length, cal.pairs)
    constants = obtain_constants(model, tokenizer, source, cal, run, progress=progress, corpus=corpus)
    if kind == "distilled":  # every head constant: the constants of an attention-free model
        every = [[layer, head] for layer in range(constants.num_layers) for head in range(constants.num_heads)]
        constants = distil_constants(model, tokenizer, corpus, constants, every, distill, run, progress)
    on_main(write_output, out, overwrite, "constants", constants.save)  # under a launcher: rank 0 writes
    return out


def distil_constants(model, tokenizer, corpus, constants, heads, options: DistillOptions | None, run, progress):
    """``distilled`` constants for ``heads``, trained from ``constants`` on ``corpus`` (``papa_surgery.distill``)."""
    from .distill import distill

    options = options or DistillOptions()
    return distill(
        model,
        tokenizer,
        corpus,
        constants,
        heads,
        batch_size=run.batch_size,
        seed=run.seed,
        device=run.device,
        progress=progress,
        **options.kwargs(),
    )


def run_rank(
    model_name: str,
    cal: CalibrationOptions,
    rank: RankOptions,
    run: RunOptions,
    constants_file: str | None,
    out: str,
    progress=True,
    overwrite: bool = False,
) -> Path:
    """``papa-surgery rank``: write a ranking JSON (an existing one only with ``overwrite``)."""
    from .constants import Constants
    from .loading import load_config
    from .ranking import check_rank_inputs

    if rank.ranking:
        raise ValueError("`rank` makes a ranking: pass --method, not --ranking")
    check_rank_inputs(rank.method or ("lambda" if rank.task else "variance"), rank.task)
    out = check_output_file(out, overwrite, "ranking")
    given = Constants.load(constants_file) if constants_file else None
    path = resolve_model(model_name)
    config = load_config(path)
    check_source_config(config, model_name)
    method = rank.method or ("lambda" if rank.task else "variance")
    calibrates = given is None and (
        cal.corpus is not None or method in ("variance", "lambda", "reversed-lambda", "norm")
    )
    if calibrates:
        check_max_length(config, cal.max_length, model_name)
    corpus = open_corpus(cal) if calibrates else None
    preflight_ranking(rank)
    source = source_info(path)["hub_id"] or public_name_of(model_name)
    model, tokenizer = load_model(model_name, run)
    constants = None
    if given is not None:
        given.check_compatible(model.config, source, model=model)
        constants = given
    elif cal.corpus:
        check_pairs_fit(tokenizer, cal.max_length, cal.pairs)
        constants = obtain_constants(model, tokenizer, source, cal, run, "average", None, progress, corpus=corpus)
    ranking = obtain_ranking(model, tokenizer, rank, constants, run, source, cal, progress)
    on_main(write_output, out, overwrite, "ranking", ranking.save)  # under a launcher: rank 0 writes
    return out


def write_output(out: Path, overwrite: bool, kind: str, save) -> None:
    """``save(path)`` into a staging file that becomes ``out``, replacing only an output of the same ``kind``
    (checked again at the end: the file may have changed while the command worked)."""
    from .atomic import staged_file
    from .preflight import check_output_file

    with staged_file(out, overwrite=overwrite, check=lambda target: check_output_file(target, overwrite, kind)) as tmp:
        save(tmp)
