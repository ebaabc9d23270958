"""Shared test setup: no progress bars, tiny models only, CPU.

The shared builders live beside this file in ``_tiny.py`` (a module the test files
import; a conftest is not imported by name): ``word_tokenizer`` and ``bos_tokenizer``
(tokenizers built in-process), ``tiny_lm`` (a seeded tiny GPT-2) and ``small_policy``
(a policy on an exact world's tiny policy model), so no test file builds its own.
"""

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


@pytest.fixture(scope="session")
def world():
    """The worked example's preference world (raters with bias 1)."""
    from prefopt.worlds import PreferenceWorld

    return PreferenceWorld(rater_bias=1.0, random_state=0)


@pytest.fixture(scope="session")
def rm(world):
    """The worked example's reward model: 1,000 comparisons from the world's raters."""
    from prefopt import RewardModel

    return RewardModel().fit(world.comparisons(1000, random_state=0))
