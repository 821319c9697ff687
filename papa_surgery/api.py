"""The workflow as library calls, one per CLI command: ``import papa_surgery`` exposes these lazily.

    import papa_surgery

    model, tok = papa_surgery.load("sentence-transformers/all-MiniLM-L6-v2")
    constants = papa_surgery.calibrate(model, tok, max_examples=1000)      # the bundled corpus by default
    ranking = papa_surgery.rank("variance", constants=constants)           # shapes come from the constants
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.5, tokenizer=tok)
    papa_surgery.save(papa, "minilm-papa-0.5", tokenizer=tok)              # weights, code, recipe, card

Each call takes what its objects already know from them (a ranking's method, the constants' shape, the
heads from ``ranking.select(fraction)``) and wraps the module that does the work (``calibrate.py``,
``rank_methods.py``, ``convert.py``, ``probe``, ``analysis``).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

    from .constants import Constants
    from .ranking import Ranking

__all__ = ["analyze", "calibrate", "convert", "load", "probe", "rank", "save"]


def load(
    name_or_path: str,
    *,
    auto_class: str = "AutoModel",
    revision: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` of a source model or a PAPA checkpoint, in eval mode.

    Args:
        name_or_path: a Hub id, a local folder, or ``"minilm"`` for the embedded all-MiniLM-L6-v2.
        auto_class: the transformers auto class (``"AutoModelForSequenceClassification"``, ...).
        revision: a Hub revision.
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"`` (default: as stored).
        device: where to put the model.

    Raises:
        ValueError: an architecture papa-surgery does not support (the message lists those it does).
    """
    from .loading import load_source
    from .sources import resolve_model

    return load_source(
        resolve_model(name_or_path), auto_class=auto_class, revision=revision, dtype=dtype, device=device
    )


def _constants(constants: Constants | str | Path) -> Constants:
    from .constants import Constants

    return constants if isinstance(constants, Constants) else Constants.load(constants)


def calibrate(
    model: nn.Module,
    tokenizer: Any,
    corpus: Any = None,
    *,
    kind: str = "average",
    max_length: int = 128,
    pairs: bool = False,
    batch_size: int = 32,
    max_examples: int | None = None,
    device: str | None = None,
    progress: bool = True,
    source_name: str | None = None,
) -> Constants:
    """Constants for every head of ``model`` (``papa-surgery calibrate``), averaged over ``corpus`` (paper 3.1).

    The model's weights, train/eval mode and device are left as they were.

    Args:
        model: a source model of a supported family.
        tokenizer: its tokenizer.
        corpus: a text file (one example per line, a TAB separates a pair), a ``datasets`` folder or file, a
            Hub spec ``name[:config]:split:column``, or a list of strings / pairs; default: the bundled
            WikiText-2 excerpt.
        kind: ``average`` (the paper's), ``norm-average`` or ``effective-average`` (averaged over the corpus), or a
            data-free kind (``identity``, ``toeplitz``, ``zeros``, ``uniform``) that reads no corpus.
        max_length: L, the number of slots.
        pairs: the corpus holds sentence pairs.
        batch_size, max_examples, device, progress: how the pass runs.
        source_name: the source's Hub id, recorded in the provenance (default: the model's ``name_or_path``).

    Raises:
        ValueError: an unknown kind, an unsupported model, or a corpus that gives no examples.
    """
    from .constants import ANALYSIS_KINDS, DATA_FREE_KINDS, Constants

    if kind in DATA_FREE_KINDS:
        from .architectures import num_heads_layers

        heads, layers = num_heads_layers(model.config)
        source = source_name or getattr(model.config, "_name_or_path", None)
        return Constants.from_kind(kind, layers, heads, max_length, source_model=source)
    if kind == "distilled":
        raise ValueError(
            "distilled constants are trained for the heads being made constant: calibrate the average, then "
            "papa_surgery.distill(model, tokenizer, corpus, constants, heads)"
        )
    if kind != "average" and kind not in ANALYSIS_KINDS:
        choices = ", ".join(("average", *ANALYSIS_KINDS, *DATA_FREE_KINDS))
        raise ValueError(f"unknown constant kind {kind!r}; choose one of {choices}")
    from .analysis import corpus_constants
    from .corpus import default_corpus

    if corpus is None:
        if pairs:
            raise ValueError("pairs=True needs a corpus of sentence pairs (the bundled corpus is single sentences)")
        corpus = default_corpus(max_examples=max_examples)
    return corpus_constants(
        kind,
        model,
        tokenizer,
        corpus,
        max_length=max_length,
        pairs=pairs,
        batch_size=batch_size,
        max_examples=max_examples,
        device=device,
        progress=progress,
        source_name=source_name,
    )


def rank(
    method: str,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    *,
    constants: Constants | str | Path | None = None,
    task: str | None = None,
    data_dir: str | Path | None = None,
    seed: int = 0,
    **options: Any,
) -> Ranking:
    """Order every head, first to make constant first (``papa-surgery rank``).

    ``variance``, ``norm``, ``first-to-last``, ``last-to-first`` and ``random`` need only ``constants`` (their
    shape is the model's); ``lambda`` and ``reversed-lambda`` train the paper's lambdas (3.2) on ``task`` and
    need the model and tokenizer too.

    Args:
        method: one of ``lambda``, ``reversed-lambda``, ``variance``, ``norm``, ``first-to-last``,
            ``last-to-first``, ``random``.
        model, tokenizer: the source model and its tokenizer (never changed).
        constants: ``Constants`` of this model, or the path of a constants file.
        task, data_dir: the labelled task the lambdas learn on, and a local data folder (default: the Hub).
        seed: the ``random`` permutation's seed; the lambda probe's seed.
        **options: lambda training options (steps, epochs, lr, lambda_lr, batch_size, max_train_examples,
            device, progress; see :class:`papa_surgery.lambda_rank.LambdaOptions`).

    Raises:
        FileNotFoundError: ``constants`` names a file that does not exist.
        ValueError: an unknown method (with a suggestion), a learned method without a task or model, or
            missing constants.
    """
    from .rank_methods import label_free_ranking, rank_heads
    from .ranking import check_rank_inputs

    check_rank_inputs(method, task)
    constants = None if constants is None else _constants(constants)
    if model is not None:
        return rank_heads(
            method, model, tokenizer, constants=constants, task=task, data_dir=data_dir, seed=seed, **options
        )
    if task is not None:
        raise ValueError(f"the {method!r} ranking trains on the model: pass the model and its tokenizer")
    if constants is None:
        raise ValueError(f"the {method!r} ranking needs constants (or the model) to know the number of heads")
    return label_free_ranking(method, constants=constants, seed=seed)


def convert(
    model: nn.Module,
    constants: Constants | str | Path,
    ranking: Ranking | str | Path,
    fraction: float,
    *,
    tokenizer: Any = None,
    dtype: str = "float32",
    trainable_constants: bool = False,
    source_name: str | None = None,
    storage: str = "auto",
) -> nn.Module:
    """The PAPA model of ``model``: the first ``fraction`` of ``ranking``'s heads attend with ``constants``.

    Args:
        model: a source model of a supported family, with any head (deep-copied, never changed).
        constants: its ``Constants`` (or a constants file).
        ranking: a ``Ranking`` (or a ranking file ``*.json``, or a label-free method name such as ``"variance"``).
        fraction: the share of heads made constant, from 0 (the source) to 1 (attention-free); the heads are
            ``ranking.select(fraction)``.
        tokenizer: the source tokenizer (its separator id lets the model find a pair's middle); saved by
            :func:`save`.
        dtype: how the constants are stored: ``float32``, ``float16`` or ``bfloat16`` (or fp32/fp16/bf16).
        trainable_constants: give the constants gradients.
        source_name: the source's Hub id, for the provenance.
        storage: ``"dense"``, ``"compact"`` or ``"auto"`` (dense up to L=128, compact above): see
            :func:`papa_surgery.convert.convert`. The model computes with the compacted matrices.

    Returns:
        The PAPA model (``Papa<Class>``), in eval mode. ``model.papa_recipe`` holds what :func:`save` writes
        as ``papa_recipe.json``: everything needed to redo the conversion.

    Raises:
        FileNotFoundError: a constants or ranking file that does not exist.
        ValueError: a fraction outside [0, 1], or constants / a ranking made for another model.
    """
    from .convert import build_recipe
    from .convert import convert as convert_heads
    from .ranking import Ranking, check_fraction

    fraction = check_fraction(fraction)
    constants = _constants(constants)
    if isinstance(ranking, (str, Path)) and (str(ranking).endswith(".json") or Path(ranking).exists()):
        ranking = Ranking.load(ranking)
    elif isinstance(ranking, str):
        ranking = rank(ranking, model, tokenizer, constants=constants)
    ranking.check_compatible(model.config)
    papa = convert_heads(
        model,
        constants,
        ranking.select(fraction),
        tokenizer=tokenizer,
        method=ranking.method,
        fraction=fraction,
        dtype=dtype,
        trainable_constants=trainable_constants,
        source_name=source_name,
        storage=storage,
    )
    papa.papa_recipe = build_recipe(papa, constants, ranking)
    return papa


def save(
    model: nn.Module,
    out_dir: str | Path,
    tokenizer: Any = None,
    *,
    overwrite: bool = False,
    card: bool = True,
    results: Any = None,
) -> Path:
    """Write a standalone checkpoint folder of a PAPA model: weights, config, model code, tokenizer,
    ``papa_recipe.json`` (the provenance :func:`convert` recorded) and a model card; all or nothing.

    ``AutoModel.from_pretrained(out_dir, trust_remote_code=True)`` loads it without papa-surgery installed.
    A new path or an empty folder is written; ``overwrite=True`` replaces only an earlier PAPA checkpoint, never
    the model being read, another folder, or a checkpoint holding files papa-surgery did not write.

    Raises:
        ValueError: ``out_dir`` exists (pass ``overwrite=True``), cannot be replaced (the error says why and
            names the files that are not papa-surgery's), or ``model`` is not a PAPA model.
    """
    from .convert import save_checkpoint

    recipe = getattr(model, "papa_recipe", None)
    return save_checkpoint(
        model, out_dir, tokenizer=tokenizer, recipe=recipe, overwrite=overwrite, card=card, results=results
    )


def probe(model: nn.Module, tokenizer: Any, task: str, **options: Any) -> dict:
    """Score the frozen ``model`` on ``task`` with the paper's probe (``papa-surgery probe``, one cell).

    ``options`` are :func:`papa_surgery.probe.probe`'s: ``data_dir``, ``seed``, ``max_train_examples``,
    ``max_eval_examples``, ``epochs``, ``batch_size``, ``lr``, ``max_length``, ``device``, ``progress``.
    Returns the result row (``score``, ``metric``, ``examples``, ...).

    Raises:
        ValueError: an unknown task (with a suggestion), missing data, or an input that does not fit.
    """
    from .probe import probe as run_probe

    return run_probe(model, tokenizer, task, **options)


def finetune(model: nn.Module, tokenizer: Any, task: str, **options: Any) -> dict:
    """Fine-tune a copy of ``model`` end to end on ``task`` and score it (``papa-surgery finetune``, one cell).

    The model is saved and reloaded with the family's stock head (``AutoModelForSequenceClassification`` or
    ``AutoModelForTokenClassification``) and trained with ``transformers.Trainer``; ``model`` is unchanged.
    ``options``: the hyperparameters of :class:`papa_surgery.finetune.FinetuneOptions` (``epochs``, ``lr``,
    ``batch_size``, ``weight_decay``, ``warmup_ratio``, ``eval_batch_size``, ``early_stopping_patience``,
    ``trainable_constants``, ``max_length``) and ``data_dir``, ``seed``, ``max_train_examples``,
    ``max_eval_examples``, ``device``, ``progress``. Returns the score and the cost (examples per second for
    training and inference, peak memory, trainable parameters, checkpoint size).

    Raises:
        ValueError: ``mlm`` (no fine-tuning head), an unknown option or task, missing data, bad values.
    """
    from dataclasses import fields

    from .finetune import FinetuneOptions
    from .finetune import finetune as run_finetune

    names = {f.name for f in fields(FinetuneOptions)}
    hyper = {k: options.pop(k) for k in list(options) if k in names}
    return run_finetune(model, tokenizer, task, options=FinetuneOptions(**hyper), **options)


def analyze(
    model: nn.Module,
    tokenizer: Any,
    corpus: Any,
    which: str,
    out_dir: str | Path,
    **options: Any,
) -> dict:
    """Norm-based (``which="norms"``) or effective-attention (``"effective"``) analysis (``papa-surgery analyze``).

    Writes ``summary.json``, the corpus averages as constants (``norm-average.safetensors`` /
    ``effective-average.safetensors``), the figures and, for norms, ``norm-ranking.json`` into ``out_dir``.
    ``corpus=None`` reads the bundled WikiText-2 excerpt. ``options`` are
    :func:`papa_surgery.analysis.analyze`'s (max_length, batch_size, max_examples, pairs, device, progress,
    source_name, heads, figures). The model's mode and device are left as they were.

    Returns:
        The summary, with ``"files"`` listing what was written.

    Raises:
        ValueError: an unknown analysis, or a corpus that gives no examples.
    """
    from .analysis import analyze as run_analysis
    from .constants import Constants
    from .distributed import is_main_process

    if corpus is None:
        from .corpus import default_corpus

        corpus = default_corpus(max_examples=options.get("max_examples"))
    summary = run_analysis(model, tokenizer, corpus, which, out_dir, **options)
    if which == "norms" and is_main_process():  # under torch.distributed rank 0 alone writes
        from .rank_methods import norm_ranking

        out_dir = Path(out_dir)
        norm_ranking(Constants.load(out_dir / "norm-average.safetensors")).save(out_dir / "norm-ranking.json")
        summary["files"].insert(-1, "norm-ranking.json")
        (out_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary
