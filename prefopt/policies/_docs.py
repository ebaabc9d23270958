"""Shared parameter documentation of the policy estimators (numpydoc fragments)."""

import inspect
import re

COMMON_PARAMETERS = """model : str, transformers config, torch module or fitted policy, default=None
        The starting policy, copied before training (``fit`` never mutates it):
        a local path, a config (a fresh model, seeded by ``random_state``), a
        module called like a causal LM, or a fitted :class:`SFTPolicy`.
    tokenizer : str or tokenizer, default=None
        ``None`` takes the fitted policy's, the module's ``tokenizer`` attribute
        or the path's. A pad token distinct from EOS is added when missing.
    beta : float, default={beta}
        KL coefficient: the reward is shaped with -beta * log(pi/pi_ref).
    kl : FixedKLController or AdaptiveKLController, default=None
        How beta changes; ``None`` keeps it fixed. A controller with
        ``beta=None`` starts from this estimator's ``beta``.
    kl_estimator : {{"k1", "k2", "k3"}}, default="k1"
        Per-token KL estimator (Schulman 2020); k1 in the reward, as Ziegler et al. 2019.
    learning_rate : float, default=None
        ``None`` means 1e-3 for models under 10M parameters (tiny models built
        from a config) and 3e-6 otherwise (Huang et al.'s PPO value).
    optimizer : {{"adam", "sgd"}}, default="adam"
        Adam uses eps=1e-5 and no weight decay, as the original code.
    lr_schedule : {{"linear", "constant"}}, default="linear"
        "linear" anneals the learning rate to 0 over the run, as the original code.
    max_grad_norm : float, default=None
        Clip the gradient norm; ``None`` does not clip (the original code).
    n_steps : int, default=100
        Optimisation steps; each samples ``batch_size`` episodes.
    batch_size : int, default=64
        Episodes (prompt, response pairs) per step.
    n_epochs : int, default={n_epochs}
        Passes over each batch.
    n_minibatches : int, default={n_minibatches}
        Gradient steps per pass.
    temperature : float, default=None
        Sampling temperature, also applied to every log-prob. ``None`` reads the
        model's generation config, else 0.7 (Ziegler et al. 2019).
    max_new_tokens : int, default=None
        Tokens sampled per response (fixed length, truncated after the first
        EOS). ``None`` reads the model's generation config, else 53 (Huang et al. 2024).
    missing_eos_reward : float or None, default=-1.0
        A response with no EOS gets this reward, *replacing* its score (the
        EOS trick of Huang et al. 2024; TRL instead subtracts a penalty). ``None`` keeps the score.
    stop_token_ids : int or list of int, default=None
        The ids that end a response: sampling stops there, the response is cut
        after the first, and a response without one gets ``missing_eos_reward``.
        ``None`` takes the model's ``generation_config.eos_token_id`` (chat models
        often list several, e.g. an end of turn) and the tokenizer's EOS.
    random_state : int, RandomState instance or None, default=None
        Same seed, same CPU run. No global seed is set.
    verbose : int, default=0
        Log a line every 10 steps through the ``prefopt`` logger.
    warm_start : bool, default=False
        Continue from the fitted state (model, reference, optimiser, beta,
        history) for ``n_steps`` more steps instead of starting over; a linear
        schedule anneals again over those steps.
    checkpoint_dir : str or path, default=None
        Save the run every ``checkpoint_every`` steps (and at the end) to this
        folder, atomically (write, then rename), as JSON and safetensors (no
        pickle). ``fit`` with the same folder, parameters and prompts resumes
        from the checkpoint and ends as the uninterrupted run would, weights
        and ``history_`` included; other parameters (except ``n_steps`` and
        those that only watch the run) or other prompts are refused by name.
        A clone (every candidate and seed of a search) writes to its own
        sub-folder, named from its parameters and prompts.
    checkpoint_every : int, default=10
        Steps between checkpoints.
    truncate_prompts : bool, default=False
        A prompt longer than the context minus ``max_new_tokens`` raises an
        error; with True it is cut at the last paragraph (else sentence)
        boundary that fits, keeping its beginning, as Huang et al. 2024 do.
        Put any instruction that must survive at the start.
    max_kl : float, default=None
        A step whose mean KL to the reference exceeds this warns or stops the
        run (``max_kl_action``); the last checkpoint stays intact.
    max_kl_action : {{"warn", "raise"}}, default="warn"
    min_eos_share : float or None, default=0.5
        Warn when fewer responses than this end with EOS: the fixed
        ``missing_eos_reward`` then dominates the reward.
    entropy_coef : float, default=0.0
        Weight of an entropy bonus in the policy loss: minus this times the
        policy's mean per-token entropy on the minibatch's responses (at the
        training temperature, with gradients) is added to any algorithm's loss.
        Without a KL penalty it is reported not to prevent degeneration.
    ptx_coef : float, default=0.0
        Weight of a next-token loss on pretraining text (``fit(...,
        ptx_data=texts)``) added to the policy loss, as InstructGPT's PPO-ptx
        (Ouyang et al. 2022), against the alignment tax: each update minibatch
        adds this times the mean cross-entropy of as many texts, drawn at
        random, tokenised once per fit and cut to the model's context.
    refit_every : int, default=None
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
    lora : dict or peft.LoraConfig, default=None
        Train a LoRA adapter (peft) instead of all weights, e.g.
        ``{{"r": 8, "lora_alpha": 16, "target_modules": ["c_attn"]}}``. The
        reference is then the frozen base with the adapter disabled, so its
        weights are not copied."""

COMMON_ATTRIBUTES = """model_ : torch.nn.Module
        The trained policy.
    ref_model_ : torch.nn.Module or None
        The frozen reference (the starting policy), made once per fit; None
        with ``lora``, where the reference is the base with the adapter off.
    tokenizer_ : tokenizer
        With a pad token distinct from EOS.
    reward_model_ : callable
        The reward given to ``fit``; ``score`` uses it.
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
    history_ : list of dict
        One row per step with namespaced keys (``objective/reward``,
        ``objective/kl``, ``objective/beta``, ``loss/policy``, ``policy/entropy``,
        ``response/length``, ``response/eos_share``, ``time/episodes_per_s``,
        the seconds of the step's phases ``time/generation``, ``time/logprobs``
        (old, reference and value passes), ``time/reward``, ``time/update``...;
        ``loss/entropy_bonus``, entropy_coef times the mean entropy subtracted
        from the loss, when ``entropy_coef > 0``; ``loss/ptx``, the pretraining
        cross-entropy before ``ptx_coef``, when ``ptx_coef > 0``);
        ``pandas.DataFrame(history_)`` makes a table."""


def fill(cls, **defaults) -> str:
    """``cls``'s docstring with the shared fragments filled in, parameters in signature order."""
    doc = cls.__doc__.replace("{common_parameters}", COMMON_PARAMETERS.format(**defaults))
    doc = doc.replace("{common_attributes}", COMMON_ATTRIBUTES)
    return _in_signature_order(doc, list(inspect.signature(cls.__init__).parameters)[1:])


def _in_signature_order(doc: str, names: list) -> str:
    """Reorder the entries of a numpydoc Parameters section to follow ``names``."""
    lines = doc.split("\n")
    start = lines.index("    Parameters") + 2
    end = next(
        i
        for i in range(start, len(lines))
        if lines[i].strip() and lines[i + 1].strip().startswith("---")
    )
    entries, current = {}, None
    for line in lines[start:end]:
        match = re.match(r"^    (\w+)(,\s*\w+)* :", line)
        if match:
            current = match.group(1)
            entries[current] = []
        if current is not None:
            entries[current].append(line)
    for entry in entries.values():
        while entry and not entry[-1].strip():
            entry.pop()
    order = sorted(entries, key=lambda n: names.index(n) if n in names else len(names))
    body = [line for name in order for line in entries[name]]
    return "\n".join(lines[:start] + body + [""] + lines[end:])
