"""Evaluation metrics in numpy (no torch, nothing of the server or the trainer): AUC and log
loss of predicted click probabilities.

Public as ``embeddb.trainer.auc`` and ``embeddb.trainer.logloss`` too; used by the demo
(:mod:`embeddb.demo`, which re-exports :func:`auc`), the trainer and the synthetic data's
teacher (``embeddb.features.synthetic``). :func:`log_loss` is another name of
:func:`logloss`.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from embeddb.errors import InvalidArgumentError

__all__ = ["auc", "log_loss", "logloss"]


def auc(*, labels: npt.ArrayLike, scores: npt.ArrayLike) -> float:
    """Area under the ROC curve, in O(n log n).

    Keyword-only (``auc(labels=y, scores=p)``): scikit-learn's ``roc_auc_score(y_true, y_score)``
    and earlier releases of this function take the two arrays in opposite orders, and a swapped
    call returns a plausible wrong number, so a positional call is a ``TypeError`` instead.

    Computed as the Mann-Whitney U statistic with average ranks for tied scores, so a tie
    between a positive and a negative counts one half (the pairwise definition).

    Args:
        labels: one label per sample; values above 0.5 are positives.
        scores: one score per sample (any real dtype, any shape; flattened).

    Returns:
        The probability that a random positive scores above a random negative.

    Raises:
        InvalidArgumentError: sizes differ, or the labels are all of one class (a
            ``ValueError``).
    """
    s = np.asarray(scores).ravel()
    positive = np.asarray(labels).ravel() > 0.5
    if s.size != positive.size:
        raise InvalidArgumentError(f"auc: {s.size} scores but {positive.size} labels")
    n_pos = int(positive.sum())
    n_neg = positive.size - n_pos
    if n_pos == 0 or n_neg == 0:
        raise InvalidArgumentError("AUC needs both positive and negative labels")
    _, inverse, counts = np.unique(s, return_inverse=True, return_counts=True)
    upper = np.cumsum(counts)
    avg_rank = upper - (counts - 1) / 2.0  # 1-based average rank of each distinct score
    rank_sum = float(avg_rank[inverse.ravel()][positive].sum())
    return (rank_sum - n_pos * (n_pos + 1) / 2.0) / (n_pos * n_neg)


def logloss(*, labels: npt.ArrayLike, scores: npt.ArrayLike, eps: float = 1e-7) -> float:
    """Mean binary cross-entropy of predicted probabilities (clipped to ``[eps, 1 - eps]``).

    Keyword-only, like :func:`auc`: ``logloss(labels=y, scores=p)``.

    Args:
        labels: one label per sample, 0 or 1.
        scores: predicted click probabilities (not logits), any shape; flattened.
        eps: the clipping margin, so a confident mistake costs ``-log(eps)``, not infinity.

    Returns:
        The mean log loss (natural log).

    Raises:
        InvalidArgumentError: sizes differ or there are no samples.
    """
    p = np.clip(np.asarray(scores, dtype=np.float64).ravel(), eps, 1.0 - eps)
    y = np.asarray(labels, dtype=np.float64).ravel()
    if p.size != y.size or p.size == 0:
        raise InvalidArgumentError(f"logloss: {p.size} scores and {y.size} labels")
    return float(-np.mean(y * np.log(p) + (1.0 - y) * np.log1p(-p)))


log_loss = logloss  # the earlier name
