"""The Bradley-Terry reward model: linear in features, or a scalar head on a language model."""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from ..backend import unpad
from ..data import PreferenceData, check_comparisons, check_pairs
from ..lm import LanguageModelEstimator, check_lengths
from ..lm._checkpoint import check_folder
from ..lm._run import one_fit_at_a_time
from ..lm.supervised import SUPERVISED_CONSTRAINTS, warn_y_ignored
from ..tracking import check_callback, open_run
from ..validation import Interval, validate_params
from . import _linear, _lm
from ._export import save_sequence_classifier, to_sequence_classifier
from ._sampling import preference_labels

__all__ = ["RewardModel"]


class RewardModel(LanguageModelEstimator):
    """A reward model fitted on pairwise comparisons with the Bradley-Terry loss.

    ``P(chosen > rejected) = sigmoid(r(x, chosen) - r(x, rejected))``.

    With a language model (``model`` given), the reward is the SFT model's trunk
    with a linear head whose weights are drawn with std 1/sqrt(d_model + 1)
    (the original code; the paper misprints the std), trained for one epoch;
    the score is read at the last real token (the EOS) of the right-padded
    prompt + response. After training it is normalised to mean 0 and std 1 on
    responses sampled from the starting policy, so beta keeps its meaning
    (Ziegler et al.), and, when ``references`` are passed to ``fit``, shifted
    so that reference responses score 0 on average (Huang et al.).

    With ``model=None`` the reward is linear in features of the response,
    ``r(x, y) = w . f(x, y)``, fitted by logistic regression on feature
    differences (each pair also mirrored, so no intercept is needed); the
    features come from ``features`` or from the comparisons (the exact worlds
    attach theirs).

    Parameters
    ----------
    model : None, str, transformers config, torch module or fitted SFTPolicy, default=None
        The starting language model (copied), or ``None`` for the linear
        feature reward. A fitted :class:`SFTPolicy` is the usual choice.
    tokenizer : str or tokenizer, default=None
        ``None`` takes the model's.
    features : callable, default=None
        Linear reward only: ``features(prompts, completions) -> ndarray (n, d)``.
    alpha : float, default=0.0
        Linear reward only: L2 penalty on the weights (0 is maximum likelihood).
    learning_rate : float, default=None
        ``None`` means 1e-3 for models under 10M parameters, else 1e-5.
    n_epochs : int, default=1
    batch_size : int, default=8
        Comparisons per gradient step.
    normalize : bool, default=True
        Normalise to mean 0, std 1 on samples from the starting policy.
    normalize_samples : int, default=256
        Responses sampled for the normalisation (the original code's 256).
    temperature, max_new_tokens : float, int, default=None
        Sampling settings for the normalisation samples; ``None`` reads the
        model's generation config, else 0.7 and 53.
    stop_token_ids : int or list of int, default=None
        The ids that end a response: the normalisation samples stop there, and
        a text completion ends with one before it is scored (the EOS, or the
        chat template's end of turn after a conversation). ``None`` takes the
        model's ``generation_config.eos_token_id`` and the tokenizer's EOS.
    max_length, max_prompt_length : int, default=None
        Language-model reward only: as :class:`~prefopt.SFTPolicy`'s (TRL's), in
        training and scoring alike; a cut response is scored at its last token kept
        (it has lost its stop token).
    head_std : float, default=None
        Std of the head's initial weights; ``None`` means 1/sqrt(d_model + 1).
    random_state : int, RandomState instance or None, default=None
        Seeds the head's initial weights, the order of the comparisons and
        the normalisation samples.
    verbose : int, default=0
        Language-model reward: ``1`` prints a line (step, loss, accuracy) every
        10 steps and at the last, ``2`` every step; no ``logging`` setup needed.
    checkpoint_dir : str or path, default=None
        Language-model reward only: save the fit every ``checkpoint_every``
        steps and at the end (JSON and safetensors, no pickle); ``fit`` with
        the same folder, parameters and comparisons resumes from it.
    checkpoint_every : int, default=100
        Gradient steps between checkpoints.
    on_unhealthy : {"warn", "raise", "stop", "ignore"}, default="warn"
        Language-model reward only: as :class:`~prefopt.SFTPolicy`'s.
    lora : dict or peft.LoraConfig, default=None
        Language-model reward only: train a LoRA adapter (peft) on the trunk,
        and the head in full, instead of all weights, e.g.
        ``{"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}``; the
        adapter's initial weights are drawn from ``random_state``. After
        training the adapter is merged into the trunk, so ``model_`` stays a
        plain trunk plus head (``partial_fit`` trains a new adapter).
    gradient_checkpointing : bool, default=False
        Language-model reward only: as :class:`~prefopt.SFTPolicy`'s.
    micro_batch_size : int, default=None
        Language-model reward only: run each minibatch's passes on at most this
        many comparisons at a time and step once on the accumulated gradient;
        the loss stays the mean over the whole minibatch. ``None``: all at once.

    Attributes
    ----------
    coef_ : ndarray of shape (n_features,)
        Linear reward only: the weights.
    featurizer_ : callable
        Linear reward only: the feature function.
    model_ : ScalarHeadModel
        Language-model reward only: trunk plus head.
    tokenizer_ : tokenizer
    stop_token_ids_ : list of int
        Language-model reward only: the ids that end a response.
    gain_, bias_ : float
        Affine normalisation applied to the head's raw output.
    comparison_features_ : ndarray of shape (n_comparisons, n_features)
        Linear reward only: chosen minus rejected features of every comparison
        seen (``partial_fit`` refits on all of them).
    normalization_rows_ : list or None
        Language-model reward only: the prompt and response token rows sampled
        from the starting policy for the normalisation (``partial_fit``
        normalises again on them).
    reference_texts_ : list or None
        Language-model reward only: ``fit``'s references, as texts.
    history_ : list of dict
        ``loss/reward`` and ``reward/accuracy`` per step; the run's health is in
        ``health_``, as :class:`~prefopt.SFTPolicy`'s (language-model reward only).
    n_comparisons_ : int
        Comparisons seen in ``fit``.
    starting_policy_ : object or None
        Where a policy fitted against this reward starts when it is given no
        ``model=``: the language model the reward was built on (usually the
        fitted :class:`SFTPolicy`), or for a linear reward the policy the
        comparisons were sampled from (a world's reference policy).

    See Also
    --------
    SFTPolicy, PPOPolicy

    References
    ----------
    R. A. Bradley and M. E. Terry, "Rank analysis of incomplete block designs",
    Biometrika, 1952.
    D. M. Ziegler et al., "Fine-Tuning Language Models from Human Preferences", 2019.

    Examples
    --------
    >>> from prefopt import RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> world = PreferenceWorld(random_state=0)
    >>> rm = RewardModel().fit(world.comparisons(500, random_state=0))
    >>> rm.predict([world.prompts[0]], [world.responses[0]]).shape
    (1,)
    >>> 0.5 < rm.score(world.comparisons(200, random_state=1)) <= 1.0
    True
    """

    _pipeline_field = "reward_model"  # what transform hands the next step of a Pipeline
    _parameter_constraints = {
        **SUPERVISED_CONSTRAINTS,
        "features": [callable, None],
        "alpha": [Interval(Real, 0, None, closed="left")],
        "normalize": ["boolean"],
        "normalize_samples": [Interval(Integral, 2, None, closed="left")],
        "head_std": [Interval(Real, 0, None, closed="left"), None],
    }

    def __init__(
        self,
        *,
        model=None,
        tokenizer=None,
        features=None,
        alpha: float = 0.0,
        learning_rate=None,
        n_epochs=1,
        batch_size=8,
        normalize=True,
        normalize_samples=256,
        temperature=None,
        max_new_tokens=None,
        stop_token_ids=None,
        max_length=None,
        max_prompt_length=None,
        head_std=None,
        random_state=None,
        verbose=0,
        checkpoint_dir=None,
        checkpoint_every=100,
        on_unhealthy="warn",
        lora=None,
        gradient_checkpointing=False,
        micro_batch_size=None,
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.features = features
        self.alpha = alpha
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.normalize = normalize
        self.normalize_samples = normalize_samples
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length
        self.head_std = head_std
        self.random_state = random_state
        self.verbose = verbose
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.on_unhealthy = on_unhealthy
        self.lora = lora
        self.gradient_checkpointing = gradient_checkpointing
        self.micro_batch_size = micro_batch_size

    def fit(self, X, y=None, *, references=None, callback=None):
        """Fit the reward on comparisons.

        Parameters
        ----------
        X : Comparisons, DataFrame, datasets.Dataset or rows
            Comparisons with ``prompt``, ``chosen`` and ``rejected``, in any format
            :func:`~prefopt.data.check_comparisons` reads (TRL's standard or
            conversational one, a conversation rendered with the tokenizer's chat
            template; or TRL's implicit prompt, the start chosen and rejected share).
        y : None
            Ignored.
        references : demonstrations, default=None
            Language-model reward only: (prompt, completion) rows; the reward is
            shifted so that they score 0 on average.
        callback : callable, Logger or list of them, default=None
            ``callback(reward_model, row)`` after every gradient step, with that
            step's ``history_`` row; returning ``True`` stops the training there
            (the normalisation still runs). A :mod:`prefopt.tracking` logger
            (``TensorBoardLogger(log_dir)``, ...) logs the fit.

        Returns
        -------
        self : RewardModel

        Notes
        -----
        Given a :class:`~prefopt.data.PreferenceData` (inside a ``Pipeline``),
        the comparisons and references come from it, and ``model=None`` starts
        from the policy fitted by the previous step. A second thread fitting the
        same object while this one runs gets a ``RuntimeError`` (fit a clone).
        """
        with one_fit_at_a_time(self):
            self._fit(X, references, callback)
        return self

    def _fit(self, X, references, callback) -> None:
        validate_params(self)
        check_callback(callback)  # a bad one fails before any training
        model = self.model
        if isinstance(X, PreferenceData):  # a step of a Pipeline
            references = X.references if references is None else references
            model = X.policy if model is None else model
            X = X.require("comparisons", "RewardModel")
        data = check_comparisons(X)
        check_lengths(self)
        for attr in ("coef_", "featurizer_", "model_", "tokenizer_"):
            self.__dict__.pop(attr, None)
        # The policy the compared responses came from; a policy fitted against this reward
        # with no model= starts from it (Ouyang et al. 2022: policy and reward model both
        # start from the SFT model).
        self.starting_policy_ = model if model is not None else data.policy
        if model is None:
            _linear.check_no_lm_settings(self.get_params(deep=False))
            with open_run(self, callback):  # parameters only: no gradient steps
                self.featurizer_ = _linear.featurizer_for(self.features, data)
                self.comparison_features_ = _linear.feature_differences(self.featurizer_, data)
                self.coef_ = _linear.bradley_terry_coef(self.comparison_features_, self.alpha)
                self.gain_, self.bias_ = 1.0, 0.0
        else:
            _lm.fit_lm_reward(self, model, data, references, callback=callback)
        self.n_comparisons_ = len(data)

    def partial_fit(self, X, y=None, *, random_state=None):
        """Train the fitted reward further on new comparisons (a warm start).

        What online reward learning calls after labelling the policy's own samples
        (``refit_every`` of the policies; Ziegler et al. 2019). A language-model reward
        takes ``n_epochs`` more passes of the Bradley-Terry loss over ``X`` from its
        current weights (a fresh AdamW, the learning rate decayed linearly to 0), then
        is normalised again on ``fit``'s samples of the starting policy (and shifted to
        its references), so that beta keeps its meaning. A linear reward is refitted
        by maximum likelihood on every comparison it has seen.

        Parameters
        ----------
        X : comparisons
            New comparisons, in any format ``fit`` accepts.
        y : None
            Ignored.
        random_state : int, RandomState instance or None, default=None
            Orders the new comparisons; ``None`` draws from ``random_state``.

        Returns
        -------
        self : RewardModel

        Examples
        --------
        >>> from prefopt import RewardModel
        >>> from prefopt.worlds import PreferenceWorld
        >>> world = PreferenceWorld(random_state=0)
        >>> rm = RewardModel().fit(world.comparisons(100, random_state=0))
        >>> rm.partial_fit(world.comparisons(100, random_state=1)).n_comparisons_
        200
        """
        check_is_fitted(self)
        warn_y_ignored(y, "RewardModel.partial_fit")
        data = check_comparisons(X)
        with one_fit_at_a_time(self):
            if hasattr(self, "coef_"):
                new = _linear.feature_differences(self.featurizer_, data)
                self.comparison_features_ = np.vstack([self.comparison_features_, new])
                self.coef_ = _linear.bradley_terry_coef(self.comparison_features_, self.alpha)
            else:
                rng = check_random_state(
                    self.random_state if random_state is None else random_state
                )
                _lm.refit_lm_reward(self, data, int(rng.randint(np.iinfo(np.int32).max)))
            self.n_comparisons_ += len(data)
        return self

    def predict(self, prompts, completions) -> np.ndarray:
        """Reward of each (prompt, completion) pair.

        Parameters
        ----------
        prompts, completions : list of str
            Equal-length lists; a prompt may be a conversation (a list of
            messages) and a completion one assistant message. A language-model
            reward appends the stop token to each completion (the EOS, or the
            chat template's end of turn), as the policies' finished responses
            end with it.

        Returns
        -------
        rewards : ndarray of shape (n,)
        """
        check_is_fitted(self)
        prompts, completions = check_pairs(prompts, completions, "RewardModel.predict")
        if not prompts:
            return np.zeros(0)
        if hasattr(self, "coef_"):
            return _linear.feature_matrix(self.featurizer_, prompts, completions) @ self.coef_
        return _lm.predict_text(self, prompts, completions)

    def score_tokens(self, prompts, response_ids, response_mask):
        """Rewards of token-id responses, without decoding (what the RL loop calls).

        Equal to :meth:`predict` on the same prompts and the decoded responses:
        the ids get this model's BOS and stop-token rules (a response cut at
        ``max_new_tokens`` ends with the stop token, as its text does in
        ``predict``), whichever tokenizer of the same vocabulary encoded them.

        Parameters
        ----------
        prompts : EncodedPrompts
            Left-padded prompt ids.
        response_ids, response_mask : torch.Tensor of shape (n, length)

        Returns
        -------
        rewards : torch.Tensor of shape (n,)
        """
        check_is_fitted(self)
        rows = _lm.as_text_scores_them(self, *unpad(prompts, response_ids, response_mask))
        return _lm.score_token_rows(self, *rows)

    def __call__(self, prompts, completions) -> np.ndarray:
        return self.predict(prompts, completions)

    def score(self, X, y=None) -> float:
        """Pairwise accuracy: the share of comparisons whose chosen response scores higher.

        Parameters
        ----------
        X : comparisons
        y : None
            Ignored.

        Returns
        -------
        accuracy : float
        """
        warn_y_ignored(y, "RewardModel.score")
        data = check_comparisons(X)
        r_chosen = self.predict(data.prompt, data.chosen)
        r_rejected = self.predict(data.prompt, data.rejected)
        return float(np.mean(r_chosen > r_rejected))

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
        rng = check_random_state(self.random_state if random_state is None else random_state)
        return preference_labels(self.predict, prompts, completions_a, completions_b, rng)

    def save_pretrained(self, directory) -> None:
        """Write the fitted reward as a transformers sequence-classification model.

        ``AutoModelForSequenceClassification`` (``num_labels=1``) and ``AutoTokenizer``
        read the folder back; the classifier's logit is this reward's score (gain, bias
        and reference shift folded into the head and the final norm's bias;
        ``pad_token_id`` set so that it reads the last real token, the EOS). Score
        right-padded rows of prompt + completion + EOS tokens, tokenized apart, as
        :meth:`predict` does (the pad token must differ from the EOS): the folder's
        ``score_reward.py`` does it with transformers alone, and a warning says when
        the tokenizer can merge tokens across the prompt/completion boundary.

        Parameters
        ----------
        directory : str or path
            The folder to write (safetensors weights, config and tokenizer).

        Examples
        --------
        >>> import tempfile
        >>> from transformers import AutoModelForSequenceClassification
        >>> from prefopt import RewardModel
        >>> from prefopt.worlds.tiny_lm import TinyLMWorld
        >>> world = TinyLMWorld(random_state=0)
        >>> prompt, (a, b) = world.prompts[0], world.responses[1:3]
        >>> rm = RewardModel(model=world.policy_model(), normalize=False, random_state=0)
        >>> rm = rm.fit([(prompt, a, b)] * 8)
        >>> folder = tempfile.mkdtemp()
        >>> rm.save_pretrained(folder)
        >>> AutoModelForSequenceClassification.from_pretrained(folder).config.num_labels
        1
        """
        check_is_fitted(self)
        if hasattr(self, "coef_"):
            raise TypeError(
                "save_pretrained writes a language-model reward; this one is linear in "
                "features (model=None). Use save(folder) for it instead."
            )
        directory = check_folder(directory, "save_pretrained's folder")
        model = to_sequence_classifier(self, set(self._stop_ids()))
        save_sequence_classifier(
            model, self.tokenizer_, directory, self._text_end_id(), type(self).__name__
        )

    def __sklearn_is_fitted__(self) -> bool:
        return hasattr(self, "coef_") or hasattr(self, "model_")
