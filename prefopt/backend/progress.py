"""The progress bar of prefopt's long loops.

tqdm's widget in a notebook with ipywidgets, its text bar everywhere else.
``tqdm.auto`` warns at import in a notebook kernel without ipywidgets
("IProgress not found") and then falls back to the text bar; the fallback is
what prefopt wants there, so the warning is not shown on ``import prefopt``:
``prefopt/__init__.py`` and ``prefopt/backend/__init__.py`` import this module
first, before anything else can import ``tqdm.auto``.
"""

from __future__ import annotations

import warnings

from tqdm import TqdmWarning

with warnings.catch_warnings():
    warnings.simplefilter("ignore", TqdmWarning)
    from tqdm.auto import tqdm

__all__ = ["tqdm"]
