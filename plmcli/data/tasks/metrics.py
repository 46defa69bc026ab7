"""Task metrics for finetuning, computed by scikit-learn and scipy (never by hand).

Every function takes `(preds, labels)` as array-likes and returns a float. Degenerate inputs give a
number, not NaN: a model that predicts one class scores MCC 0 and F1 0, and constant predictions
correlate 0. (A NaN would never compare greater than anything, so best-checkpoint selection would
freeze on it.)
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from plmcli.errors import PlmError


def accuracy(preds, labels) -> float:
    from sklearn.metrics import accuracy_score

    return float(accuracy_score(np.asarray(labels), np.asarray(preds)))


def f1(preds, labels) -> float:
    """Binary F1 of the positive class (label 1), as GLUE reports it for MRPC and QQP."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(labels), np.asarray(preds), pos_label=1, average="binary", zero_division=0))


def macro_f1(preds, labels) -> float:
    """Mean F1 over the classes present in gold or predictions (scikit-learn's macro): a class the dev set
    lacks and the model never predicts does not count as a zero."""
    from sklearn.metrics import f1_score

    return float(f1_score(np.asarray(labels), np.asarray(preds), average="macro", zero_division=0))


def mcc(preds, labels) -> float:
    """Matthews correlation coefficient (CoLA)."""
    from sklearn.metrics import matthews_corrcoef

    return float(matthews_corrcoef(np.asarray(labels), np.asarray(preds)))


def _correlation(fn, preds, labels) -> float:
    p, y = np.asarray(preds, dtype=np.float64), np.asarray(labels, dtype=np.float64)
    if len(p) < 2:
        return 0.0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy warns about constant input; that case is 0 below
        r = float(fn(p, y)[0])
    return 0.0 if math.isnan(r) else r


def pearson(preds, labels) -> float:
    from scipy.stats import pearsonr

    return _correlation(pearsonr, preds, labels)


def spearman(preds, labels) -> float:
    from scipy.stats import spearmanr

    return _correlation(spearmanr, preds, labels)


METRICS = {"accuracy": accuracy, "f1": f1, "macro_f1": macro_f1, "mcc": mcc, "pearson": pearson, "spearman": spearman}
"""Metric name -> function; tasks name theirs from here."""


def compute(names, preds, labels) -> dict[str, float]:
    """{name: value} for each metric in `names` over the same predictions."""
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise PlmError(f"unknown metric(s) {', '.join(unknown)}", f"known: {', '.join(METRICS)}")
    if len(preds) != len(labels):
        raise ValueError(f"{len(preds)} predictions for {len(labels)} labels")
    return {n: METRICS[n](preds, labels) for n in names}
