"""Shared test setup: no progress bars, tiny models only, CPU."""

import pytest
import torch

import prefopt

# Module-scoped fixtures run before function-scoped ones: switch bars off globally too.
prefopt.set_config(show_progress_bar=False)
# The test models are tiny: a second intra-op thread only adds synchronisation (the suite
# ran about 4x slower with two threads on a busy 2-core machine).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _quiet():
    with prefopt.config_context(show_progress_bar=False):
        yield
