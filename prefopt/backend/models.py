"""Resolving models and tokenizers; dropout off; frozen reference copies; default learning rates."""

from __future__ import annotations

import copy
import os

from torch import nn

from .progress import quiet_transformers

PAD_TOKEN = "[PAD]"


def disable_dropout(model: nn.Module) -> nn.Module:
    """Set ``p = 0`` in every dropout layer of ``model`` and return it.

    With dropout active, the same tokens get different log-probabilities in the
    sampling and training passes, so the PPO ratio is not 1 at the first epoch
    and the KL estimate is unreliable (Huang et al. 2024).
    This applies to all four models: policy, reference, reward and value.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    model : torch.nn.Module
        The same object, changed in place.

    Examples
    --------
    >>> from torch import nn
    >>> from prefopt.backend import disable_dropout
    >>> m = disable_dropout(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.5)))
    >>> m[1].p
    0.0
    """
    for module in model.modules():
        if isinstance(module, nn.Dropout) or "Dropout" in type(module).__name__:
            if hasattr(module, "p"):
                module.p = 0.0
    config = getattr(model, "config", None)  # a transformers model's; any module may come
    for attr in (
        "attn_pdrop",
        "resid_pdrop",
        "embd_pdrop",
        "hidden_dropout_prob",
        "attention_probs_dropout_prob",
        "dropout",
        "attention_dropout",
        "summary_first_dropout",
    ):
        if config is not None and isinstance(getattr(config, attr, None), float):
            setattr(config, attr, 0.0)
    return model


# Activation modules that compute GELU's tanh approximation with several tensor ops in
# Python; ``nn.GELU(approximate="tanh")`` is the same function as one fused kernel.
_TANH_GELU_MODULES = ("NewGELUActivation", "FastGELUActivation", "GELUTanh", "PytorchGELUTanh")


def fuse_activations(model: nn.Module) -> int:
    """Swap GELU-tanh activations written as several tensor ops for one fused kernel.

    GPT-2's ``gelu_new`` (``NewGELUActivation``) computes
    ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))`` as seven separate tensor
    operations, each a pass over the activations forward and again backward.
    ``torch.nn.GELU(approximate="tanh")`` is the same function in one kernel;
    results agree up to float rounding (about 1e-7 relative). On the review
    world's model this cuts a full forward pass by about a fifth and a
    forward-backward by about as much. The model is changed in place; its config
    and weights are untouched, so ``save_pretrained`` writes the same files.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    n_swapped : int
        How many activation modules were replaced.

    Examples
    --------
    >>> from transformers.activations import NewGELUActivation
    >>> from torch import nn
    >>> m = nn.Sequential(nn.Linear(2, 2), NewGELUActivation())
    >>> fuse_activations(m), type(m[1]).__name__
    (1, 'GELU')
    """
    swapped = 0
    for parent in list(model.modules()):
        for name, child in list(parent.named_children()):
            kind = type(child)
            if kind.__name__ in _TANH_GELU_MODULES and kind.__module__.startswith("transformers."):
                setattr(parent, name, nn.GELU(approximate="tanh"))
                swapped += 1
    return swapped


def frozen_copy(model: nn.Module) -> nn.Module:
    """Return a frozen, dropout-free copy of ``model`` in eval mode.

    The reference model is made once per ``fit`` and never copied per step.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    reference : torch.nn.Module
        A deep copy; ``model`` is unchanged.

    Examples
    --------
    >>> from torch import nn
    >>> from prefopt.backend import frozen_copy
    >>> ref = frozen_copy(nn.Linear(2, 2))
    >>> any(p.requires_grad for p in ref.parameters())
    False
    """
    ref = copy.deepcopy(model)
    disable_dropout(ref)
    ref.eval()
    ref.requires_grad_(False)
    return ref


def ensure_pad_token(tokenizer):
    """Return a tokenizer whose pad token exists and differs from EOS.

    If padding used the EOS token, EOS would be masked as padding during
    supervised training and the model would never learn to stop (Huang et al.
    2024). A missing or EOS-equal pad token is replaced by a
    new ``[PAD]`` special token on a copy; the caller's tokenizer is unchanged.
    Embeddings are not resized: pad positions are masked and their ids replaced
    by 0 before every forward pass.

    Parameters
    ----------
    tokenizer : transformers tokenizer

    Returns
    -------
    tokenizer : transformers tokenizer
        ``tokenizer`` itself when its pad token is usable, else a copy.

    Examples
    --------
    >>> from prefopt.worlds import PreferenceWorld
    >>> tok = ensure_pad_token(PreferenceWorld().tokenizer)
    >>> tok.pad_token_id != tok.eos_token_id
    True
    """
    if tokenizer.pad_token_id is not None and tokenizer.pad_token_id != tokenizer.eos_token_id:
        return tokenizer
    tokenizer = copy.deepcopy(tokenizer)
    tokenizer.add_special_tokens({"pad_token": PAD_TOKEN})
    return tokenizer


def model_vocab_size(model: nn.Module) -> int | None:
    """Vocabulary size of a causal LM's output layer, when it can be read.

    Parameters
    ----------
    model : torch.nn.Module

    Returns
    -------
    vocab_size : int or None
        From ``model.config.vocab_size``, else the output embedding's width;
        ``None`` when neither exists.
    """
    config = getattr(model, "config", None)
    size = getattr(config, "vocab_size", None)
    if size is None:
        get = getattr(model, "get_output_embeddings", None)
        emb = get() if callable(get) else None
        size = getattr(emb, "out_features", None)
    return size


def load_causal_lm(model, tokenizer=None, *, seed: int = 0):
    """Resolve a policy model and its tokenizer from what a user passed.

    Parameters
    ----------
    model : str, PretrainedConfig, torch.nn.Module or fitted prefopt policy
        A local path or name (``AutoModelForCausalLM.from_pretrained``), a config
        (a fresh model built from it with ``seed``; its tokenizer is loaded from
        ``config.name_or_path`` when that is a local folder), a module called like a
        causal LM (copied: ``fit`` never mutates a parameter), or a fitted
        prefopt policy (its ``model_`` and ``tokenizer_`` are copied).
    tokenizer : str or tokenizer, default=None
        ``None`` takes the fitted policy's, the module's ``tokenizer``
        attribute, or loads one from the path.
    seed : int, default=0
        Seed for models built from a config.

    Returns
    -------
    model : torch.nn.Module
    tokenizer : transformers tokenizer
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer, PretrainedConfig

    if model is None:
        raise ValueError(
            "No model was given: pass model= a path, a transformers config, a "
            "torch module or a fitted prefopt policy."
        )
    if type(model).__name__ == "FrozenEstimator":
        model = model.estimator
    if hasattr(model, "model_") and hasattr(model, "tokenizer_"):
        module, tok = copy.deepcopy(model.model_), model.tokenizer_
    elif isinstance(model, (str, os.PathLike)):
        module = _from_local(AutoModelForCausalLM, model, "model")
        tok = None
        if tokenizer is None:
            tok = _from_local(AutoTokenizer, model, "model")
    elif isinstance(model, PretrainedConfig):
        from ._torch import local_seed

        with local_seed(seed):
            module = AutoModelForCausalLM.from_config(model)
        tok = None
        source = getattr(model, "name_or_path", "")
        if tokenizer is None and source and os.path.isdir(source):
            # A config saved beside its tokenizer (as the worlds do) brings it along.
            tok = AutoTokenizer.from_pretrained(source)
    elif isinstance(model, nn.Module):
        module, tok = copy.deepcopy(model), getattr(model, "tokenizer", None)
    elif hasattr(model, "get_params") and hasattr(model, "fit"):
        raise ValueError(
            f"model is an unfitted {type(model).__name__}: fit it first, then pass the fitted "
            "estimator (prefopt keeps a fitted model= as it is when a search clones the "
            "estimator; with scikit-learn's plain clone, wrap it in "
            "sklearn.frozen.FrozenEstimator)."
        )
    else:
        raise TypeError(
            f"model must be a path, a transformers config, a torch module or a "
            f"fitted prefopt policy; got {type(model).__name__}."
        )
    if tokenizer is not None:
        is_path = isinstance(tokenizer, (str, os.PathLike))
        tok = _from_local(AutoTokenizer, tokenizer, "tokenizer") if is_path else tokenizer
    if tok is None:
        raise ValueError(
            "No tokenizer: pass tokenizer= (a path or a tokenizer object) with this model."
        )
    if getattr(tok, "eos_token_id", None) is None and not getattr(module, "fixed_length", False):
        raise ValueError(
            "The tokenizer has no EOS token; responses could never end. Set "
            "tokenizer.eos_token (e.g. tokenizer.add_special_tokens({'eos_token': "
            "'</s>'})) and make sure the model knows it."
        )
    fuse_activations(module)  # the copy is ours: same function, one kernel
    return module, tok


def _from_local(auto_class, name, parameter: str):
    """``auto_class.from_pretrained`` from a local folder or the local cache, never the network.

    Without this, a mistyped folder is taken for a Hub name and transformers tries the
    network (for tens of seconds offline) before failing with an unrelated message.
    """
    name = os.fspath(name)
    folder = os.path.expanduser(name)
    if os.path.isdir(folder):
        with quiet_transformers():  # no "Loading weights" bar where prefopt shows none
            return auto_class.from_pretrained(folder)
    # A Hub name is "name" or "owner/name"; anything else is meant as a folder.
    if (
        name.startswith((".", "/", "~"))
        or name.count("/") > 1
        or (os.sep != "/" and os.sep in name)
    ):
        raise FileNotFoundError(
            f"{parameter}={name!r}: the folder {os.path.abspath(folder)} does not exist; "
            "pass the path of a folder written by save_pretrained."
        )
    try:
        with quiet_transformers():
            return auto_class.from_pretrained(name, local_files_only=True)
    except (OSError, ValueError):
        raise FileNotFoundError(
            f"{parameter}={name!r} is not a local folder, and no copy of it is in the "
            "Hugging Face cache; prefopt does not download. Download it first (for example "
            f"`hf download {name}`, or from_pretrained in transformers) or pass a local folder."
        ) from None


SMALL_MODEL_PARAMETERS = 10_000_000


def clone_keeping_models(estimator):
    """``sklearn.base.clone`` that keeps starting models by reference.

    A fitted estimator (a fitted SFTPolicy given as ``model=``) or a torch module
    passed as a parameter is kept as it is, not reset or deep-copied: ``fit``
    copies what it trains and never mutates its parameters, so the candidates of
    a search can share one starting model without one copy of its weights each.
    Every other parameter is cloned as scikit-learn does.
    """
    from sklearn.base import clone

    params = {}
    for name, value in estimator.get_params(deep=False).items():
        keep = isinstance(value, nn.Module) or is_fitted(value)
        params[name] = value if keep else clone(value, safe=False)
    return type(estimator)(**params)


def is_fitted(value) -> bool:
    """Whether ``value`` is a fitted estimator (scikit-learn's own test)."""
    if not (hasattr(value, "get_params") and hasattr(value, "fit")):
        return False
    from sklearn.exceptions import NotFittedError
    from sklearn.utils.validation import check_is_fitted

    try:
        check_is_fitted(value)
    except (NotFittedError, TypeError):
        return False
    return True


LOG_LINEAR_LEARNING_RATE = 0.1
TINY_MODEL_LEARNING_RATE = 1e-3


def default_learning_rate(
    model: nn.Module, large: float, tiny: float = TINY_MODEL_LEARNING_RATE
) -> float:
    """The learning rate used when an estimator's ``learning_rate`` is None, by kind of model.

    For a reinforcement-learning policy on a language model (not log-linear) it is
    where the default adaptive rate starts (:class:`~prefopt.AdaptiveLR`, at most
    10 times this); elsewhere it is the fixed rate.

    ============================  =============  =========================================
    kind of model                 learning rate  why
    ============================  =============  =========================================
    log-linear policy (a module   0.1            one small parameter vector; measured on
    with ``is_log_linear=True``,                 the preference world: Adam at 0.1 reaches
    the exact worlds')                           over 0.99 of the achievable objective in
                                                 100 steps for PPO, RLOO and REINFORCE at
                                                 beta 0.1 and 0.3 (1e-3 reaches 0.1-0.25)
    under 10M parameters (tiny    ``tiny``       the caller's: each policy declares its
    transformers from a config)                  ``tiny_model_learning_rate``, chosen by
                                                 benchmarks/LR_SWEEP.md (rule 2: the
                                                 highest rate where no seed of 5 trips a
                                                 health detector and held-out gold ends
                                                 above the start, on TinyLMWorld, the
                                                 review and the arithmetic worlds, GPT-2-
                                                 and Llama-shaped): PPO 3e-4, RLOO 1e-4,
                                                 GRPO 1e-4, REINFORCE 3e-4, REINFORCE++
                                                 3e-4, RAFT 3e-5 (no rate passed its
                                                 Llama review and arithmetic cells), DPO
                                                 1e-3. A tiny model trained nearly from
                                                 scratch (TinyLMWorld) learns faster at
                                                 1e-3
    10M parameters or more        ``large``      the papers' value for the stage: 3e-6 for
    (pretrained checkpoints)                     RL (Huang et al. 2024), 2e-5 for SFT,
                                                 1e-5 for the reward model, 1e-6 for DPO
    ============================  =============  =========================================

    Parameters
    ----------
    model : torch.nn.Module
        The model to train.
    large : float
        Learning rate for models of 10M parameters or more.
    tiny : float, default=1e-3
        Learning rate for models under 10M parameters (not log-linear).

    Returns
    -------
    learning_rate : float

    Examples
    --------
    >>> from torch import nn
    >>> default_learning_rate(nn.Linear(4, 4), large=1e-5)
    0.001
    >>> default_learning_rate(nn.Linear(4, 4), large=1e-5, tiny=1e-4)
    0.0001
    """
    if getattr(model, "is_log_linear", False):
        return LOG_LINEAR_LEARNING_RATE
    n = sum(p.numel() for p in model.parameters())
    return tiny if n < SMALL_MODEL_PARAMETERS else large
