"""The probe's metrics against hand computations on small cases (paper footnote 10)."""

from __future__ import annotations

import math

import pytest

from papa_surgery.tasks import metrics
from papa_surgery.tasks.registry import CONLL_NER_LABELS


def test_accuracy():
    assert metrics.accuracy([0, 1, 1, 0], [0, 1, 0, 0]) == pytest.approx(3 / 4)


def test_cola_mcc_by_hand():
    labels = [1, 1, 0, 0, 1]
    preds = [1, 0, 0, 1, 1]
    tp, tn, fp, fn = 2, 1, 1, 1
    expected = (tp * tn - fp * fn) / math.sqrt((tp + fp) * (tp + fn) * (tn + fp) * (tn + fn))  # = 1/6
    assert metrics.matthews(labels, preds) == pytest.approx(expected)
    assert metrics.score("mcc", labels, preds) == pytest.approx(1 / 6)
    assert metrics.matthews([1, 1, 1], [1, 1, 1]) == 0.0  # constant marginals: 0, not NaN


def test_mrpc_f1_is_the_positive_class():
    labels = [1, 1, 1, 0, 0]
    preds = [1, 0, 1, 1, 0]
    # positive class: TP=2, FP=1, FN=1 -> 2*2 / (2*2 + 1 + 1) = 2/3; the negative class would give 1/2.
    assert metrics.binary_f1(labels, preds) == pytest.approx(2 / 3)
    assert metrics.score("f1", labels, preds) == pytest.approx(2 / 3)
    assert metrics.binary_f1(labels, preds, positive=0) == pytest.approx(1 / 2)
    assert metrics.binary_f1([0, 0], [0, 0]) == 0.0


def test_ner_is_entity_level_f1_on_bio_tags():
    gold = [["B-PER", "I-PER", "O", "B-LOC"], ["B-ORG", "I-ORG", "O"]]
    pred = [["B-PER", "I-PER", "O", "B-ORG"], ["B-ORG", "O", "O"]]
    # gold entities: PER(0-1), LOC(3), ORG(0-1); predicted: PER(0-1) correct, ORG(3) wrong, ORG(0) a partial span
    # (wrong): P = 1/3, R = 1/3, F1 = 1/3 -- a tag-level accuracy would give 5/7.
    assert metrics.entity_f1(gold, pred) == pytest.approx(1 / 3)
    names = list(CONLL_NER_LABELS)
    as_ids = lambda seqs: [[names.index(t) for t in s] for s in seqs]
    assert metrics.score("seqeval_f1", as_ids(gold), as_ids(pred), CONLL_NER_LABELS) == pytest.approx(1 / 3)


def test_pos_token_f1_is_micro_over_words():
    gold = [[1, 2, 3], [4, 5]]
    pred = [[1, 2, 0], [4, 0]]
    assert metrics.token_f1(gold, pred) == pytest.approx(3 / 5)


def test_negative_log_perplexity():
    assert metrics.neg_log_perplexity(6.0, 3) == pytest.approx(-2.0)
    assert metrics.perplexity(6.0, 3) == pytest.approx(math.exp(2.0))
    with pytest.raises(ValueError, match="no masked tokens"):
        metrics.neg_log_perplexity(0.0, 0)


def test_shape_mismatch_and_unknown_metric():
    with pytest.raises(ValueError, match="labels but"):
        metrics.accuracy([0, 1], [0])
    with pytest.raises(ValueError, match="sentence 0"):
        metrics.token_f1([[1, 2]], [[1]])
    with pytest.raises(ValueError, match="unknown metric"):
        metrics.score("bleu", [0], [0])


def test_metric_value_checks_reject_scores_an_eval_set_cannot_give():
    from metric_values import is_accuracy_of, is_f1_of

    assert is_accuracy_of(13 / 16, 16) and not is_accuracy_of(0.8, 16)
    assert is_f1_of(2 * 3 / (5 + 4), gold=5, most_predicted=20)  # TP 3 of 5 gold, 4 predicted
    assert not is_f1_of(0.7, gold=5, most_predicted=20) and not is_f1_of(0.9, gold=4, most_predicted=20)
