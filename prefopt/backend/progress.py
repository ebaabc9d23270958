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

from tqdm import TqdmWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["tqdm", "verbose_log"]


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
