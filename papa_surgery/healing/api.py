"""``papa_surgery.heal``: the Python API of healing (``papa-surgery heal``), argument checks then the workflow.

It sits with the healing stage (as ``papa_surgery.distill`` does) and uses the checks of :mod:`papa_surgery.api`.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..options import ArgumentError, RunOptions

if TYPE_CHECKING:
    from torch import nn


def heal(
    model: nn.Module | str | Path,
    tokenizer: Any = None,
    corpus: Any = None,
    *,
    teacher: nn.Module | str | None = None,
    batch_size: int = 32,
    seed: int = 0,
    max_examples: int | None = None,
    device: str | None = None,
    progress: bool = True,
    state_path: str | Path | None = None,
    **options: Any,
) -> nn.Module:
    """A converted model healed toward its source, label-free (``papa-surgery heal``).

    The PAPA model learns to reproduce its source's outputs on ``corpus``: every layer's hidden states
    (variance-normalised) and, for a sentence-transformers source, the sentence embedding its pipeline makes.
    What trains (``train``): ``"full"`` (the default: the transformer layers' weights plus the constants), ``"lora"``
    (LoRA on the value, attention-output and feed-forward Linears plus the constants, merged at the end) or
    ``"constants"``. The architecture does not change (no query/key comes back); the result is a plain PAPA model
    that :func:`papa_surgery.save` writes and that loads without peft.

    Args:
        model: a PAPA model (from :func:`convert`, or loaded) or a PAPA checkpoint folder.
        tokenizer: its tokenizer (default: the checkpoint's, when ``model`` is a folder).
        corpus: unlabelled text as :func:`calibrate` takes it (``None``: the default healing corpus, the bundled
            UD English-EWT sentences and WikiText-2 excerpt, :func:`papa_surgery.calibration.default_healing_corpus`);
            the held-out examples (``heldout``) measure the agreement before, during and after.
        teacher: the source model (a model, a Hub id or a folder; default: the source the model's recipe names).
        batch_size, seed, max_examples, device, progress: how the run goes (examples per step, data order).
        state_path: a resume file: a run stopped midway resumes from its last evaluation when called again. It is
            kept when the run ends (a crash before the healed model is saved loses nothing); remove it once it is.
            A file there that is not a healing run's state is refused.
        **options: :class:`papa_surgery.options.HealOptions` (``steps``, ``train``, ``lr``, ``constants_lr``,
            ``freeze_constants``, ``objective``, ``embedding_weight``, ``warmup``, ``heldout``, ``eval_every``,
            ``lora_rank``). ``freeze_constants=True`` (lora, full) keeps the constants as stored: a checkpoint
            whose constants are too long to train as dense (L, L) matrices heals that way.

    Returns:
        The healed PAPA model; ``model.papa_recipe["healing"]`` records the run (teacher, corpus, steps, what
        trained, held-out agreement before and after). ``model`` itself is not changed.

    Raises:
        ValueError: not a PAPA model, a teacher that is not its source, bad options (naming the argument).
        TypeError: an unknown option or an argument of the wrong type.
    """
    from dataclasses import fields

    from ..api import _model, _tokenizer, _workflow, load
    from ..models.families import is_papa_config
    from ..options import HealOptions

    known = {f.name for f in fields(HealOptions)} - {"teacher"}
    unknown = sorted(set(options) - known)
    if unknown:
        raise TypeError(
            f"unexpected keyword argument(s) {', '.join(map(repr, unknown))}; known: {', '.join(sorted(known))}"
        )
    heal_options = HealOptions(**options)
    run = RunOptions(device=device, batch_size=batch_size, seed=seed)
    if isinstance(model, (str, Path)):
        model, loaded_tokenizer = load(str(model))
        tokenizer = tokenizer if tokenizer is not None else loaded_tokenizer
    _model(model)
    _tokenizer(tokenizer)
    if not is_papa_config(model.config):
        raise ArgumentError("model", "is not a PAPA model: convert it first (papa_surgery.convert), then heal it")
    from torch import nn

    if not isinstance(teacher, nn.Module):
        from .run import teacher_name

        teacher, _ = load(teacher_name(model, teacher), device=device)
    flow = _workflow(teacher, tokenizer, getattr(model.config, "papa_source_model", None), run, progress)
    healed = flow.heal(model, corpus, heal_options, max_examples=max_examples, state_path=state_path)
    healed.papa_tokenizer = tokenizer  # what papa_surgery.save writes when given none
    return healed
