"""Doctest setup: no progress bars."""

import pytest
import torch

import prefopt

torch.set_num_threads(1)  # doctest models are tiny


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield
