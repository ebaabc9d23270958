"""The linear Bradley-Terry reward: a logistic regression on feature differences.

``RewardModel(model=None)``'s fit: P(a preferred to b) = sigmoid(coef . (f(a) - f(b))),
each pair also mirrored, so no intercept is needed. Functions of features and
comparisons; :class:`~prefopt.rewards.RewardModel` holds what they return.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression


def check_no_lm_settings(params: dict) -> None:
    """Refuse the language-model settings (``params``: the estimator's) on a linear reward."""
    lm_only = {"lora": None, "gradient_checkpointing": False, "micro_batch_size": None}
    given = [k for k, v in lm_only.items() if params[k] != v]
    if given:
        raise ValueError(
            f"RewardModel: {', '.join(given)} set, but model=None fits the linear "
            "feature reward (no language model to adapt or checkpoint); give a "
            "model= or leave them at their defaults."
        )


def featurizer_for(features, data):
    """The feature function: ``features``, else the one the comparisons carry."""
    featurizer = features if features is not None else data.featurizer
    if featurizer is None:
        raise ValueError(
            "RewardModel(model=None) fits a linear reward on features, but these "
            "comparisons carry no featurizer; pass features=callable(prompts, "
            "completions) -> (n, d) array, model= a language model, or comparisons "
            "from a prefopt world."
        )
    return featurizer


def feature_differences(featurizer, data) -> np.ndarray:
    """Chosen minus rejected features of each comparison, shape (n, d)."""
    f_chosen = feature_matrix(featurizer, data.prompt, data.chosen)
    f_rejected = feature_matrix(featurizer, data.prompt, data.rejected)
    return f_chosen - f_rejected


def bradley_terry_coef(diff: np.ndarray, alpha: float) -> np.ndarray:
    """The maximum-likelihood (``alpha``: L2-penalised) weights on feature differences."""
    X_bt = np.vstack([diff, -diff])
    y_bt = np.r_[np.ones(len(diff)), np.zeros(len(diff))]
    C = np.inf if alpha == 0 else 1.0 / alpha
    logreg = LogisticRegression(C=C, fit_intercept=False, max_iter=1000).fit(X_bt, y_bt)
    return logreg.coef_.ravel().copy()


def feature_matrix(featurizer, prompts, completions) -> np.ndarray:
    """``featurizer``'s (n, d) features of the pairs, checked for their shape."""
    F = np.asarray(featurizer(list(prompts), list(completions)), dtype=np.float64)
    if F.ndim != 2 or F.shape[0] != len(prompts):
        raise ValueError(
            f"features returned shape {F.shape} for {len(prompts)} "
            "responses; it must return an (n, d) array."
        )
    return F
