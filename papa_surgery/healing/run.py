"""One healing run: a converted model trained label-free toward its source, measured before and after.

``heal_model`` holds out part of the corpus, resolves the objective (the source's sentence-transformers pipeline
when it has one), prepares what trains (:mod:`.trainable`), runs the loop (:mod:`.loop`), folds the result back into
a plain PAPA model and records the run in the model's recipe (``papa_recipe["healing"]``: teacher, corpus, steps,
what trained, the objective and the held-out agreement before and after), which the checkpoint and its card carry.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch

from ..calibration.corpus import Corpus, load_corpus
from ..options import HealOptions

logger = logging.getLogger("papa_surgery")


# Why a model with no constant head is not healed (the CLI says it before the model loads, heal_model after).
NOTHING_TO_HEAL = (
    "has no constant head: it computes what its source computes, so healing has nothing to close (it would only "
    "move the model away from its source)"
)


def check_teacher(papa, teacher) -> None:
    """ValueError unless ``teacher`` has the architecture ``papa`` was converted from (family and sizes)."""
    from ..models.families import get_family, is_papa_config, num_heads_layers

    if is_papa_config(teacher.config):
        raise ValueError("the teacher is a PAPA model: heal toward the source model it was converted from")
    mine, theirs = get_family(papa), get_family(teacher)
    sizes = ("hidden_size", "intermediate_size", "vocab_size")
    differ = [s for s in sizes if getattr(papa.config, s, None) != getattr(teacher.config, s, None)]
    shapes = num_heads_layers(papa.config), num_heads_layers(teacher.config)
    if mine.model_type != theirs.model_type or shapes[0] != shapes[1] or differ:
        raise ValueError(
            f"the teacher ({theirs.model_type}, {num_heads_layers(teacher.config)} heads x layers) is not the "
            f"architecture this PAPA model was converted from ({mine.model_type}, {num_heads_layers(papa.config)}"
            f"{', other ' + ', '.join(differ) if differ else ''}): pass the source model as the teacher"
        )
    # Conversion copies the token embeddings and healing never trains them: another model of the same shape differs.
    mine, theirs = papa.get_input_embeddings().weight, teacher.get_input_embeddings().weight
    if mine.shape != theirs.shape or not torch.equal(mine.detach().cpu().float(), theirs.detach().cpu().float()):
        raise ValueError(
            "the teacher's token embeddings differ from the PAPA model's: it is not the source the model was "
            "converted from; pass that source as the teacher"
        )


def teacher_name(papa, teacher: str | None = None) -> str:
    """What to load as the teacher of ``papa``: ``teacher``, else the source its recipe or config names.

    The embedded all-MiniLM-L6-v2 stands for its Hub id when the Hub cannot be reached.

    Raises:
        ArgumentError: no teacher given and none recorded (a source converted from a local folder), or a recorded
            source that is not a Hub id (a path: papa-surgery never records one).
    """
    from huggingface_hub import constants

    from ..failures import ArgumentError, spell
    from ..models.loading import hub_reachable, is_hub_id
    from ..models.sources import EMBEDDED_HUB_ID, embedded_model_path

    if teacher:
        return teacher
    recipe = getattr(papa, "papa_recipe", None) or {}
    source = recipe.get("source") or {}
    name = source.get("hub_id") or source.get("model") or getattr(papa.config, "papa_source_model", None)
    # a local source is recorded by its folder's name only (never a path): nothing to load it from
    local = bool(source.get("local")) and not source.get("hub_id")
    if not name or local or name in ("local model", "<local model>"):
        raise ArgumentError(
            "teacher",
            f"the PAPA model does not name a public source to heal toward; pass it with {spell('teacher')} "
            "(the source model's folder or Hub id)",
        )
    # papa-surgery records a Hub id, never a path: an edited recipe must not pick a folder, nor a Hub id that a
    # folder of that name in the working folder would stand in for
    hub_id = is_hub_id(name)
    if not hub_id or Path(name).exists():
        where = "and a folder of that name is in the working folder" if hub_id else "which is not a Hub id"
        raise ArgumentError(
            "teacher",
            f"the PAPA model's recipe names {name!r} as its source, {where}; pass the source model with "
            f"{spell('teacher')} (its folder or Hub id)",
        )
    if name == EMBEDDED_HUB_ID and (constants.HF_HUB_OFFLINE or not hub_reachable()):
        try:
            return embedded_model_path()
        except ValueError:
            return name
    return name


def split_heldout(examples: list, heldout: int) -> tuple[list, list]:
    """(training, held-out) examples: every k-th example is held out, spread over the whole corpus."""
    from ..failures import ArgumentError

    if heldout >= len(examples):
        raise ArgumentError(
            "heldout", f"{heldout} held-out examples leave none to train on (the corpus has {len(examples)})"
        )
    stride = len(examples) / heldout
    held = {min(len(examples) - 1, int((i + 1) * stride) - 1) for i in range(heldout)}
    return [e for i, e in enumerate(examples) if i not in held], [examples[i] for i in sorted(held)]


def _storage(papa) -> str:
    return "dense" if getattr(papa.config, "papa_compact_band", None) is None else "compact"


def heal_model(
    papa,
    teacher,
    tokenizer,
    corpus,
    options: HealOptions | None = None,
    *,
    batch_size: int = 32,
    seed: int = 0,
    device=None,
    max_examples: int | None = None,
    progress: bool = True,
    state_path=None,
    teacher_name: str | None = None,
    pipeline_source=None,
):
    """The healed copy of the PAPA model ``papa`` (never changed), trained toward ``teacher`` on ``corpus``.

    Args:
        papa: a PAPA model (converted in memory, or loaded from a checkpoint).
        teacher: its source model (never changed; runs frozen).
        tokenizer: the source tokenizer.
        corpus: unlabelled examples (anything :func:`papa_surgery.calibration.load_corpus` reads, or a ``Corpus``);
            sentence pairs when the constants were calibrated on pairs.
        options: :class:`~papa_surgery.options.HealOptions` (steps, what trains, learning rates, objective, ...).
        batch_size: examples per step (per process); seed: the data order and the LoRA initialisation.
        device: where to train (default: the student's device).
        max_examples: use at most this many corpus examples (held-out ones included).
        progress: a progress bar with the time left; the held-out agreement is printed at each evaluation.
        state_path: keep a resume state there (:mod:`.state`): a run stopped midway resumes from its last
            evaluation when called again with the same settings. The caller removes it once the result is safe.
        teacher_name: the teacher's public name for the recipe.
        pipeline_source: where the sentence-transformers pipeline is read (default: the teacher's folder or id).

    Returns:
        The healed PAPA model (same class, heads and storage as ``papa``), with ``papa_recipe["healing"]``.
    """
    from ..calibration.passes import borrow
    from ..distributed import world_size
    from .agreement import HeldOut
    from .loop import LoopSettings, train
    from .objective import Objective
    from .sentence import sentence_pipeline
    from .state import HealState, run_key
    from .trainable import finish, prepare

    options = options or HealOptions()
    check_teacher(papa, teacher)
    if state_path:
        HealState.check_path(state_path)  # before any work: a file there that is not a healing state is refused
    config = papa.config
    if not config.papa_constant_heads:  # the student is its teacher: training could only move it away
        raise ValueError(
            f"this PAPA model {NOTHING_TO_HEAL}; heal a model converted with at least one constant head (a larger "
            "fraction)"
        )
    max_length, pairs = int(config.papa_max_length), config.papa_calibrated_on == "pairs"
    corpus = corpus if isinstance(corpus, Corpus) else load_corpus(corpus, pairs=pairs, max_examples=max_examples)
    examples = list(corpus)[:max_examples] if max_examples else list(corpus)
    examples, heldout = split_heldout(examples, options.heldout)
    source = pipeline_source or getattr(teacher.config, "_name_or_path", None)
    pipeline, why_not = sentence_pipeline(source)
    objective = Objective.resolve(options.objective, pipeline, options.embedding_weight, why_not)
    if options.objective == "auto" and pipeline is None:
        logger.info("healing on every layer's hidden states only: %s", why_not)
    settings = LoopSettings(
        steps=options.steps,
        batch_size=batch_size,
        lr=options.learning_rate(),
        constants_lr=options.constants_lr,
        warmup=options.warmup,
        seed=seed,
        eval_every=options.evaluation_interval(),
    )
    device, restore = borrow(teacher, device)
    try:
        torch.manual_seed(seed)  # LoRA's initial A matrices
        trainable = prepare(papa, options.train, options.lora_rank, freeze_constants=options.freeze_constants)
        trainable.model.to(device)
        held = HeldOut(teacher, tokenizer, heldout, max_length, pairs, objective, batch_size)
        before = held.measure(papa)
        key = run_key(_fingerprint(papa), teacher_name, corpus.key(), len(examples), options, settings,
                      world_size())  # fmt: skip
        state = HealState(state_path, key) if state_path else None
        with HealState.said_when_stopped(state_path):
            history = train(
                trainable,
                teacher,
                tokenizer,
                examples,
                max_length=max_length,
                pairs=pairs,
                objective=objective,
                settings=settings,
                measure=lambda: held.measure(trainable.model),
                state=state,
                progress=progress,
            )
        compact = (config.papa_compact_band, config.papa_compact_rank)  # stored back as the checkpoint had them
        healed = finish(trainable, _storage(papa), config.papa_constants_dtype, None if None in compact else compact)
        after = held.measure(healed)
    finally:
        restore()
    if before and after and after["sentence_cosine"] < before["sentence_cosine"]:  # too few steps, or other text
        logger.warning(
            "healing moved the model away from its source on the %d held-out examples (sentence cosine %.4f -> %.4f): "
            "heal for more steps, at a lower learning rate, or on text like the text it will read",
            len(heldout),
            before["sentence_cosine"],
            after["sentence_cosine"],
        )
    healed.papa_recipe = {**(getattr(papa, "papa_recipe", None) or {})}
    healed.papa_recipe["healing"] = {
        "teacher": teacher_name or getattr(config, "papa_source_model", None),
        "corpus": corpus.description,
        "training_examples": len(examples),
        "heldout_examples": len(heldout),
        "train": options.train,
        "trainable_parameters": trainable.count(),
        "lora_targets": list(trainable.targets) or None,
        "lora_rank": options.lora_rank if options.train == "lora" else None,
        "objective": objective.name,
        "objective_description": objective.describe(),
        "steps": settings.steps,
        "batch_size": batch_size,
        "processes": world_size(),
        "lr": settings.lr if options.train != "constants" else None,
        "constants_lr": None if options.freeze_constants else settings.constants_lr,
        "freeze_constants": options.freeze_constants,
        "schedule": f"linear warm-up over {settings.warmup:g} of the steps, then cosine decay; AdamW, clip 1.0",
        "seed": seed,
        "seconds": round(history["seconds"], 1),
        "resumed_from_step": history["resumed_from"] or None,
        "loss_first_steps": _window(history["losses"], first=True),
        "loss_last_steps": _window(history["losses"], first=False),
        "heldout_before": before,
        "heldout_after": after,
        "heldout_during": history["evaluations"],
    }
    return healed


def _window(losses: list[float], first: bool) -> float | None:
    if not losses:
        return None
    n = max(1, min(10, len(losses) // 5))
    part = losses[:n] if first else losses[-n:]
    return sum(part) / len(part)


def _fingerprint(papa) -> str:
    """What identifies the PAPA model's weights (for the resume key)."""
    import hashlib

    digest = hashlib.sha256()
    for name, tensor in sorted(papa.state_dict().items()):
        digest.update(name.encode())
        digest.update(tensor.detach().float().cpu().numpy().tobytes()[:4096])
        digest.update(str(float(tensor.float().sum())).encode())
    return digest.hexdigest()[:32]
