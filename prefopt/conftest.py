"""Doctest setup: no progress bars."""

import pytest

import prefopt


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield
