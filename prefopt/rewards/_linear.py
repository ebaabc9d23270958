"""The linear Bradley-Terry reward: a logistic regression on feature differences."""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression


class LinearBradleyTerry:
    """``RewardModel(model=None)``'s fit: P(a preferred to b) = sigmoid(coef . (f(a) - f(b))).

    A mixin of :class:`~prefopt.rewards.RewardModel`, which holds the parameters
    (``features``, ``alpha``) and calls these methods from ``fit`` and ``partial_fit``.
    """

    def _fit_linear(self, data) -> None:
        featurizer = self.features if self.features is not None else data.featurizer
        if featurizer is None:
            raise ValueError(
                "RewardModel(model=None) fits a linear reward on features, but these "
                "comparisons carry no featurizer; pass features=callable(prompts, "
                "completions) -> (n, d) array, model= a language model, or comparisons "
                "from a prefopt world."
            )
        self.featurizer_ = featurizer
        self.comparison_features_ = self._feature_differences(data)
        self._fit_coef()
        self.gain_, self.bias_ = 1.0, 0.0

    def _feature_differences(self, data) -> np.ndarray:
        f_chosen = self._features(self.featurizer_, data.prompt, data.chosen)
        f_rejected = self._features(self.featurizer_, data.prompt, data.rejected)
        return f_chosen - f_rejected

    def _fit_coef(self) -> None:
        diff = self.comparison_features_
        X_bt = np.vstack([diff, -diff])
        y_bt = np.r_[np.ones(len(diff)), np.zeros(len(diff))]
        C = np.inf if self.alpha == 0 else 1.0 / self.alpha
        logreg = LogisticRegression(C=C, fit_intercept=False, max_iter=1000).fit(X_bt, y_bt)
        self.coef_ = logreg.coef_.ravel().copy()

    @staticmethod
    def _features(featurizer, prompts, completions) -> np.ndarray:
        F = np.asarray(featurizer(list(prompts), list(completions)), dtype=np.float64)
        if F.ndim != 2 or F.shape[0] != len(prompts):
            raise ValueError(
                f"features returned shape {F.shape} for {len(prompts)} "
                "responses; it must return an (n, d) array."
            )
        return F
