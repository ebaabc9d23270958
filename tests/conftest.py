"""Shared test setup: no progress bars, tiny models only, CPU."""

import pytest

import prefopt


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield
