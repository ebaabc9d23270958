"""The progress bar of prefopt's long loops, and the logger of ``verbose=`` lines.

tqdm's widget in a notebook with ipywidgets, its text bar everywhere else.
``tqdm.auto`` warns at import in a notebook kernel without ipywidgets
("IProgress not found") and then falls back to the text bar; the fallback is
what prefopt wants there, so the warning is not shown on ``import prefopt``:
``prefopt/__init__.py`` and ``prefopt/backend/__init__.py`` import this module
first, before anything else can import ``tqdm.auto``.
"""

from __future__ import annotations

import logging
import sys
import warnings
from contextlib import contextmanager

from tqdm import TqdmWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["progress_shown", "quiet_transformers", "tqdm", "verbose_log"]


class _CurrentStdout(logging.StreamHandler):
    """A handler writing to ``sys.stdout`` as it is when a line is emitted."""

    @property
    def stream(self):
        return sys.stdout

    @stream.setter
    def stream(self, value):  # StreamHandler.__init__ sets it; the live stdout is used
        pass


# ``verbose=1`` shows its lines with no ``logging`` set up (as scikit-learn's verbose
# does), through its own logger: "prefopt.verbose", which a user can silence or redirect.
verbose_log = logging.getLogger("prefopt.verbose")
if not verbose_log.handlers:
    verbose_log.addHandler(_CurrentStdout())
    verbose_log.setLevel(logging.INFO)
    verbose_log.propagate = False


def progress_shown() -> bool:
    """Whether prefopt's bars show: ``show_progress_bar``, ``"auto"`` read here and now.

    ``"auto"`` shows them in a terminal (stderr is a TTY) or a notebook (tqdm's widget),
    and not where stderr is a file or a pipe: there each redraw of a bar is one more
    line of the log.

    Examples
    --------
    >>> import prefopt
    >>> with prefopt.config_context(show_progress_bar=False):
    ...     progress_shown()
    False
    """
    from .._config import get_config

    show = get_config()["show_progress_bar"]
    if show != "auto":
        return bool(show)
    if any(c.__name__ == "tqdm_notebook" for c in tqdm.__mro__):  # tqdm.auto chose the widget
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


@contextmanager
def quiet_transformers():
    """transformers' own progress bars (loading, saving a model) follow prefopt's.

    Hidden inside the block when :func:`progress_shown` is false, and restored
    after; left alone when they show, or when the user turned them off already.

    Examples
    --------
    >>> import prefopt
    >>> from transformers.utils import logging as hf_logging
    >>> with prefopt.config_context(show_progress_bar=False), quiet_transformers():
    ...     hf_logging.is_progress_bar_enabled()
    False
    """
    from transformers.utils import logging as hf_logging

    if progress_shown() or not hf_logging.is_progress_bar_enabled():
        yield
        return
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()
