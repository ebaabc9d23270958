"""What a fitted search does with its best estimator: score, sample, predict, log-probs.

Private to :mod:`prefopt.model_selection`: the methods of
:class:`~prefopt.model_selection.SeedSearchCV` that hand a call to ``best_estimator_``
(the refitted best candidate), as ``GridSearchCV``'s do.
"""

from __future__ import annotations

from sklearn.utils.validation import check_is_fitted


class _BestEstimatorMethods:
    """``score``, ``sample``, ``predict`` and ``log_prob`` of ``best_estimator_``."""

    def score(self, X, y=None):
        """The score of ``best_estimator_`` on ``X``, by the metric that picked it.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        y : object, default=None
            Passed to the scorer.

        Returns
        -------
        score : float

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2,
        ...                       scoring=world.scorer("objective")).fit(world.prompts, rm)
        >>> bool(search.score(world.prompts) == world.scorer("objective")(
        ...     search.best_estimator_, world.prompts))
        True
        """
        check_is_fitted(self, "best_estimator_")
        scorer = self.scorer_[self.refit] if isinstance(self.scorer_, dict) else self.scorer_
        value = scorer(self.best_estimator_, X, y)
        return value[self.refit] if isinstance(value, dict) else value

    def sample(self, X, n: int = 1, **kwargs):
        """Sample ``n`` completions per prompt from ``best_estimator_``.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        n : int, default=1
            Completions per prompt.
        **kwargs : dict
            Passed to ``best_estimator_.sample`` (e.g. ``random_state``).

        Returns
        -------
        completions : list of list of str
            ``n`` completions per prompt.

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2).fit(world.prompts, rm)
        >>> [len(group) for group in search.sample(world.prompts[:2], n=3)]
        [3, 3]
        """
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.sample(X, n, **kwargs)

    def log_prob(self, prompts, completions, **kwargs):
        """Log-probability of each completion under ``best_estimator_``.

        Parameters
        ----------
        prompts : list of str
            One prompt per completion.
        completions : list of str
            The completions to score.
        **kwargs : dict
            Passed to ``best_estimator_.log_prob`` (e.g. ``reference=True``).

        Returns
        -------
        logprobs : ndarray of shape (n,)

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2).fit(world.prompts, rm)
        >>> prompts = world.prompts[:2]
        >>> completions = [group[0] for group in search.sample(prompts)]
        >>> search.log_prob(prompts, completions).shape
        (2,)
        """
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.log_prob(prompts, completions, **kwargs)

    def predict(self, X, **kwargs) -> list:
        """The greedy completion of each prompt from ``best_estimator_``.

        Parameters
        ----------
        X : list of str or table with a ``prompt`` column
            Prompts.
        **kwargs : dict
            Passed to ``best_estimator_.predict`` (e.g. ``max_new_tokens``).

        Returns
        -------
        completions : list of str

        Examples
        --------
        >>> from prefopt import RewardModel, RLOOPolicy
        >>> from prefopt.model_selection import SeedSearchCV
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> policy = RLOOPolicy(model=world.policy_model(), learning_rate=2.0, optimizer="sgd",
        ...                     n_steps=3, batch_size=16)
        >>> search = SeedSearchCV(policy, {"beta": [0.1, 1.0]}, seeds=2).fit(world.prompts, rm)
        >>> len(search.predict(world.prompts[:3]))
        3
        """
        check_is_fitted(self, "best_estimator_")
        return self.best_estimator_.predict(X, **kwargs)
