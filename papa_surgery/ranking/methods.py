"""The ranking strategies and their dispatch (the library call behind ``papa-surgery rank``).

Above ``ranking.py`` (the ``Ranking`` object, a leaf) and the strategies that need more than a score
table: ``lambda_rank.py`` (learned lambdas, paper 3.2) and ``analysis`` (head contributions ||alpha f||,
returned as a score table). Nothing below imports this module.
"""

from __future__ import annotations

import random
from typing import Any

from .. import __version__, registry
from ..calibration.protocol import ConstantsBase as Constants
from ..failures import ArgumentError, spell
from ..models.loading import public_name
from .order import Ranking, order_by_scores, reversed_ranking

NORM_SCORE = "mean ||alpha_ij f_h(x_j)|| over real entries (Kobayashi et al. 2020), smallest first"


def norm_ranking(constants: Constants | None = None, *, model=None, tokenizer=None, corpus=None, **kwargs) -> Ranking:
    """Ranking ``norm``: heads with the smallest mean contribution ||alpha f|| are made constant first.

    Args:
        constants: ``norm-average`` constants (their ``metadata["contribution"]`` holds the scores); when
            ``None`` or of another kind, ``model``, ``tokenizer`` and ``corpus`` run a norm pass instead.
        kwargs: passed to :func:`papa_surgery.analysis.stream` (max_length, batch_size, max_examples, ...).

    Raises:
        ValueError: neither norm-average constants nor a model, tokenizer and corpus to measure on.
    """
    from ..analysis import norm_scores

    if constants is not None and (model is None or constants.serves("norm")):
        scores, meta = constants.head_scores("norm"), constants.metadata  # refuses constants of another kind
    else:
        scores, meta = norm_scores(None, model=model, tokenizer=tokenizer, corpus=corpus, **kwargs)
    order, ordered = order_by_scores(scores, ascending=True)
    prov = {
        "papa_surgery_version": __version__,
        "score": NORM_SCORE,
        "corpus": meta.get("corpus"),
        "examples": meta.get("examples"),
        "source_model": meta.get("source_model"),
    }
    return Ranking("norm", order, len(scores), len(scores[0]), ordered, prov)


def label_free_ranking(
    method: str,
    num_layers: int | None = None,
    num_heads: int | None = None,
    constants: Constants | None = None,
    seed: int = 0,
) -> Ranking:
    """A ranking that needs no labels and no model: variance, norm, first-to-last, last-to-first, random.

    The model shape comes from ``constants`` when ``num_layers`` / ``num_heads`` are not given.

    Raises:
        ValueError: unknown method (with a suggestion), a learned method, ``variance`` / ``norm`` without the
            constants they read, or no shape.
    """
    if method == "norm":  # Kobayashi et al. 2020: smallest mean ||alpha f|| first (norm-average constants)
        return norm_ranking(constants)
    if registry.method(method).task:
        raise ValueError(f"the {method!r} ranking is learned on a labelled task: rank with the model and a task")
    if registry.method(method).corpus:
        raise ValueError(f"the {method!r} ranking runs the model over a corpus: rank with the model and its tokenizer")
    if constants is not None:
        num_layers = constants.num_layers if num_layers is None else num_layers
        num_heads = constants.num_heads if num_heads is None else num_heads
        if (num_layers, num_heads) != (constants.num_layers, constants.num_heads):
            raise ValueError(
                f"the constants are for {constants.num_layers} layers x {constants.num_heads} heads, not "
                f"{num_layers} x {num_heads}"
            )
    if num_layers is None or num_heads is None:
        raise ValueError(
            f"the {method!r} ranking needs the model's shape: pass constants (or num_layers and num_heads)"
        )
    prov: dict[str, Any] = {"papa_surgery_version": __version__}
    scores = None
    if method == "variance":
        if constants is None:
            raise ValueError("the variance ranking needs calibrated (average) constants with their variance scores")
        order, scores = order_by_scores(constants.head_scores("variance"))  # refuses constants of another kind
        prov.update(corpus=constants.metadata.get("corpus"), source_model=constants.metadata.get("source_model"))
    elif method in ("first-to-last", "last-to-first"):
        layers = range(num_layers) if method == "first-to-last" else reversed(range(num_layers))
        order = [[layer, head] for layer in layers for head in range(num_heads)]
    else:  # random
        order = [[layer, head] for layer in range(num_layers) for head in range(num_heads)]
        random.Random(seed).shuffle(order)
        prov["seed"] = seed
    return Ranking(method, order, num_layers, num_heads, scores, prov)


def rank_heads(
    method: str,
    model,
    tokenizer=None,
    constants: Constants | None = None,
    task=None,
    data_dir=None,
    seed: int = 0,
    corpus=None,
    **lambda_options,
) -> Ranking:
    """Rank every head of ``model`` with ``method`` (the library call behind ``papa-surgery rank``).

    Args:
        method: one of ``papa_surgery.registry.METHODS`` (a misspelling gets a suggestion).
        model: the source model (never changed).
        tokenizer: its tokenizer (``lambda`` / ``reversed-lambda``).
        constants: calibrated ``Constants`` of this model: needed by ``variance``, ``lambda`` and
            ``reversed-lambda``; ``norm`` reads ``norm-average`` constants.
        task, data_dir: the labelled probe task (and local data folder) the lambdas are trained on.
        seed: the ``random`` permutation's seed; the lambda probe's seed.
        corpus: the unlabelled text ``sensitivity`` measures on (default: the default calibration corpus).
        **lambda_options: fields of :class:`papa_surgery.ranking.lambdas.LambdaOptions` (steps, epochs, lr,
            lambda_lr, batch_size, max_train_examples, device, progress) and ``source_name``; the label-free
            methods ignore them (``source_name`` aside), so a caller may pass the same options to every method.

    Raises:
        ValueError: unknown method (with a suggestion); ``lambda`` without a task; missing constants, or
            constants for another model shape.
    """
    from ..models.families import num_heads_layers

    chosen = registry.check_method(method, task)
    num_heads, num_layers = num_heads_layers(model.config)
    source_name = lambda_options.pop("source_name", None) or getattr(model.config, "_name_or_path", None) or None
    if constants is not None:
        constants.check_compatible(model.config)
    if chosen.corpus:
        return _measured_ranking(chosen, model, tokenizer, constants, corpus, source_name, lambda_options)
    if not chosen.task:  # lambda_options (steps, device, progress...) do not apply: ignored
        ranking = label_free_ranking(method, num_layers, num_heads, constants=constants, seed=seed)
        prov = ranking.provenance
        prov.setdefault("task", None)
        if prov.get("source_model") is None:
            prov["source_model"] = public_name(source_name)
        return ranking
    if constants is None:
        raise ArgumentError(
            "constants",
            f"the {method!r} ranking mixes each head with its constant matrix: pass {spell('constants')} "
            "(make them with papa-surgery calibrate)",
        )
    registry.check_reads(method, constants.kind)
    if tokenizer is None:
        raise ValueError(f"the {method!r} ranking needs the model's tokenizer to read the task's data")
    from .lambdas import train_lambdas

    ranking = train_lambdas(
        model, tokenizer, constants, task, data_dir, seed=seed, source_name=source_name, **lambda_options
    )
    return reversed_ranking(ranking) if method == "reversed-lambda" else ranking


def _measured_ranking(chosen, model, tokenizer, constants, corpus, source_name, options: dict) -> Ranking:
    """``sensitivity``: measured on ``model`` over ``corpus``, each head made constant with its matrix in
    ``constants`` (the average: what the default kind starts from)."""
    if constants is None:
        raise ArgumentError(
            "constants",
            f"the {chosen.name!r} ranking makes each head constant with its {chosen.constants} matrix: pass "
            f"{spell('constants')} (make them with papa-surgery calibrate)",
        )
    registry.check_reads(chosen.name, constants.kind)
    if tokenizer is None:
        raise ArgumentError("tokenizer", f"the {chosen.name!r} ranking runs the model on text: pass its tokenizer")
    from .sensitivity import sensitivity_ranking

    known = {k: options[k] for k in ("max_examples", "batch_size", "device", "progress") if options.get(k) is not None}
    corpus = measured_corpus(chosen.name, corpus, constants)
    return sensitivity_ranking(model, tokenizer, corpus, constants, source_name=source_name, **known)


def constants_serve(method: registry.Method, constants: Constants | None) -> bool:
    """Whether ``constants`` serve ``method`` as given: a method measured on text needs only their kind to be the one
    it reads (not the calibration's scores); the others read the scores too."""
    if constants is None:
        return False
    if not method.corpus:
        return constants.serves(method.name)
    try:
        registry.check_reads(method.name, constants.kind)
    except ValueError:
        return False
    return True


def measured_corpus(method: str, corpus, constants: Constants, max_examples: int | None = None):
    """The corpus a ranking measured on text runs on: ``corpus`` (anything ``load_corpus`` reads), else the default
    one; of sentence pairs when ``constants`` are, which the default corpus is not (refused, naming the fix)."""
    from ..calibration.corpus import default_corpus, load_corpus

    if corpus is None and constants.pairs:
        raise ArgumentError(
            "corpus",
            f"these constants are calibrated on sentence pairs: the {method!r} ranking runs the model on a corpus "
            f"of pairs, pass one with {spell('corpus')} (or rank with {spell('method', 'variance')})",
        )
    if corpus is None:
        return default_corpus(max_examples=max_examples)
    return load_corpus(corpus, pairs=constants.pairs, max_examples=max_examples)
