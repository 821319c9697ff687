"""The paper's metrics (footnote 10): accuracy (SST-2, MNLI), F1 (MRPC: the positive class; NER:
entity level; POS: micro over words), Matthews correlation (CoLA), and negative log perplexity (MLM).

Sentence metrics take flat label/prediction index lists; token metrics take one list per sentence
(only the words that carry a label). Scores are plain floats in [0, 1] (MCC in [-1, 1]).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence


def accuracy(labels: Sequence[int], preds: Sequence[int]) -> float:
    """Share of predictions equal to the label."""
    _same_length(labels, preds)
    return sum(int(a == b) for a, b in zip(labels, preds, strict=False)) / max(len(labels), 1)


def binary_f1(labels: Sequence[int], preds: Sequence[int], positive: int = 1) -> float:
    """F1 of the ``positive`` class (GLUE's MRPC F1): 2·TP / (2·TP + FP + FN)."""
    _same_length(labels, preds)
    tp = sum(1 for a, b in zip(labels, preds, strict=False) if a == positive and b == positive)
    fp = sum(1 for a, b in zip(labels, preds, strict=False) if a != positive and b == positive)
    fn = sum(1 for a, b in zip(labels, preds, strict=False) if a == positive and b != positive)
    return 2 * tp / (2 * tp + fp + fn) if tp else 0.0


def matthews(labels: Sequence[int], preds: Sequence[int]) -> float:
    """Matthews correlation coefficient (scikit-learn; 0 when a marginal is constant)."""
    from sklearn.metrics import matthews_corrcoef

    _same_length(labels, preds)
    with warnings.catch_warnings():  # a single class in both lists: sklearn warns and returns 0
        warnings.simplefilter("ignore", UserWarning)
        return float(matthews_corrcoef(list(labels), list(preds)))


def entity_f1(labels: Sequence[Sequence[str]], preds: Sequence[Sequence[str]]) -> float:
    """Entity-level micro F1 over IOB2 tag sequences (seqeval's default CoNLL evaluation)."""
    from seqeval.metrics import f1_score

    _same_shape(labels, preds)
    return float(f1_score([list(x) for x in labels], [list(x) for x in preds]))


def token_f1(labels: Sequence[Sequence[int]], preds: Sequence[Sequence[int]]) -> float:
    """Micro F1 over words. Every word gets exactly one prediction, so micro precision = recall = accuracy."""
    _same_shape(labels, preds)
    flat_l = [t for s in labels for t in s]
    flat_p = [t for s in preds for t in s]
    return accuracy(flat_l, flat_p)


def neg_log_perplexity(total_nll: float, count: int) -> float:
    """-log(perplexity) = minus the mean negative log-likelihood (nats) of the masked tokens; higher is better."""
    if count <= 0:
        raise ValueError("no masked tokens were scored")
    return -total_nll / count


def perplexity(total_nll: float, count: int) -> float:
    """exp of the mean masked-token negative log-likelihood (the pseudo-perplexity of the masked tokens)."""
    return math.exp(-neg_log_perplexity(total_nll, count))


def score(metric: str, labels, preds, label_names: Sequence[str] = ()) -> float:
    """Dispatch on a task's metric name; token metrics take per-sentence lists of label indices."""
    if metric == "accuracy":
        return accuracy(labels, preds)
    if metric == "f1":
        return binary_f1(labels, preds, positive=1)
    if metric == "mcc":
        return matthews(labels, preds)
    if metric == "seqeval_f1":
        names = list(label_names)
        return entity_f1([[names[i] for i in s] for s in labels], [[names[i] for i in s] for s in preds])
    if metric == "token_f1":
        return token_f1(labels, preds)
    raise ValueError(f"unknown metric {metric!r}")


def predicted_classes(preds) -> int:
    """How many distinct labels the predictions use (per example, or per token of per-sentence lists)."""
    flat = [p for sentence in preds for p in sentence] if preds and isinstance(preds[0], (list, tuple)) else preds
    return len(set(flat))


def degenerate_message(what: str, task, golds, preds) -> str | None:
    """A warning when a trained model predicts one class for every example (``None`` when it does not).

    Such a model scores the majority class's share (a tagger: one tag everywhere) whatever its input: it learned
    nothing from the text, and its score says nothing about the encoder.
    """
    if predicted_classes(preds) != 1 or not preds:
        return None
    flat = [p for sentence in preds for p in sentence] if isinstance(preds[0], (list, tuple)) else preds
    names = list(getattr(task, "label_names", ()) or ())
    label = flat[0] if not names else names[flat[0]]
    units = "token" if isinstance(preds[0], (list, tuple)) else "example"
    return (
        f"{what} predicts {label!r} for every {units} of {task.name}'s {len(preds)} evaluation examples: it learned "
        f"nothing from the text and scores like that one class (score {score(task.metric, golds, preds, names):.4f}); "
        "train on more examples, for more epochs or with another learning rate"
    )


def _same_length(a: Sequence, b: Sequence) -> None:
    if len(a) != len(b):
        raise ValueError(f"{len(a)} labels but {len(b)} predictions")


def _same_shape(a: Sequence[Sequence], b: Sequence[Sequence]) -> None:
    _same_length(a, b)
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if len(x) != len(y):
            raise ValueError(f"sentence {i}: {len(x)} labels but {len(y)} predictions")
