"""The common parameters of multi-turn episodes (``environment``, ``tools``...), by topic.

Entries of :data:`~prefopt.policies._params.COMMON_PARAMETERS` as ``(default,
constraints, type, doc)``, which that table makes into its ``Parameter`` rows:
every RL policy takes them (the user guide's "Environments and tools").
"""

from numbers import Integral, Real

from ..validation import Interval

EPISODE_PARAMETERS = {
    "environment": (
        None,
        "no_validation",
        "class, callable or object",
        """Multi-turn episodes: ``reset(prompt)`` and ``step(completion) -> (observation,
        reward, done)``, sync or async; a class or factory (one per episode) or an instance
        (copied). Its tokens stay out of every loss; see "Environments and tools".""",
    ),
    "tools": (
        None,
        "no_validation",
        "list of callables or None",
        """Functions with type hints and docstrings the policy may call; failures reach the
        model as text and are counted (``tools/...`` in ``history_``).""",
    ),
    "max_turns": (
        4,
        [Interval(Integral, 1, None, closed="left")],
        "int",
        """Policy turns of an episode; more is truncated (``missing_eos_reward``).""",
    ),
    "max_episode_tokens": (
        None,
        [Interval(Integral, 1, None, closed="left"), None],
        "int or None",
        """Tokens of an episode after its prompt; ``None``: ``max_turns * max_new_tokens``.""",
    ),
    "tool_timeout": (
        10.0,
        [Interval(Real, 0, None, closed="neither")],
        "float",
        """Seconds a tool call may take before it is reported as a time-out.""",
    ),
}
