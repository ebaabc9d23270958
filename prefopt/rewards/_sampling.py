"""Drawing preference labels from a fitted reward's Bradley-Terry model."""

from __future__ import annotations

import numpy as np
from scipy.special import expit
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..data import check_texts


class BradleyTerrySampling:
    """``sample``: a fitted reward as a labeller of comparisons (mixed into RewardModel)."""

    def sample(self, prompts, completions_a, completions_b, random_state=None) -> np.ndarray:
        """Draw which of two completions is preferred, from the Bradley-Terry model.

        Row ``i`` is 0 (``a`` preferred) with probability
        ``sigmoid(r(x_i, a_i) - r(x_i, b_i))``, else 1 (``b`` preferred): the index of the
        preferred completion, as a labeller of comparisons returns it.

        Parameters
        ----------
        prompts, completions_a, completions_b : list of str
            Equal-length lists: one prompt and two completions per row.
        random_state : int, RandomState instance or None, default=None
            ``None`` uses the model's ``random_state``, as the worlds' raters use the
            world's; same state, same labels. With an integer there, pass a fresh
            ``random_state`` for each batch when labelling several, or their draws repeat.

        Returns
        -------
        labels : ndarray of shape (n,), dtype int
            0 where ``a`` is preferred, 1 where ``b`` is.

        Examples
        --------
        >>> from prefopt import RewardModel
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
        >>> a, b = world.responses[0], world.responses[1]
        >>> rm.sample([world.prompts[0]] * 4, [a] * 4, [b] * 4, random_state=0).shape
        (4,)
        """
        check_is_fitted(self)
        prompts = check_texts(prompts, "prompt", "RewardModel.sample")
        completions_a = check_texts(completions_a, "completion", "RewardModel.sample")
        completions_b = check_texts(completions_b, "completion", "RewardModel.sample")
        if not len(prompts) == len(completions_a) == len(completions_b):
            raise ValueError(
                f"RewardModel.sample got {len(prompts)} prompts, {len(completions_a)} "
                f"completions_a and {len(completions_b)} completions_b; pass one prompt and "
                "two completions per row."
            )
        rng = check_random_state(self.random_state if random_state is None else random_state)
        # Bradley and Terry (1952): P(a preferred) = sigmoid(r_a - r_b).
        p_a = expit(self.predict(prompts, completions_a) - self.predict(prompts, completions_b))
        return (rng.uniform(size=len(prompts)) >= p_a).astype(int)
