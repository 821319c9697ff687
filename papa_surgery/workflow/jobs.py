"""Whole jobs from names to files, one per CLI command: check every input, load the source, run the workflow, write.

Each job checks everything it can before its first expensive step (loading weights, calibrating, training
lambdas), then runs :class:`.steps.Workflow` on the loaded source and writes its one output; under
``torchrun`` / ``accelerate launch`` every process runs the job and rank 0 alone writes. The CLI commands are
adapters over these calls.
"""

from __future__ import annotations

import logging
import math
from dataclasses import replace
from pathlib import Path

from .. import registry
from ..arguments import check_max_length
from ..distributed import agree, is_main_process, on_main
from ..options import (
    ArgumentError,
    CalibrationOptions,
    ConvertOptions,
    DistillOptions,
    HealOptions,
    PushOptions,
    RankOptions,
    RunOptions,
    spell,
)
from ..options.kind_options import check_kind_options
from .corpora import check_healing_corpus, open_corpus, open_healing_corpus
from .preflight import (
    check_output_file,
    check_pairs_fit,
    check_source_config,
    check_task_read,
    preflight_ranking,
    write_output,
)
from .steps import Workflow

logger = logging.getLogger("papa_surgery")


def _source(model_name: str, trust_remote_code: bool = False):
    """(path, config, public name, source info) of MODEL, checked before its weights load (its config read by the
    code that will load it: papa-surgery's, or with ``trust_remote_code`` the model's own)."""
    from ..models.loading import load_config
    from ..models.sources import public_name_of, resolve_model, source_info

    path = resolve_model(model_name)
    config = load_config(path, trust_remote_code=trust_remote_code)
    info = source_info(path)
    return path, config, info["hub_id"] or public_name_of(model_name), info


def _workflow(model_name: str, run: RunOptions, source: str, progress: bool, attn: str | None = None) -> Workflow:
    from ..models.sources import load_model

    model, tokenizer = load_model(model_name, run, attn=attn)
    return Workflow(model, tokenizer, source_name=source, run=run, progress=progress)


def _calibration(cal: CalibrationOptions, corpus, conv: ConvertOptions | None = None) -> dict:
    """The keyword arguments of ``Workflow.constants`` for these options and the opened corpus (``max_length``
    ``None``: the source's own length, resolved by the workflow once the source is loaded); ``conv``'s storage
    reaches calibration, which streams straight into a compact layout."""
    storage = {} if conv is None else conv.storage_kwargs()
    return {
        "corpus": corpus if corpus is not None else cal.corpus,
        "max_length": cal.max_length,
        "pairs": cal.pairs,
        "max_examples": cal.max_examples,
        **storage,
    }


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
    heal: HealOptions | None = None,
    tuning: tuple[str, ...] = (),
) -> Path:
    """``papa-surgery convert``: calibrate (or read constants), rank, convert, heal (with ``heal``), write the
    checkpoint (and push).

    ``tuning``: the ``distill`` options the user set (refused where the kind made is not theirs).
    Returns the checkpoint folder.
    """
    from ..calibration.constants import Constants
    from ..conversion.checkpoint import check_output_dir, save_checkpoint
    from ..models.sources import default_out_dir, resolve_model, source_record
    from ..ranking.order import Ranking

    out = Path(conv.out) if conv.out else default_out_dir(model_name, conv.fraction)
    reading = [resolve_model(model_name)]  # --out must not be (or hold, or lie in) the source
    check_output_dir(out, conv.overwrite, reading=reading)
    given = Constants.load(conv.constants) if conv.constants else None
    file_kind = given.kind if given else None
    kind, fits = registry.convert_kind(conv.kind, file_kind, conv.constants, cal.max_length, conv.fraction)
    chosen = conv.kind is not None or given is not None
    if chosen or conv.fraction == 0:  # the kind is known before the model loads (the default at fraction 0: average)
        check_kind_options(kind.name, tuning, fits, "" if chosen else " (the default at --fraction 0)")
    ranking = Ranking.load(rank.ranking) if rank.ranking else None
    if rank.ranking and rank.method:
        raise ArgumentError("ranking", f"pass either {spell('ranking')} FILE or {spell('method')}, not both")
    if rank.method:  # before the model or the corpus is opened
        check_task_read(registry.method(rank.method), rank.task)
    repo_id = None
    if do_push:
        from ..conversion.hub import resolve_push_target

        repo_id = resolve_push_target(push.repo_id, out.resolve().name)
    path, config, source, info = _source(model_name, run.trust_remote_code)
    check_source_config(config, model_name)
    if heal is not None:
        _check_heads_to_heal(conv.fraction, config)
    if given is not None or cal.max_length is not None:  # the default, the source's own length, fits by construction
        check_max_length(config, given.max_length if given else cal.max_length, model_name)
    if ranking is not None:
        ranking.check_compatible(config)
    # Fraction 0 or 1 makes no head or every head constant, whatever the order: no ranking is made unless asked for
    # (the default variance ranking would calibrate average constants: at L=8,192 that is minutes for nothing).
    every_or_none = ranking is None and rank.method is None and rank.task is None and conv.fraction in (0.0, 1.0)
    # At fraction 0 the checkpoint stores no matrix, so none is calibrated or fitted (all-MiniLM-L6-v2: a 31 s pass
    # over the corpus for nothing); data-free zeros give the conversion its geometry (slots, storage).
    none_constant = every_or_none and conv.fraction == 0.0 and given is None
    reads_corpus = (kind.needs_corpus if given is None else fits) and not none_constant
    pairs = given.pairs if given is not None else cal.pairs
    length = given.max_length if given is not None else cal.max_length  # None: the source's own, once it loads
    method = None if ranking or every_or_none else registry.method(rank.convert_method(length, pairs))
    if method is not None and ((given is None and method.constants is not None) or method.corpus):
        reads_corpus = True  # the ranking calibrates what it reads, or runs the model on the corpus
    if heal is not None:
        check_healing_corpus(cal.corpus, pairs)
    # healing trains on a given corpus; at fraction 0 one given is still opened, so that a wrong path is an error
    reads_corpus = reads_corpus or ((heal is not None or none_constant) and cal.corpus is not None)
    corpus = open_corpus(cal.corpus, pairs=pairs, max_examples=cal.max_examples) if reads_corpus else None
    preflight_ranking(rank)
    flow = _workflow(model_name, run, source, progress)
    check_pairs_fit(flow.tokenizer, flow.slots(cal.max_length), cal.pairs and corpus is not None)
    if method is not None:  # the default, now that the source's own length is known; a dense ranking must fit
        method = registry.method(rank.convert_method(flow.slots(length), pairs))
        if method.corpus:
            from ..ranking.sensitivity import check_fits

            check_fits(flow.shape, flow.slots(length), "convert")
    if not chosen and conv.fraction != 0:  # the default, now that the source's own length is known
        kind, fits = registry.convert_kind(None, None, max_length=flow.slots(cal.max_length), fraction=conv.fraction)
        check_kind_options(kind.name, tuning, fits, f" (the default kind at L={flow.slots(cal.max_length)})")
    calibration = _calibration(cal, corpus, conv)
    if given is not None:
        given.check_compatible(flow.model.config, source, model=flow.model)
        constants = given
    elif none_constant:
        constants = flow.constants("zeros", max_length=cal.max_length, **conv.storage_kwargs())
    elif not fits:
        constants = flow.constants(kind.name, **calibration)
    else:  # fitted as dense matrices: from the dense average, whatever the checkpoint's storage
        dense = {**calibration, "storage": "dense", "compact_band": None, "compact_rank": None}
        constants = flow.constants(kind.starts_from, **dense)
    heads = None
    if every_or_none:
        heads = flow.every_head() if conv.fraction else []
    elif ranking is None:
        ranking = flow.ranking(
            method.name,
            task=rank.task,
            data_dir=rank.data_dir,
            constants=constants,
            calibration=calibration,
            max_train_examples=rank.max_train_examples,
            **rank.lambda_options(),
            batch_size=run.batch_size,
        )
    if heads is None:
        heads = ranking.select(conv.fraction)
    if fits and not none_constant:  # distilled (or sharpened) for exactly the heads this checkpoint makes constant
        constants = flow.trained(kind.name, constants, heads, corpus, distill)
    papa = flow.convert(
        constants,
        ranking,
        conv.fraction,
        heads=heads,
        kind=kind.name,
        dtype=conv.dtype,
        **conv.storage_kwargs(),
        trainable_constants=conv.trainable_constants,
        command=command,
        record=source_record(model_name, path, info),
    )
    if heal is not None:
        from ..healing.state import HealState, state_path

        healing = corpus if cal.corpus is not None else None  # None: the default healing corpus, not calibration's
        papa = flow.heal(papa, healing, heal, max_examples=cal.max_examples, state_path=state_path(out))
    agree()  # under torchrun / accelerate launch: rank 0 writes and pushes, once every rank is done
    if not is_main_process():
        return out
    save_checkpoint(
        papa, out, tokenizer=flow.tokenizer, recipe=papa.papa_recipe, overwrite=conv.overwrite, results=conv.results
    )
    if heal is not None:
        HealState(state_path(out), "").remove()
    if do_push:
        from ..conversion.hub import push as hub_push

        hub_push(out, repo_id, private=push.private, revision=push.revision, create_pr=push.create_pr)
    return out


def _check_heads_to_heal(fraction: float, config) -> None:
    """ArgumentError naming ``--heal-steps`` when ``fraction`` makes no head of the source constant (0, or a
    fraction that rounds to no head): the student would be its teacher, and healing could only move it away."""
    from ..models.families import num_heads_layers
    from ..ranking.order import head_count

    heads, layers = num_heads_layers(config)
    total = heads * layers
    if head_count(fraction, total) == 0:
        rounds = "" if fraction == 0 else f" ({fraction:g} of its {total} heads rounds to none)"
        smallest = math.ceil(500 / total) / 1000  # head_count rounds half up: one head from 0.5 / total
        raise ArgumentError(
            "heal_steps",
            f"{spell('fraction', f'{fraction:g}')} makes no head constant{rounds}, so there is nothing to heal: drop "
            f"{spell('heal_steps')}, or convert at {spell('fraction', smallest)} or more",
        )


def run_heal(
    checkpoint: str,
    cal: CalibrationOptions,
    heal: HealOptions,
    run: RunOptions,
    out: str | None = None,
    *,
    overwrite: bool = False,
    command: str | None = None,
    progress: bool = True,
) -> Path:
    """``papa-surgery heal``: a PAPA checkpoint healed toward its source, written as a new checkpoint.

    ``out``: the folder to write (``None``: ``<CHECKPOINT's name>-healed`` in the working folder). A run stopped
    midway (Ctrl-C, SIGTERM, a crash) writes no checkpoint; its resume state, kept beside ``out`` from the last
    evaluation on, lets the same command go on from there. Returns the checkpoint folder.
    """
    from ..conversion.checkpoint import check_output_dir, save_checkpoint
    from ..healing.run import teacher_name
    from ..healing.state import HealState, state_path
    from ..models.families import is_papa_config
    from ..models.sources import default_healed_dir, load_model, resolve_model

    out_dir = Path(out) if out else default_healed_dir(checkpoint)
    check_output_dir(out_dir, overwrite, reading=[resolve_model(checkpoint)])
    path, config, _, _ = _source(checkpoint, run.trust_remote_code)
    if not is_papa_config(config):
        raise ArgumentError(
            "checkpoint",
            f"{checkpoint} is not a PAPA checkpoint: convert it first (papa-surgery convert, whose "
            f"{spell('heal_steps')} heals while converting)",
        )
    if not getattr(config, "papa_constant_heads", None):  # before its weights load
        from ..healing.run import NOTHING_TO_HEAL

        raise ArgumentError(
            "checkpoint",
            f"{checkpoint} {NOTHING_TO_HEAL}; heal one converted with at least one constant head (`convert` at a "
            "larger --fraction)",
        )
    pairs = getattr(config, "papa_calibrated_on", None) == "pairs"
    corpus = open_healing_corpus(cal.corpus, pairs=pairs, max_examples=cal.max_examples)
    student, tokenizer = load_model(checkpoint, run)
    student.papa_recipe = _recipe_of(path)
    teacher = teacher_name(student, heal.teacher)
    # --trust-remote-code is for the models the user named: a teacher the checkpoint's recipe names runs no code
    teacher_run = run if heal.teacher else replace(run, trust_remote_code=False)
    _, teacher_config, source, _ = _source(teacher, teacher_run.trust_remote_code)
    check_source_config(teacher_config, teacher)
    flow = _workflow(teacher, teacher_run, source, progress)
    state = state_path(out_dir)
    healed = flow.heal(student, corpus, heal, max_examples=cal.max_examples, state_path=state)
    healed.papa_recipe["healing"]["command"] = command
    agree()  # under torchrun / accelerate launch: rank 0 writes, once every rank is done
    if is_main_process():
        save_checkpoint(healed, out_dir, tokenizer=tokenizer, recipe=healed.papa_recipe, overwrite=overwrite)
        HealState(state, "").remove()
    return out_dir


def _recipe_of(path: str) -> dict:
    """The ``papa_recipe.json`` of a checkpoint folder or Hub repository (``{}`` when it has none)."""
    from ..conversion.inspection import read_recipe

    if Path(path).is_dir():
        return read_recipe(Path(path))
    import json

    from huggingface_hub import hf_hub_download
    from huggingface_hub.errors import EntryNotFoundError

    from ..failures import one_line

    try:
        return json.loads(Path(hf_hub_download(path, "papa_recipe.json")).read_text(encoding="utf-8"))
    except EntryNotFoundError:  # a checkpoint published without it: the config names the source
        return {}
    except Exception as err:  # offline, or the Hub failed: said, and the config names the source
        logger.warning("could not read %s's papa_recipe.json (%s): the source it names comes from its config", path,
                       one_line(err))  # fmt: skip
        return {}


def run_calibrate(
    model_name: str,
    cal: CalibrationOptions,
    run: RunOptions,
    out: str,
    progress=True,
    overwrite: bool = False,
    kind: str = "average",
    distill: DistillOptions | None = None,
    storage: ConvertOptions | None = None,
) -> Path:
    """``papa-surgery calibrate``: write a constants file (``distilled``: for an attention-free model); ``storage``
    (``--storage``, ``--compact-band``, ``--compact-rank``): the storage the constants are calibrated for."""
    out = check_output_file(out, overwrite, "constants")
    if storage is not None:
        registry.check_calibration_storage(kind, storage.storage, storage.compact_band, storage.compact_rank)
    _, config, source, _ = _source(model_name, run.trust_remote_code)
    check_source_config(config, model_name)
    if cal.max_length is not None:
        check_max_length(config, cal.max_length, model_name)
    corpus = open_corpus(cal.corpus, pairs=cal.pairs, max_examples=cal.max_examples)
    flow = _workflow(model_name, run, source, progress)
    check_pairs_fit(flow.tokenizer, flow.slots(cal.max_length), cal.pairs)
    constants = flow.constants(kind, **_calibration(cal, corpus, storage), distill=distill)
    on_main(write_output, out, overwrite, "constants", constants.save)  # under a launcher: rank 0 writes
    return out


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
    """``papa-surgery rank``: write a ranking JSON."""
    from ..calibration.constants import Constants

    method = registry.check_method(rank.resolved_method, rank.task)
    check_task_read(method, rank.task)
    out = check_output_file(out, overwrite, "ranking")
    given = Constants.load(constants_file) if constants_file else None
    if given is not None:
        registry.check_reads(method.name, given.kind)  # before the model loads
    _, config, source, _ = _source(model_name, run.trust_remote_code)
    check_source_config(config, model_name)
    calibrates = given is None and (cal.corpus is not None or method.constants is not None)
    if calibrates and cal.max_length is not None:
        check_max_length(config, cal.max_length, model_name)
    corpus = open_corpus(cal.corpus, pairs=cal.pairs, max_examples=cal.max_examples) if calibrates else None
    preflight_ranking(rank)
    flow = _workflow(model_name, run, source, progress)
    constants = given
    if given is not None:
        given.check_compatible(flow.model.config, source, model=flow.model)
    elif cal.corpus:
        check_pairs_fit(flow.tokenizer, flow.slots(cal.max_length), cal.pairs)
        constants = flow.constants("average", **_calibration(cal, corpus))
    ranking = flow.ranking(
        method.name,
        task=rank.task,
        data_dir=rank.data_dir,
        constants=constants,
        calibration=_calibration(cal, corpus),
        max_train_examples=rank.max_train_examples,
        **rank.lambda_options(),
        batch_size=run.batch_size,
    )
    on_main(write_output, out, overwrite, "ranking", ranking.save)  # under a launcher: rank 0 writes
    return out
