"""Direct preference optimisation: the policy fitted on comparisons, with no reward model.

Rafailov et al. (2023) invert the KL-regularised optimum
pi*(y|x) = pi_ref(y|x) exp(r(x, y)/beta) / Z(x) into
r(x, y) = beta log(pi*(y|x)/pi_ref(y|x)) + beta log Z(x); put into the
Bradley-Terry likelihood of the comparisons, Z cancels and the policy itself is
fitted by logistic regression on the margin of its implicit rewards. IPO (Azar
et al. 2023) regresses that margin on 1/(2 beta) instead.
"""

from __future__ import annotations

from numbers import Real

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from torch import nn

from .._config import get_config
from ..backend import (
    EncodedPrompts,
    default_learning_rate,
    distributed,
    local_seed,
    make_generator,
    pad_left,
    pad_right,
    response_logprobs,
)
from ..data import PreferenceData, check_comparisons
from ..lm import GenerativeStep, check_lengths, too_long_error, truncate_rows
from ..lm import checkpoint as ckpt
from ..lm.supervised import (
    SUPERVISED_CONSTRAINTS,
    SupervisedLoop,
    SupervisedView,
    warn_y_ignored,
)
from ..tracking import check_callback
from ..validation import Interval, StrOptions, validate_params

__all__ = ["DPOPolicy"]


class DPOPolicy(GenerativeStep):
    """Direct preference optimisation of a causal LM on comparisons, against a frozen reference.

    With h = [log pi(c|x) - log pi_ref(c|x)] - [log pi(r|x) - log pi_ref(r|x)]
    for a chosen response c and a rejected one r (sums of token log-probs at
    temperature 1), the loss of a comparison is ``-log sigmoid(beta * h)``
    (``loss="sigmoid"``, Rafailov et al. 2023, eq. 7) or
    ``(h - 1 / (2 * beta))**2`` (``loss="ipo"``, Azar et al. 2023, eq. 17).
    The reference is the starting model, frozen; its log-probs of every
    comparison are computed once, without gradients, before training (TRL's
    ``precompute_ref_log_probs``). Training uses the supervised loop that
    :class:`SFTPolicy` and :class:`RewardModel` use.

    The fitted policy is a policy like the others: ``sample``, ``predict`` and
    ``log_prob``. Its :meth:`implicit_reward` is beta * log(pi/pi_ref), and
    :meth:`score` is the pairwise accuracy of that reward on comparisons, the
    same measure as :meth:`RewardModel.score`.

    Parameters
    ----------
    model : str, transformers config, torch module or fitted SFTPolicy, default=None
        The starting model and reference (copied; ``fit`` never mutates it).
        ``None`` starts from the policy the comparisons carry (a world's
        comparisons carry its reference policy), or in a ``Pipeline`` from the
        policy fitted by the step before.
    tokenizer : str or tokenizer, default=None
        ``None`` takes it from the model. A pad token distinct from EOS is added
        when missing.
    beta : float, default=0.1
        Strength of the implicit KL penalty (the DPO paper's and TRL's 0.1).
    loss : {"sigmoid", "ipo"}, default="sigmoid"
        The Bradley-Terry loss of DPO, or IPO's squared loss.
    learning_rate : float, default=None
        ``None`` means 0.1 for the exact worlds' log-linear policies, 1e-3 for
        models under 10M parameters and 1e-6 otherwise (the DPO paper's and
        TRL's value).
    n_epochs : int, default=3
        Passes over the comparisons (TRL's and the transformers Trainer's
        default). Measured on the preference world (1,000 comparisons, seeds
        0-2, defaults otherwise): one pass reaches 0.77 of the achievable
        objective of a reward model fitted on the same comparisons, three
        passes 0.92-0.97 at beta 0.1 and 0.3.
    batch_size : int, default=64
        Comparisons per gradient step (the DPO paper's 64).
    lr_schedule : {"linear", "cosine", "constant"}, default="linear"
        Decay to 0 over the run (linear, as TRL's default).
    temperature : float, default=None
        Sampling temperature of :meth:`sample`; ``None`` reads the model's
        generation config, else 0.7. Training and :meth:`implicit_reward` use
        temperature 1, the model's own distribution.
    max_new_tokens : int, default=None
        Tokens sampled per response; ``None`` reads the model's generation
        config, else 53.
    stop_token_ids : int or list of int, default=None
        The ids that end a response (in sampling, and the one appended to each
        chosen and rejected text). ``None`` takes the model's
        ``generation_config.eos_token_id`` and the tokenizer's EOS.
    max_length : int, default=None
        Most tokens of a prompt and response together (TRL's ``max_length``),
        in training and in :meth:`log_prob`, :meth:`implicit_reward` and
        :meth:`score`: a longer chosen or rejected response is cut from the
        right, keeping its start, after the prompt is cut to
        ``max_prompt_length``. A response cut there loses its stop token, so
        its log-probability leaves out the end of the response (as in TRL).
        ``None`` cuts nothing, and a comparison longer than the model's
        context is an error.
    max_prompt_length : int, default=None
        Most tokens of a prompt (TRL's ``max_prompt_length``): a longer one is
        cut from the left, keeping its end (next to the responses) and the
        tokenizer's BOS in front. ``None`` keeps whole prompts.
    lora : dict or peft.LoraConfig, default=None
        Train a LoRA adapter only; the reference is then the base model with the
        adapter disabled, with no second copy of the weights.
    gradient_checkpointing : bool, default=False
        As :class:`~prefopt.SFTPolicy`'s: recompute the activations in the
        backward pass, for less memory and the same gradients.
    micro_batch_size : int, default=None
        Run each minibatch's passes on at most this many comparisons at a time
        and step once on the accumulated gradient; the loss stays the mean over
        the whole minibatch. ``None``: all at once. Not in a distributed fit.
    random_state : int, RandomState instance or None, default=None
        Seeds a model built from a config, the adapter, the order of the
        comparisons and :meth:`sample`.
    verbose : int, default=0
        ``1`` prints a line (step, loss, reward margin) every 10 steps and at
        the last, ``2`` every step; no ``logging`` setup needed.
    checkpoint_dir : str or path, default=None
        Save the fit every ``checkpoint_every`` steps and at the end (JSON and
        safetensors, no pickle); ``fit`` with the same folder, parameters and
        comparisons resumes from it, as :class:`SFTPolicy` does.
    checkpoint_every : int, default=100
        Gradient steps between checkpoints.
    on_unhealthy : {"warn", "raise", "stop", "ignore"}, default="warn"
        What a run-health detector that fires does (``non_finite``: a nan or
        inf in a step's row; ``loss_blowup``: the smoothed loss above twice
        the first step's; ``no_learning``: the trained weights
        moved less than 1e-6 of their norm at every step): warn once per
        detector with :class:`~prefopt.exceptions.RunHealthWarning`, raise
        :class:`~prefopt.exceptions.RunHealthError`, warn and stop the fit, or
        only record it in ``health_`` and the ``health/`` columns of ``history_``.

    Attributes
    ----------
    model_ : torch.nn.Module
        The trained policy.
    ref_model_ : torch.nn.Module or None
        The frozen reference (``None`` with ``lora``: the adapter is switched off).
    tokenizer_ : tokenizer
    learning_rate_ : float
    temperature_, max_new_tokens_ : float, int
    stop_token_ids_ : list of int
        The ids that end a response.
    n_iter_ : int
        Gradient steps done.
    n_comparisons_ : int
        Comparisons in ``fit``.
    history_ : list of dict
        Per step, as TRL logs them: ``loss/dpo``; ``rewards/chosen`` and
        ``rewards/rejected`` (mean implicit reward beta * log(pi/pi_ref));
        ``rewards/accuracy`` (share of comparisons whose chosen reward is the
        larger, ties counting as wrong); ``rewards/margin`` (mean chosen minus
        rejected reward); ``logps/chosen`` and ``logps/rejected``;
        ``charts/learning_rate`` and ``time/step_s``.
    health_ : dict
        The run's health: ``healthy`` (bool) and ``detectors``, by name,
        each with ``fired`` (bool), ``first_step`` (int or None), ``value``
        (its last reading, float) and ``threshold`` (float); see ``on_unhealthy``.

    See Also
    --------
    RewardModel : The Bradley-Terry reward whose closed-form optimum DPO reaches.
    SFTPolicy : The usual starting model.

    Notes
    -----
    On the exact preference world, where the policy is log-linear in the
    features that a linear :class:`RewardModel` uses, the DPO loss is the
    reward model's logistic loss with weights beta * theta, so DPO lands on
    pi_ref exp(r/beta)/Z of the reward model fitted on the same comparisons
    (``tests/test_dpo.py`` measures it). That reward is on the Bradley-Terry
    scale: a reward normalised to r' = g r + b has the same optimum at beta * g.

    TRL's IPO averages token log-probs over each response; this IPO sums them,
    as the paper's h does (the two agree for one-token responses).

    References
    ----------
    R. Rafailov et al., "Direct preference optimization: your language model is
    secretly a reward model", NeurIPS 2023.
    M. G. Azar et al., "A general theoretical paradigm to understand learning
    from human preferences", 2023 (IPO).

    Examples
    --------
    >>> import prefopt
    >>> from prefopt import DPOPolicy, RewardModel
    >>> from prefopt.worlds import PreferenceWorld
    >>> prefopt.set_config(show_progress_bar=False)
    >>> world = PreferenceWorld(random_state=0)
    >>> train = world.comparisons(2000, random_state=0)  # they carry the starting policy
    >>> dpo = DPOPolicy(beta=0.3, n_epochs=100, batch_size=2000, learning_rate=1.0,
    ...                 random_state=0).fit(train)
    >>> rm = RewardModel().fit(train)  # the same comparisons
    >>> held_out = world.comparisons(500, random_state=1)
    >>> dpo.score(held_out), rm.score(held_out)  # pairwise accuracy of each reward
    (0.808, 0.808)
    >>> gap = world.policy_probs(dpo) - world.optimal_probs(rm, beta=0.3)  # exact, enumerated
    >>> bool(abs(gap).max() < 0.01)  # DPO's policy is the reward model's RLHF optimum
    True
    """

    tiny_model_learning_rate = 1e-3  # learning_rate=None on a tiny model (LR_SWEEP.md)
    _parameter_constraints = {
        **SUPERVISED_CONSTRAINTS,
        "beta": [Interval(Real, 0, None, closed="neither")],
        "loss": [StrOptions({"sigmoid", "ipo"})],
        "lr_schedule": [StrOptions({"cosine", "linear", "constant"})],
    }

    def __init__(
        self,
        *,
        model=None,
        tokenizer=None,
        beta=0.1,
        loss="sigmoid",
        learning_rate=None,
        n_epochs=3,
        batch_size=64,
        lr_schedule="linear",
        temperature=None,
        max_new_tokens=None,
        stop_token_ids=None,
        max_length=None,
        max_prompt_length=None,
        lora=None,
        gradient_checkpointing=False,
        micro_batch_size=None,
        random_state=None,
        verbose=0,
        checkpoint_dir=None,
        checkpoint_every=100,
        on_unhealthy="warn",
    ):
        self.model = model
        self.tokenizer = tokenizer
        self.beta = beta
        self.loss = loss
        self.learning_rate = learning_rate
        self.n_epochs = n_epochs
        self.batch_size = batch_size
        self.lr_schedule = lr_schedule
        self.temperature = temperature
        self.max_new_tokens = max_new_tokens
        self.stop_token_ids = stop_token_ids
        self.max_length = max_length
        self.max_prompt_length = max_prompt_length
        self.lora = lora
        self.gradient_checkpointing = gradient_checkpointing
        self.micro_batch_size = micro_batch_size
        self.random_state = random_state
        self.verbose = verbose
        self.checkpoint_dir = checkpoint_dir
        self.checkpoint_every = checkpoint_every
        self.on_unhealthy = on_unhealthy

    def fit(self, X, y=None, *, callback=None):
        """Fit the policy on comparisons.

        Parameters
        ----------
        X : Comparisons, DataFrame, datasets.Dataset, rows or PreferenceData
            Comparisons with ``prompt``, ``chosen`` and ``rejected``, in TRL's
            standard or conversational format (a response may be several
            messages, which the chat template renders after the prompt).
            Without a ``prompt`` column, ``chosen`` and ``rejected`` are whole
            texts or conversations and the start they share is the prompt
            (TRL's implicit prompt). In a ``Pipeline``, a
            :class:`~prefopt.data.PreferenceData`: its comparisons, and with
            ``model=None`` the policy fitted by the step before (an SFT model).
        y : None
            Ignored.
        callback : callable, Logger or list of them, default=None
            ``callback(policy, row)`` after every gradient step, with that
            step's ``history_`` row; returning ``True`` stops the fit. A
            :mod:`prefopt.tracking` logger logs the fit and is closed with it.

        Returns
        -------
        self : DPOPolicy
        """
        validate_params(self)
        check_callback(callback)
        start = self.model
        if isinstance(X, PreferenceData):  # a step of a Pipeline
            start = X.policy if start is None else start
            X = X.require("comparisons", "DPOPolicy")
        data = check_comparisons(X)
        check_lengths(self)
        start = _starting_model(data.policy if start is None else start)
        rng = check_random_state(self.random_state)
        seeds = rng.randint(np.iinfo(np.int32).max, size=3)
        self._init_model(start, self.tokenizer, seed=int(seeds[0]))
        self.history_, self.n_iter_ = [], 0
        self.n_comparisons_ = len(data)
        tiny, rate = self.tiny_model_learning_rate, self.learning_rate
        self.learning_rate_ = (
            float(rate)
            if rate is not None
            else default_learning_rate(self.model_, large=1e-6, tiny=tiny)
        )
        prompts = self._tokenize_prompts(data.prompt, check_length=False)
        chosen = self._completion_tokens(data.chosen, True, "chosen response", data.prompt)
        rejected = self._completion_tokens(data.rejected, True, "rejected response", data.prompt)
        prompts, (chosen, rejected) = truncate_rows(self, prompts, [chosen, rejected], "Comparison")
        self._check_rows(data, prompts, chosen, rejected)
        self._check_max_new_tokens(self.model_, given_only=True)  # fit never samples
        model_key = ckpt.module_fingerprint(self.model_) if self.checkpoint_dir else None
        with local_seed(int(seeds[1])):  # a LoRA adapter's initial weights
            self._setup_reference()
        # Padded once on the CPU; a minibatch takes its rows to the device. Response row i
        # is the chosen response of comparison i, row n + i the rejected one.
        n = len(data)
        prompt_rows = pad_left(prompts, self.tokenizer_.pad_token_id)
        response_rows = pad_right(chosen + rejected, self.tokenizer_.pad_token_id)
        with torch.no_grad(), self._reference() as ref:  # once, before training
            ref_logps = self._logps(ref, prompt_rows, response_rows, torch.arange(n))

        def batch_loss(model, rows):  # model: what training passes go through (DDP's wrapper)
            # Chosen and rejected go through one forward pass together.
            rows = torch.as_tensor(rows)
            logps = self._logps(model, prompt_rows, response_rows, rows)
            logp_c, logp_r = logps[: len(rows)], logps[len(rows) :]
            rows = rows.to(ref_logps.device)
            ratio_c = logp_c - ref_logps[rows]  # log pi/pi_ref of the chosen responses
            ratio_r = logp_r - ref_logps[rows + n]
            h = ratio_c - ratio_r
            if self.loss == "ipo":  # Azar et al. 2023, eq. 17
                loss = distributed.mean((h - 1.0 / (2.0 * self.beta)) ** 2, across_ranks=True)
            else:  # Rafailov et al. 2023, eq. 7
                loss = -distributed.mean(F.logsigmoid(self.beta * h), across_ranks=True)
            r_c, r_r = self.beta * ratio_c.detach(), self.beta * ratio_r.detach()
            return loss, {
                "loss/dpo": loss.item(),
                "rewards/chosen": r_c.mean().item(),
                "rewards/rejected": r_r.mean().item(),
                "rewards/accuracy": (r_c > r_r).float().mean().item(),
                "rewards/margin": (r_c - r_r).mean().item(),
                "logps/chosen": logp_c.detach().mean().item(),
                "logps/rejected": logp_r.detach().mean().item(),
            }

        data_key = ckpt.fingerprint([data.prompt, data.chosen, data.rejected])
        with ckpt.resumable(self, data_key) as resume:
            view = SupervisedView.of(self, name="DPOPolicy", schedule=self.lr_schedule)
            loop = SupervisedLoop(self, view, len(data), batch_loss,
                                  parameters=self.model_.parameters(),
                                  generator=make_generator(int(seeds[2])), resume=resume,
                                  model_key=model_key)  # fmt: skip
            loop.train(callback, record=self._record_supervised)
        return self

    def _check_rows(self, data, prompts, chosen, rejected) -> None:
        """Refuse a pair longer than the context, or whose two responses tokenize alike."""
        for i, (p, c, r) in enumerate(zip(prompts, chosen, rejected)):
            error = too_long_error(self, "Comparison", i, len(p) + max(len(c), len(r)))
            if error is not None:
                raise error
            if c == r:  # h is 0 whatever the policy: the pair carries no preference
                cut = "" if self.max_length is None else f" within max_length={self.max_length}"
                raise ValueError(
                    f"Comparisons: chosen and rejected tokenize identically{cut} at row {i} "
                    f"({data.chosen[i]!r} and {data.rejected[i]!r}); drop the row"
                    f"{' or raise max_length' if cut else ''}."
                )

    def _logps(self, model, prompt_rows, response_rows, pairs) -> torch.Tensor:
        """Log-probs at temperature 1 of the chosen, then the rejected, responses of ``pairs``.

        Batched without gradients, else one pass; a batch drops padding none of it needs.
        """
        n = len(prompt_rows.input_ids)
        rows = torch.cat([pairs, pairs + n])
        size = len(rows) if torch.is_grad_enabled() else get_config()["eval_batch_size"]
        out = []
        for start in range(0, len(rows), size):
            batch = rows[start : start + size]
            p_ids = prompt_rows.input_ids[batch % n]
            p_mask = prompt_rows.attention_mask[batch % n]
            first = int(p_mask.any(0).long().argmax())  # left-padded: keep the right part
            r_ids, r_mask = response_rows[0][batch], response_rows[1][batch]
            width = max(int(r_mask.sum(1).max()), 1)  # right-padded: keep the left part
            device = self.device_
            logprobs = response_logprobs(
                model,
                EncodedPrompts(p_ids[:, first:].to(device), p_mask[:, first:].to(device)),
                r_ids[:, :width].to(device),
                r_mask[:, :width].to(device),
                temperature=1.0,
                suppress_ids=self._suppress_ids,
            )
            out.append(logprobs.sum(1))
        return torch.cat(out)

    def implicit_reward(self, prompts, completions) -> np.ndarray:
        """DPO's implicit reward beta * log(pi(y|x) / pi_ref(y|x)).

        Rafailov et al. (2023, eq. 5) without the term beta * log Z(x), which is
        the same for every response to a prompt, so comparisons of responses to
        one prompt are those of the reward whose optimum the policy is.

        Parameters
        ----------
        prompts : list of str or of conversations
            One prompt per completion.
        completions : list of str or list of list of int
            Text (or one assistant message), or token ids; text gets its stop
            token appended, as in training.

        Returns
        -------
        rewards : ndarray of shape (n,)
            Sequence log-probs at temperature 1, so the policy trained, not the
            one sampled at ``temperature_``.
        """
        check_is_fitted(self)
        policy = self.log_prob(prompts, completions, temperature=1.0)
        reference = self.log_prob(prompts, completions, reference=True, temperature=1.0)
        return self.beta * (policy - reference)

    def score(self, X, y=None) -> float:
        """Pairwise accuracy of the implicit reward: the share of comparisons it gets right.

        The same measure as :meth:`RewardModel.score`: a comparison counts when
        the chosen response's implicit reward is strictly larger (a tie counts
        as wrong), so the two can be set side by side on held-out comparisons.

        Parameters
        ----------
        X : comparisons
            As :meth:`fit` takes them.
        y : None
            Ignored.

        Returns
        -------
        accuracy : float
        """
        check_is_fitted(self)
        warn_y_ignored(y, "DPOPolicy.score")
        if isinstance(X, PreferenceData):
            X = X.require("comparisons", "DPOPolicy.score")
        data = check_comparisons(X)
        r_chosen = self.implicit_reward(data.prompt, data.chosen)
        r_rejected = self.implicit_reward(data.prompt, data.rejected)
        return float(np.mean(r_chosen > r_rejected))


def _starting_model(start):
    """The starting model; a factory of fresh copies (a world's ``policy_model``) is called."""
    if start is None:
        raise ValueError(
            "DPOPolicy.fit has no starting model: pass model= (a path, a transformers config, a "
            "torch module or a fitted SFTPolicy), or comparisons carrying their policy."
        )
    factory = callable(start) and not isinstance(start, nn.Module) and not hasattr(start, "fit")
    return start() if factory else start
