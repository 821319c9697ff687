"""The workflow as library calls, one per CLI command: ``import papa_surgery`` exposes these lazily.

    import papa_surgery

    model, tok = papa_surgery.load("sentence-transformers/all-MiniLM-L6-v2")
    constants = papa_surgery.calibrate(model, tok, max_examples=1000)      # the default corpus
    ranking = papa_surgery.rank("variance", constants=constants)           # shapes come from the constants
    papa = papa_surgery.convert(model, constants, ranking, fraction=0.5, tokenizer=tok)
    papa_surgery.save(papa, "minilm-papa-0.5", tokenizer=tok)              # weights, code, recipe, card

Each call checks its arguments with the options the CLI uses (:mod:`papa_surgery.options`: the same click
types, errors naming the argument) and runs the one workflow (:class:`papa_surgery.workflow.Workflow`).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from . import registry
from .arguments import check_cell_options as _cell_arguments
from .arguments import check_constants as _constants
from .arguments import check_model as _model
from .arguments import check_tokenizer as _tokenizer
from .arguments import tokenizer_of
from .arguments import what as _what
from .options import ArgumentError, ArgumentTypeError, CalibrationOptions, ConvertOptions, RunOptions

if TYPE_CHECKING:
    from torch import nn

    from .calibration import Constants, StructuredConstants
    from .ranking.order import Ranking

__all__ = ["analyze", "calibrate", "convert", "finetune", "load", "probe", "rank", "save"]

_DTYPE_ALIASES = {"float32": "fp32", "float16": "fp16", "bfloat16": "bf16"}


def load(
    name_or_path: str,
    *,
    auto_class: str = "AutoModel",
    revision: str | None = None,
    dtype: str | None = None,
    device: str | None = None,
    trust_remote_code: bool = False,
) -> tuple[nn.Module, Any]:
    """``(model, tokenizer)`` of a source model or a PAPA checkpoint, in eval mode.

    Args:
        name_or_path: a Hub id, a local folder, or ``"minilm"`` for the embedded all-MiniLM-L6-v2.
        auto_class: the transformers auto class (``"AutoModelForSequenceClassification"``, ...).
        revision: a Hub revision.
        dtype: ``"fp32"``, ``"fp16"`` or ``"bf16"`` (default: as stored).
        device: where to put the model.
        trust_remote_code: run the code files the model ships; by default papa-surgery's own classes load it.

    Raises:
        FileNotFoundError: a local folder that does not exist (the message names close ones).
        ValueError: an architecture papa-surgery does not support (the message lists those it does), or a device
            this machine does not have.
    """
    from .models.loading import load_source
    from .models.sources import resolve_model

    RunOptions(device=device, trust_remote_code=trust_remote_code)  # refused in plain words before the weights load
    return load_source(resolve_model(name_or_path), auto_class, revision, dtype, device, trust_remote_code)


def _workflow(model, tokenizer, source_name=None, run: RunOptions | None = None, progress: bool = True):
    from .workflow import Workflow

    return Workflow(model, tokenizer, source_name=source_name, run=run, progress=progress)


def calibrate(
    model: nn.Module,
    tokenizer: Any,
    corpus: Any = None,
    *,
    kind: str = "average",
    max_length: int | None = None,
    pairs: bool = False,
    batch_size: int = 32,
    max_examples: int | None = None,
    device: str | None = None,
    progress: bool = True,
    source_name: str | None = None,
    storage: str = "auto",
    compact_band: int | None = None,
    compact_rank: int | None = None,
) -> Constants | StructuredConstants:
    """Constants for every head of ``model`` (``papa-surgery calibrate``), averaged over ``corpus`` (paper 3.1).

    The model's weights, train/eval mode and device are left as they were.

    Args:
        model: a source model of a supported family.
        tokenizer: its tokenizer.
        corpus: a text file (one example per line, a TAB separates a pair), a ``datasets`` folder or file, a
            Hub spec ``name[:config]:split:column``, or a list of strings / pairs; default: the one default
            corpus (WikiText-103 train from the Hub; offline, the bundled WikiText-2 excerpt).
        kind: ``average`` (the paper's), ``norm-average`` or ``effective-average`` (averaged over the corpus), or a
            data-free kind (``identity``, ``toeplitz``, ``zeros``, ``uniform``) that reads no corpus.
        max_length: L, the number of slots: the longest input the converted model accepts (at most the model's
            positions). Default: the source's own length (its sentence-transformers ``max_seq_length``, else its
            tokenizer's ``model_max_length``, within its position embeddings).
        pairs: the corpus holds sentence pairs.
        batch_size, max_examples, device, progress: how the pass runs.
        source_name: the source's Hub id, recorded in the provenance (default: the model's ``name_or_path``).
        storage, compact_band, compact_rank: as in :func:`convert`; ``compact`` (``auto`` above L=512) calibrates
            into that structure and builds data-free kinds in it (``StructuredConstants``: no (L, L) matrix per head).

    Raises:
        ValueError: an unknown kind, an unsupported model, a bad value (naming the argument), or a corpus that
            gives no examples.
        TypeError: an argument of the wrong type (a tokenizer that is not one, ``max_length="128"``...).
    """
    from .arguments import check_max_length

    _model(model)
    _tokenizer(tokenizer)
    chosen = registry.kind(kind)
    if chosen.made == registry.TRAINED:
        raise ValueError(
            f"{chosen.name} constants are fitted for the heads being made constant: calibrate the average, then "
            f"papa_surgery.{chosen.fitted_by}(model, tokenizer, corpus, constants, heads)"
        )
    cal = CalibrationOptions(max_length=max_length, pairs=pairs, max_examples=max_examples)
    layout = ConvertOptions(fraction=0, storage=storage, compact_band=compact_band, compact_rank=compact_rank)
    registry.check_calibration_storage(chosen.name, storage, compact_band, compact_rank)
    run = RunOptions(device=device, batch_size=batch_size)
    if cal.max_length is not None:
        name = source_name or getattr(model.config, "_name_or_path", None) or "the model"
        check_max_length(model.config, cal.max_length, name)
    flow = _workflow(model, tokenizer, source_name, run, progress)
    given = dict(corpus=corpus, max_length=cal.max_length, pairs=pairs, max_examples=max_examples)
    return flow.constants(chosen.name, **given, **layout.storage_kwargs())


def rank(
    method: str,
    model: nn.Module | None = None,
    tokenizer: Any = None,
    *,
    constants: Constants | StructuredConstants | str | Path | None = None,
    task: str | None = None,
    data_dir: str | Path | None = None,
    seed: int = 0,
    **options: Any,
) -> Ranking:
    """Order every head, first to make constant first (``papa-surgery rank``).

    ``variance``, ``norm``, ``first-to-last``, ``last-to-first`` and ``random`` need only ``constants`` (their
    shape is the model's); ``lambda`` and ``reversed-lambda`` train the paper's lambdas (3.2) on ``task`` and
    need the model and tokenizer too; ``sensitivity`` makes each head constant alone and measures how far the
    sentence embeddings move on ``corpus`` (label-free; the model, tokenizer and average constants).

    Args:
        method: one of ``lambda``, ``reversed-lambda``, ``variance``, ``norm``, ``sensitivity``,
            ``first-to-last``, ``last-to-first``, ``random``.
        model, tokenizer: the source model and its tokenizer (never changed).
        constants: ``Constants`` or ``StructuredConstants`` of this model, or the path of a constants file.
        task, data_dir: the labelled task the lambdas learn on, and a local data folder (default: the Hub).
        seed: the ``random`` permutation's seed; the lambda probe's seed.
        **options: ``corpus`` (what ``sensitivity`` measures on: anything ``calibrate`` reads; default: the default
            corpus) and ``max_examples`` (its first examples: 32); lambda training options (steps, epochs, lr,
            lambda_lr, batch_size, max_train_examples, device, progress; see
            :class:`papa_surgery.ranking.lambdas.LambdaOptions`).

    Raises:
        FileNotFoundError: ``constants`` names a file that does not exist.
        ValueError: an unknown method (with a suggestion), a learned method without a task or model, a task
            given to a method that reads none, or missing constants.
    """
    from .workflow.preflight import check_task_read

    chosen = registry.check_method(method, task)
    check_task_read(chosen, task)
    constants = None if constants is None else _constants(constants, chosen.name)
    if model is None:
        if chosen.task or chosen.corpus:
            raise ArgumentError(
                "model",
                f"the {method!r} ranking {'trains on' if chosen.task else 'runs'} the model: pass the model and its "
                "tokenizer",
            )
        if constants is None:
            raise ArgumentError(
                "constants", f"the {method!r} ranking needs constants (or the model) to know the number of heads"
            )
        from .ranking.methods import label_free_ranking

        return label_free_ranking(method, constants=constants, seed=seed)
    _model(model)
    _tokenizer(tokenizer, required=chosen.task or chosen.corpus)
    if chosen.constants is not None and constants is None:
        raise ArgumentError(
            "constants",
            f"the {method!r} ranking reads {chosen.constants} constants of this model: pass "
            f"constants=papa_surgery.calibrate(model, tokenizer, kind={chosen.constants!r})",
        )
    if constants is not None:
        constants.check_compatible(model.config)
    run = RunOptions(seed=seed, **{k: options.pop(k) for k in ("batch_size", "device") if options.get(k) is not None})
    flow = _workflow(model, tokenizer, options.pop("source_name", None), run, options.pop("progress", True))
    return flow.ranking(method, task=task, data_dir=data_dir, constants=constants, seed=seed, **options)


def convert(
    model: nn.Module,
    constants: Constants | StructuredConstants | str | Path,
    ranking: Ranking | str | Path | None,
    fraction: float,
    *,
    tokenizer: Any = None,
    dtype: str = "float32",
    trainable_constants: bool = False,
    source_name: str | None = None,
    storage: str = "auto",
    compact_band: int | None = None,
    compact_rank: int | None = None,
) -> nn.Module:
    """The PAPA model of ``model``: the first ``fraction`` of ``ranking``'s heads attend with ``constants``.

    Args:
        model: a source model of a supported family, with any head (deep-copied, never changed).
        constants: its ``Constants`` or ``StructuredConstants`` (or a constants file).
        ranking: a ``Ranking`` (or a ranking file ``*.json``, or a label-free method name such as ``"variance"``);
            ``None`` at fraction 0 or 1, which make no head or every head constant whatever the order.
        fraction: the share of heads made constant, from 0 (the source) to 1 (attention-free); the heads are
            ``ranking.select(fraction)``.
        tokenizer: the source tokenizer (its separator id lets the model find a pair's middle); saved by
            :func:`save`.
        dtype: how the constants are stored: ``float32``, ``float16`` or ``bfloat16`` (or fp32/fp16/bf16).
        trainable_constants: give the constants gradients.
        source_name: the source's Hub id, for the provenance.
        storage, compact_band, compact_rank: ``"dense"``, ``"compact"`` or ``"auto"`` (dense up to L=128 and for
            distilled constants, compact above), its band and rank: see :func:`papa_surgery.conversion.surgery.convert`.

    Returns:
        The PAPA model (``Papa<Class>``), in eval mode. ``model.papa_recipe`` holds what :func:`save` writes
        as ``papa_recipe.json``: everything needed to redo the conversion.

    Raises:
        FileNotFoundError: a constants or ranking file that does not exist.
        ValueError: a fraction outside [0, 1], or constants / a ranking made for another model.
        TypeError: an argument of the wrong type (``fraction="0.5"``, ``ranking=None``...).
    """
    from .ranking.order import Ranking

    _model(model)
    _tokenizer(tokenizer, required=False)
    storage_options = dict(storage=storage, compact_band=compact_band, compact_rank=compact_rank)
    options = ConvertOptions(fraction=fraction, dtype=_DTYPE_ALIASES.get(dtype, dtype), **storage_options,
                             trainable_constants=trainable_constants)  # fmt: skip
    constants = _constants(constants)
    flow = _workflow(model, tokenizer, source_name)
    if isinstance(ranking, (str, Path)) and (str(ranking).endswith(".json") or Path(ranking).exists()):
        ranking = Ranking.load(ranking)
    elif isinstance(ranking, str):
        ranking = flow.ranking(ranking, constants=constants)
    elif not isinstance(ranking, Ranking) and not (ranking is None and options.fraction in (0.0, 1.0)):
        raise ArgumentTypeError(  # None: no head or every head, whatever the order (Workflow.convert)
            "ranking",
            f"must be a Ranking, a ranking file (.json) or a method name such as 'variance', got {_what(ranking)} "
            "(None only at fraction 0 or 1, where the order does not matter)",
        )
    papa = flow.convert(
        constants,
        ranking,
        options.fraction,
        dtype=options.dtype,
        **options.storage_kwargs(),
        trainable_constants=options.trainable_constants,
    )
    papa.papa_tokenizer = tokenizer  # what save writes when given none (not saved: the checkpoint's tokenizer is)
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

    Without ``tokenizer``, the one :func:`convert` was given is saved, else the tokenizer of the folder or Hub id the
    model was loaded from, with a sentence-transformers source's pipeline files; when there is none, pass one.

    ``AutoModel.from_pretrained(out_dir, trust_remote_code=True)`` loads it without papa-surgery installed.
    A new path or an empty folder is written; ``overwrite=True`` replaces only an earlier PAPA checkpoint, never
    the model being read, another folder, or a checkpoint holding files papa-surgery did not write.

    Raises:
        ValueError: ``out_dir`` exists (pass ``overwrite=True``), cannot be replaced (the error says why and
            names the files that are not papa-surgery's), ``model`` is not a PAPA model, or no tokenizer was given
            and the model's cannot be loaded.
        OutputExistsError: a folder appeared at ``out_dir`` while this ran (another run, the user): it is left
            as it was, and the finished result is kept beside it, at the path the error names.
    """
    from .conversion.checkpoint import save_checkpoint

    _tokenizer(tokenizer, required=False)
    _model(model)
    if tokenizer is None:  # without one the folder holds none, and AutoTokenizer makes an empty one from its config
        tokenizer = getattr(model, "papa_tokenizer", None) or tokenizer_of(model)
    recipe = getattr(model, "papa_recipe", None)
    return save_checkpoint(
        model, out_dir, tokenizer=tokenizer, recipe=recipe, overwrite=overwrite, card=card, results=results
    )


def probe(model: nn.Module, tokenizer: Any, task: str, **options: Any) -> dict:
    """Score the frozen ``model`` on ``task`` with the paper's probe (``papa-surgery probe``, one cell).

    ``options`` are :func:`papa_surgery.probing.probe`'s: ``data_dir``, ``seed``, ``max_train_examples``,
    ``max_eval_examples``, ``epochs``, ``batch_size``, ``lr``, ``max_length``, ``device``, ``progress``.
    Returns the result row (``score``, ``metric``, ``examples``, ...).

    Raises:
        ValueError: an unknown task (with a suggestion), missing data, or an input that does not fit.
    """
    from .probing import probe as run_probe

    _model(model)
    _tokenizer(tokenizer)
    return run_probe(model, tokenizer, task, **_cell_arguments(model, options))


def finetune(model: nn.Module, tokenizer: Any, task: str, **options: Any) -> dict:
    """Fine-tune a copy of ``model`` end to end on ``task`` and score it (``papa-surgery finetune``, one cell).

    The model is saved and reloaded with the family's stock head (``AutoModelForSequenceClassification`` or
    ``AutoModelForTokenClassification``) and trained with ``transformers.Trainer``; ``model`` is unchanged.
    ``options``: the hyperparameters of :class:`papa_surgery.options.FinetuneOptions` (``epochs``, ``lr``,
    ``batch_size``, ``weight_decay``, ``warmup_ratio``, ``eval_batch_size``, ``early_stopping_patience``,
    ``trainable_constants``, ``max_length``) and ``data_dir``, ``seed``, ``max_train_examples``,
    ``max_eval_examples``, ``device``, ``progress``. Returns the score and the cost (examples per second for
    training and inference, peak memory, trainable parameters, checkpoint size).

    Raises:
        ValueError: ``mlm`` (no fine-tuning head), an unknown option or task, missing data, bad values.
    """
    from dataclasses import fields

    from .finetuning import finetune as run_finetune
    from .options import FinetuneOptions

    _model(model)
    _tokenizer(tokenizer)
    names = {f.name for f in fields(FinetuneOptions)}
    hyper = {k: options.pop(k) for k in list(options) if k in names}
    return run_finetune(model, tokenizer, task, options=FinetuneOptions(**hyper), **_cell_arguments(model, options))


def analyze(
    model: nn.Module,
    tokenizer: Any,
    corpus: Any,
    which: str,
    out_dir: str | Path,
    *,
    overwrite: bool = False,
    **options: Any,
) -> dict:
    """Norm-based (``which="norms"``) or effective-attention (``"effective"``) analysis (``papa-surgery analyze``).

    Writes ``summary.json``, the corpus averages as constants (``norm-average.safetensors`` /
    ``effective-average.safetensors``), the figures and, for norms, ``norm-ranking.json`` into ``out_dir``: a new
    path or an empty folder, or with ``overwrite`` an earlier analysis folder holding only what it wrote (never
    anything else); the folder appears whole when the analysis is complete.
    ``corpus=None`` reads the default corpus. ``options`` are :func:`papa_surgery.analysis.analyze`'s
    (max_length, batch_size, max_examples, pairs, device, progress, source_name, heads, figures). The model's
    mode and device are left as they were.

    Returns:
        The summary, with ``"files"`` listing what was written.

    Raises:
        ValueError: an unknown analysis, a corpus that gives no examples, or an ``out_dir`` that may not be
            written (the error says why).
        OutputExistsError: a folder appeared at ``out_dir`` while this ran (another run, the user): it is left
            as it was, and the finished result is kept beside it, at the path the error names.
    """
    from .options import AnalyzeOptions, check_arguments
    from .workflow.analysis_job import analyze as run_analysis

    _model(model)
    _tokenizer(tokenizer)
    options = check_arguments(options, AnalyzeOptions)  # max_examples=0 was said as a corpus with no examples
    return run_analysis(model, tokenizer, corpus, which, out_dir, overwrite=overwrite, **options)
