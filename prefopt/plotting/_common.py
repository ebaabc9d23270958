"""matplotlib, imported only when a figure is drawn."""

from __future__ import annotations


def _pyplot():
    """``matplotlib.pyplot``, imported on first use: matplotlib is the optional ``plot`` extra."""
    try:
        import matplotlib.pyplot as plt
    except ImportError as error:
        raise ImportError(
            "prefopt.plotting needs matplotlib, which is not installed; install it with "
            "pip install 'prefopt[plot]'"
        ) from error
    return plt


def _new_axes(figsize, **subplots):
    """The Axes of a new figure with constrained layout (``subplots`` as in plt.subplots)."""
    return _pyplot().subplots(figsize=figsize, layout="constrained", **subplots)[1]
