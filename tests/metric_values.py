"""Which scores a metric can give on a given eval set: a stronger check than ``0 <= score <= 1``.

An accuracy over n examples is a multiple of 1/n; an F1 over entities (or positive examples) is
2 TP / (gold + predicted) with integers 0 <= TP <= min(gold, predicted) and predicted <= the most the model
could predict. A wrong denominator (padding counted, a split mixed up, a mean over batches) fails these.
"""

from __future__ import annotations


def _integral(x: float, tol: float = 1e-9) -> bool:
    return abs(x - round(x)) <= tol


def is_accuracy_of(score: float, n: int) -> bool:
    """``score`` is correct / n for an integer 0 <= correct <= n."""
    return 0.0 <= score <= 1.0 and _integral(score * n)


def is_f1_of(score: float, gold: int, most_predicted: int) -> bool:
    """``score`` is 2 TP / (gold + predicted) for integers 0 <= TP <= min(gold, predicted), predicted <= most."""
    if score == 0.0:
        return True  # TP = 0
    for tp in range(1, gold + 1):
        predicted = 2 * tp / score - gold
        if _integral(predicted, 1e-6) and tp <= round(predicted) <= most_predicted:
            return True
    return False
