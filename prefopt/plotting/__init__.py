"""Figures from ``history_`` and from the exact worlds.

Every function draws on the matplotlib Axes it is given (``ax=``) or on a new
figure, and returns what it drew on, so figures compose: a run in the preference
world next to its closed-form optimum is :func:`plot_exact_path` on the left and
:func:`plot_response_probs` on the right. matplotlib is imported only when a
function is called; it is the optional ``plot`` extra (``pip install 'prefopt[plot]'``).
"""

from ._history import DEFAULT_HISTORY_KEYS as DEFAULT_HISTORY_KEYS  # noqa: F401
from ._history import plot_exact_path, plot_history, plot_response_probs
from ._profile import plot_performance_profile
from ._search import plot_comparison, plot_search

__all__ = [
    "plot_comparison",
    "plot_exact_path",
    "plot_history",
    "plot_performance_profile",
    "plot_response_probs",
    "plot_search",
]
