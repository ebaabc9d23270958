"""The progress bar's old place; it lives in :mod:`prefopt.backend.progress`.

Kept only while ``policies/_steps.py`` and ``lm/_supervised.py`` import
``tqdm`` from here; tests/test_layers.py lists it as the one module allowed
directly under ``prefopt/`` besides ``_config`` and ``kl``, until they import
``prefopt.backend.progress``.
"""

from .backend.progress import tqdm

__all__ = ["tqdm"]
