"""Docstrings of the policy estimators: the common parameters' entries from their table.

The entries come from :data:`~prefopt.policies._params.COMMON_PARAMETERS`, the
defaults from each class's signature; the attributes every policy has are one
shared fragment here.
"""

import inspect
import re

from ..learning_rate import POLICY_TARGET
from ._params import COMMON_PARAMETERS

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
    learning_rate_ : float
        The starting learning rate (``learning_rate`` resolved).
    lr_controller_ : AdaptiveLR or None
        The fit's copy of an adaptive ``learning_rate``; its ``learning_rate_``
        is the next step's rate. ``None`` for a fixed rate.
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
    shared = {name: entry for name, entry in _common_entries().items() if name not in own}
    shared_text = "\n".join(line for entry in shared.values() for line in entry).strip()
    tiny = getattr(cls, "tiny_model_learning_rate", 1e-3)
    shared_text = shared_text.replace("{tiny_learning_rate}", f"{tiny:g}")
    target = getattr(cls, "adaptive_lr_target", POLICY_TARGET)  # the default rate's rule
    anneal = "; decayed linearly to 0 over the fit" if getattr(cls, "adaptive_lr_anneal", 0) else ""
    for key, value in {
        "{lr_high}": f"{2 * target:g}",
        "{lr_low}": f"{target / 2:g}",
        "{lr_target}": f"{target:g}",
        "{lr_anneal}": anneal,
    }.items():
        shared_text = shared_text.replace(key, value)
    doc = doc.replace("{common_parameters}", shared_text)
    doc = doc.replace("{common_attributes}", COMMON_ATTRIBUTES)
    return _in_signature_order(doc, signature, cls.__name__)


def _common_entries() -> dict:
    """The Parameters entries of the common parameters, by name, from their table."""
    entries = {}
    for name, parameter in COMMON_PARAMETERS.items():
        entries[name] = [f"    {name} : {parameter.type}"]
        if parameter.doc:
            entries[name] += f"        {parameter.doc}".split("\n")
    return entries


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
