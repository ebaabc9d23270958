"""Shared parameter documentation of the policy estimators (numpydoc fragments)."""

import inspect
import re

COMMON_PARAMETERS = """model : str, transformers config, torch module or fitted policy
        The starting policy, copied before training (``fit`` never mutates it):
        a local path, a config (a fresh model, seeded by ``random_state``), a
        module called like a causal LM, or a fitted :class:`SFTPolicy`.
    tokenizer : str or tokenizer
        ``None`` takes the fitted policy's, the module's ``tokenizer`` attribute
        or the path's. A pad token distinct from EOS is added when missing.
    beta : float
        KL coefficient: the reward is shaped with -beta * log(pi/pi_ref).
    kl : FixedKLController or AdaptiveKLController
        How beta changes; ``None`` keeps it fixed. A controller with
        ``beta=None`` starts from this estimator's ``beta``.
    kl_estimator : {"k1", "k2", "k3"}
        Per-token KL estimator (Schulman 2020); k1 in the reward, as Ziegler et al. 2019.
    learning_rate : float
        ``None`` means {tiny_learning_rate} for models under 10M parameters (tiny
        models built from a config: the class's ``tiny_model_learning_rate``,
        chosen by ``benchmarks/lr_sweep.py``), 0.1 for the exact worlds'
        log-linear policies and 3e-6 otherwise (Huang et al.'s PPO value).
    optimizer : {"adam", "sgd"}
        Adam uses eps=1e-5 and no weight decay, as the original code.
    lr_schedule : {"linear", "constant"}
        "linear" anneals the learning rate to 0 over the run, as the original code.
    max_grad_norm : float
        Clip the gradient norm; ``None`` does not clip (the original code).
    n_steps : int
        Optimisation steps; each samples ``batch_size`` episodes. ``0`` sets the
        starting policy up untrained (the starting row of a comparison).
    batch_size : int
        Episodes (prompt, response pairs) per step.
    n_epochs : int
        Passes over each batch.
    n_minibatches : int
        Gradient steps per pass.
    temperature : float
        Sampling temperature, also applied to every log-prob. ``None`` reads the
        model's generation config, else 0.7 (Ziegler et al. 2019).
    max_new_tokens : int
        Tokens sampled per response (fixed length, truncated after the first
        EOS). ``None`` reads the model's generation config, else 53 (Huang et al. 2024).
    missing_eos_reward : float or None
        A response with no EOS gets this reward, *replacing* its score (the
        EOS trick of Huang et al. 2024; TRL instead subtracts a penalty). ``None`` keeps the score.
    stop_token_ids : int or list of int
        The ids that end a response: sampling stops there, the response is cut
        after the first, and a response without one gets ``missing_eos_reward``.
        ``None`` takes the model's ``generation_config.eos_token_id`` (chat models
        often list several, e.g. an end of turn) and the tokenizer's EOS.
    random_state : int, RandomState instance or None
        Same seed, same CPU run. No global seed is set.
    verbose : int
        ``1`` prints a line (step, reward, KL, losses) every 10 steps and at the
        last, ``2`` every step; no ``logging`` setup needed. Both first print
        the response length (``max_new_tokens_``) and where it came from.
    warm_start : bool
        Continue from the fitted state (model, reference, optimiser, beta,
        history) for ``n_steps`` more steps instead of starting over; a linear
        schedule anneals again over those steps.
    checkpoint_dir : str or path
        Save the run every ``checkpoint_every`` steps (and at the end) to this
        folder, atomically (write, then rename), as JSON and safetensors (no
        pickle). ``fit`` with the same folder, parameters and prompts resumes
        from the checkpoint and ends as the uninterrupted run would, weights
        and ``history_`` included; other parameters (except ``n_steps`` and
        those that only watch the run) or other prompts are refused by name.
        A clone (every candidate and seed of a search) writes to its own
        sub-folder, named from its parameters and prompts.
    checkpoint_every : int
        Steps between checkpoints.
    truncate_prompts : bool
        A prompt longer than the context minus ``max_new_tokens`` raises an
        error; with True it is cut at the last paragraph (else sentence)
        boundary that fits, keeping its beginning, as Huang et al. 2024 do.
        Put any instruction that must survive at the start.
    max_kl : float
        A step whose mean KL to the reference exceeds this warns or stops the
        run (``max_kl_action``); the last checkpoint stays intact.
    max_kl_action : {"warn", "raise"}
    min_eos_share : float or None
        Warn when fewer responses than this end with EOS: the fixed
        ``missing_eos_reward`` then dominates the reward.
    on_unhealthy : {"warn", "raise", "stop", "ignore"}
        What a run-health detector that fires does: warn (one
        :class:`~prefopt.exceptions.RunHealthWarning` per detector per fit),
        raise :class:`~prefopt.exceptions.RunHealthError`, warn and stop the
        run after that step, or only record it in ``health_``. The detectors
        and their default thresholds: ``reward_collapse`` (the smoothed reward
        falls below the first step's mean by more than half its
        per-episode spread), ``empty_responses`` (the smoothed share of empty
        responses above 0.8), ``repetitive_responses`` (over half a response's trigrams
        repeated, on average), ``kl_blowup`` (the smoothed KL per response
        token above 2 nats), ``dead_groups`` (k > 1: over 90% of groups with equal scores
        while the reward has not risen), ``non_finite`` (a nan or inf in the
        step's row) and ``no_learning`` (at the end: the log-probs never moved
        1e-4 nats a token from the reference's).
    entropy_coef : float
        Weight of an entropy bonus in the policy loss: minus this times the
        policy's mean per-token entropy on the minibatch's responses (at the
        training temperature, with gradients) is added to any algorithm's loss.
        Without a KL penalty it is reported not to prevent degeneration.
    ptx_coef : float
        Weight of a next-token loss on pretraining text (``fit(...,
        ptx_data=texts)``) added to the policy loss, as InstructGPT's PPO-ptx
        (Ouyang et al. 2022), against the alignment tax: each update minibatch
        adds this times the mean cross-entropy of as many texts, drawn at
        random, tokenised once per fit and cut to the model's context.
    refit_every : int
        Online reward learning (Ziegler et al. 2019): every this many steps,
        the step's samples of each prompt are paired ((0, 1), (2, 3), ... of
        its k; at k = 1 a second sample is drawn), labelled by ``fit(...,
        labeler=...)`` (pairs of equal text dropped), and a copy of the
        current reward is trained further on them (its ``partial_fit``: a
        warm start, then normalised again on the starting policy's samples,
        so beta keeps its meaning). The reward passed to ``fit`` is never
        changed; ``reward_model_`` is the last refit, and ``history_`` logs
        ``reward/refits``, ``reward/new_labels`` and the accuracy of the
        reward before each refit on its new labels. ``None`` keeps the
        reward fixed (offline, the default).
    lora : dict or peft.LoraConfig
        Train a LoRA adapter (peft) instead of all weights, e.g.
        ``{"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}``. The
        reference is then the frozen base with the adapter disabled, so its
        weights are not copied.
    gradient_checkpointing : bool
        Recompute each transformer layer's activations in the backward pass
        instead of keeping them (transformers' gradient checkpointing,
        non-reentrant), in the policy and in a transformers value model: less
        memory for about one more forward pass per minibatch, the same
        gradients. Sampling (with its KV cache) and the passes without
        gradients are unchanged. A model that comes with it on keeps it on.
    reward_weights : list of float or None
        With a list of rewards (``fit(prompts, [r1, r2])``): one finite
        weight >= 0 per reward; the score is the weighted sum, and
        ``history_`` logs each reward's ``rewards/<name>/mean`` and
        ``rewards/<name>/std``. ``None`` weighs each reward 1 (TRL's
        ``reward_weights``).
    vllm_importance_sampling_cap : float or None
        With ``set_config(generation="vllm")``: truncated importance sampling
        (Yao et al. 2025; TRL's ``vllm_importance_sampling_cap``, whose
        default is 2.0) against the gap between the engine that samples and
        the policy that learns (another kernel or precision). Each response
        token's gradient through the current log-probs is multiplied by
        ``min(exp(old_logprob - engine_logprob), cap)``, detached, the old
        log-prob being the policy's at sampling time; the loss values logged
        are unchanged, and ``history_`` gains ``engine/is_weight_mean`` and
        ``engine/is_truncated_share``. The weights reach every term of the
        algorithm's loss that reads the log-probs (GRPO's KL term too), not
        the entropy bonus or the pretraining loss. The native sampler samples
        from the policy itself, where every weight is exactly 1: the
        parameter then changes nothing. ``None`` applies no correction; the
        gap (``engine/logprob_gap_mean``, ``engine/logprob_gap_max``,
        ``engine/kl``) is logged under the engine either way."""

COMMON_ATTRIBUTES = """model_ : torch.nn.Module
        The trained policy.
    ref_model_ : torch.nn.Module or None
        The frozen reference (the starting policy), made once per fit; None
        with ``lora``, where the reference is the base with the adapter off.
    tokenizer_ : tokenizer
        With a pad token distinct from EOS.
    reward_model_ : callable
        The reward given to ``fit`` (a list of them as one
        :class:`~prefopt.rewards.WeightedRewards`); ``score`` uses it.
    kl_ : KL controller
        The fitted controller.
    beta_ : float
        The current KL coefficient (after the last step's controller update).
    temperature_, max_new_tokens_ : float, int
        Resolved sampling settings.
    stop_token_ids_ : list of int
        The ids that end a response.
    n_iter_, n_episodes_ : int
        Steps and episodes done.
    budget_ : dict
        What the run has spent so far: ``episodes`` sampled, response ``tokens``
        generated, ``gradient_steps`` (optimiser steps) and ``seconds`` (wall
        clock of the steps): the last row's ``budget/...`` and ``time/elapsed``
        columns of ``history_``.
    history_ : list of dict
        One row per step with namespaced keys (``objective/reward``,
        ``objective/kl``, ``objective/beta``, ``loss/policy``, ``policy/entropy``,
        ``response/length``, ``response/eos_share``, ``time/episodes_per_s``,
        the cumulative ``budget/episodes``, ``budget/tokens``,
        ``budget/gradient_steps`` and ``time/elapsed`` (seconds),
        the seconds of the step's phases ``time/generation``, ``time/logprobs``
        (old, reference and value passes), ``time/reward``, ``time/update``...;
        ``loss/entropy_bonus``, entropy_coef times the mean entropy subtracted
        from the loss, when ``entropy_coef > 0``; ``loss/ptx``, the pretraining
        cross-entropy before ``ptx_coef``, when ``ptx_coef > 0``);
        ``pandas.DataFrame(history_)`` makes a table. Each row also has the
        columns the run-health detectors read (``objective/reward_std``,
        ``response/empty_share``, ``response/distinct_tokens``,
        ``response/repeated_ngrams``, ``policy/logprob_shift`` (without a
        reference pass ``model/weight_change`` instead) and, for k > 1,
        ``objective/dead_group_share``) and a ``health/<detector>`` column each.
        Sampled by an engine (``set_config(generation="vllm")``), a row also has
        ``engine/logprob_gap_mean``, ``engine/logprob_gap_max`` and ``engine/kl``
        (see ``vllm_importance_sampling_cap``).
    health_ : dict
        The run's health: ``healthy`` (bool) and ``detectors``, by name,
        each with ``fired`` (bool), ``first_step`` (int or None), ``value``
        (its last reading, float) and ``threshold`` (float); see ``on_unhealthy``."""


def fill(cls) -> str:
    r"""``cls``'s docstring with the shared fragments and every default from its signature.

    ``{common_parameters}`` and ``{common_attributes}`` in the docstring are
    replaced by the shared entries (an entry the class documents itself, such
    as GRPO's ``beta``, replaces the shared one of that name). Every entry of
    the Parameters section gets ``default=`` from ``inspect.signature`` of
    ``cls.__init__``; a default written by hand must agree with it. The
    entries are then put in signature order.

    Parameters
    ----------
    cls : type
        An estimator class whose docstring holds both placeholders.

    Returns
    -------
    doc : str

    Examples
    --------
    >>> class Toy:
    ...     def __init__(self, *, n_steps=3, beta=0.5):
    ...         pass
    >>> Toy.__doc__ = "\n    ".join(["A toy.", "", "Parameters", "----------",
    ...     "{common_parameters}", "", "Attributes", "----------", "{common_attributes}", ""])
    >>> doc = fill(Toy)
    >>> "n_steps : int, default=3" in doc and "beta : float, default=0.5" in doc
    True
    >>> doc.index("n_steps :") < doc.index("beta :") and "{" + "common" not in doc
    True
    """
    doc = cls.__doc__
    for placeholder in ("{common_parameters}", "{common_attributes}"):
        if placeholder not in doc:
            raise ValueError(f"{cls.__name__}'s docstring has no {placeholder}.")
    signature = inspect.signature(cls.__init__).parameters
    own = _entries(doc)
    shared = {k: v for k, v in _entries("    " + COMMON_PARAMETERS).items() if k not in own}
    shared_text = "\n".join(line for entry in shared.values() for line in entry).strip()
    tiny = getattr(cls, "tiny_model_learning_rate", 1e-3)
    shared_text = shared_text.replace("{tiny_learning_rate}", f"{tiny:g}")
    doc = doc.replace("{common_parameters}", shared_text)
    doc = doc.replace("{common_attributes}", COMMON_ATTRIBUTES)
    return _in_signature_order(doc, signature, cls.__name__)


def _default(value) -> str:
    """A default as numpydoc writes it: strings in double quotes, the rest as ``repr``."""
    return f'"{value}"' if isinstance(value, str) else repr(value)


def _entries(section: str) -> dict:
    """The ``name : type`` entries of a docstring's Parameters section, by name."""
    lines = section.split("\n")
    if "    Parameters" in lines:
        start = lines.index("    Parameters") + 2
        end = next(
            i
            for i in range(start, len(lines))
            if lines[i].strip() and lines[i + 1].strip().startswith("---")
        )
        lines = lines[start:end]
    entries, current = {}, None
    for line in lines:
        match = re.match(r"^    (\w+)(,\s*\w+)* :", line)
        if match:
            current = match.group(1)
            entries[current] = []
        if current is not None:
            entries[current].append(line)
    for entry in entries.values():
        while entry and not entry[-1].strip():
            entry.pop()
    return entries


def _with_default(entry: list, parameter, who: str) -> list:
    """The entry with ``default=`` from the signature (a hand-written one checked)."""
    if parameter is None or parameter.default is inspect.Parameter.empty:
        return entry
    want = _default(parameter.default)
    header = entry[0]
    match = re.search(r", default=(.*)$", header)
    if match is None:
        return [f"{header}, default={want}", *entry[1:]]
    if match.group(1) != want:
        raise ValueError(
            f"{who}'s docstring says {parameter.name} has default={match.group(1)}, but its "
            f"signature has {want}; drop the default from the docstring (fill adds it)."
        )
    return entry


def _in_signature_order(doc: str, signature, who: str) -> str:
    """Defaults from ``signature`` into the Parameters section, entries in its order."""
    lines = doc.split("\n")
    start = lines.index("    Parameters") + 2
    end = next(
        i
        for i in range(start, len(lines))
        if lines[i].strip() and lines[i + 1].strip().startswith("---")
    )
    entries = _entries("\n".join(lines))
    names = [n for n in signature if n != "self"]
    order = sorted(entries, key=lambda n: names.index(n) if n in names else len(names))
    body = [
        line for name in order for line in _with_default(entries[name], signature.get(name), who)
    ]
    return "\n".join(lines[:start] + body + [""] + lines[end:])
