import numpy as np
import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

from plmcli.errors import PlmError
from plmcli.data.tasks import metrics

rng = np.random.default_rng(0)
LABELS = rng.integers(0, 2, 50)
PREDS = np.where(rng.random(50) < 0.7, LABELS, 1 - LABELS)


def test_classification_metrics_equal_sklearn():
    assert metrics.accuracy(PREDS, LABELS) == pytest.approx(accuracy_score(LABELS, PREDS))
    assert metrics.f1(PREDS, LABELS) == pytest.approx(f1_score(LABELS, PREDS))
    assert metrics.mcc(PREDS, LABELS) == pytest.approx(matthews_corrcoef(LABELS, PREDS))
    # By hand on a tiny case: tp=2 fp=1 fn=1 tn=1 -> P=R=2/3, F1=2/3; MCC=(2·1-1·1)/sqrt(3·3·2·2)=1/6.
    p, y = [1, 1, 1, 0, 0], [1, 1, 0, 1, 0]
    assert metrics.f1(p, y) == pytest.approx(2 / 3)
    assert metrics.mcc(p, y) == pytest.approx(1 / 6)
    assert metrics.accuracy(p, y) == pytest.approx(0.6)


def test_three_class_accuracy_and_mcc():
    y = rng.integers(0, 3, 40)
    p = np.where(rng.random(40) < 0.5, y, rng.integers(0, 3, 40))
    assert metrics.accuracy(p, y) == pytest.approx(accuracy_score(y, p))
    assert metrics.mcc(p, y) == pytest.approx(matthews_corrcoef(y, p))


def test_correlations_equal_scipy():
    y = rng.uniform(0, 5, 30)
    p = y + rng.normal(0, 1, 30)
    assert metrics.pearson(p, y) == pytest.approx(pearsonr(p, y)[0])
    assert metrics.spearman(p, y) == pytest.approx(spearmanr(p, y)[0])
    assert metrics.spearman([1, 2, 3, 4], [10, 20, 30, 45]) == pytest.approx(1.0)


def test_degenerate_inputs_give_numbers_not_nan():
    y = np.array([0, 1, 0, 1])
    assert metrics.mcc(np.zeros(4), y) == 0.0  # one predicted class
    assert metrics.f1(np.zeros(4), y) == 0.0  # no positive predicted
    assert metrics.pearson(np.ones(4), y) == 0.0  # constant predictions
    assert metrics.spearman(np.ones(4), y) == 0.0
    assert metrics.pearson([1.0], [2.0]) == 0.0


def test_compute():
    res = metrics.compute(("f1", "accuracy"), PREDS, LABELS)
    assert list(res) == ["f1", "accuracy"] and res["accuracy"] == pytest.approx(accuracy_score(LABELS, PREDS))
    with pytest.raises(PlmError, match="unknown metric"):
        metrics.compute(("bleu",), PREDS, LABELS)
    with pytest.raises(ValueError):
        metrics.compute(("accuracy",), PREDS[:3], LABELS)
