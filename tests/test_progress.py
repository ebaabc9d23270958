"""Quiet where no one watches: progress bars off in a log, transformers' bars follow prefopt's."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

import prefopt
from prefopt.backend.progress import progress_shown, quiet_transformers

ROOT = Path(__file__).resolve().parents[1]

# A user's script: SFT on demonstrations, its export loaded back by path (transformers'
# "Loading weights" bar) and saved (its "Writing model shards" bar), then 20 RLOO steps.
SCRIPT = """
import sys
sys.path.insert(0, {tests!r})
import numpy as np
from _tiny import tiny_lm
import prefopt
from prefopt import RLOOPolicy, SFTPolicy
{config}
demos = [("the movie was", "good ."), ("the plot was", "awful .")] * 16
sft = SFTPolicy(model=tiny_lm(), learning_rate=1e-2, n_epochs=2, random_state=0).fit(demos)
sft.save_pretrained({folder!r})
again = SFTPolicy(model={folder!r}, n_epochs=1, random_state=0).fit(demos)
reward = lambda prompts, completions: np.array([len(c) for c in completions], float)
policy = RLOOPolicy(model=again, k=2, batch_size=4, n_steps=20, max_new_tokens=3,
                    on_unhealthy="ignore", random_state=0)
policy.fit(["the movie was", "the plot was"], reward)
print("done")
"""


def _log_lines(tmp_path, config=""):
    """The script's stdout and stderr, both pipes (not a terminal), split at \\n and \\r."""
    script = SCRIPT.format(tests=str(ROOT / "tests"), folder=str(tmp_path / "sft"), config=config)
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=600, cwd=ROOT
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = proc.stdout + proc.stderr
    return [line for line in re.split(r"[\r\n]+", text) if line.strip()]


@pytest.mark.slow  # two subprocesses, each fitting three tiny models (20 s to 2 min each)
def test_a_fit_logged_to_a_file_is_a_few_lines(tmp_path):
    quiet = _log_lines(tmp_path)  # the default, show_progress_bar="auto"
    # Measured: 2 lines ("done" and a RuntimeWarning of RLOO's about EOS); with the bars
    # forced on, 59 and 60 in two runs (SFT's two bars and RLOO's, each redraw a line;
    # tqdm redraws at most every 0.1 s, so the count varies with the machine's speed).
    assert len(quiet) <= 10, "\n".join(quiet)
    assert quiet[0] == "done"  # stdout, then stderr
    assert not any(s in line for line in quiet for s in ("it/s", "Loading weights", "Writing"))
    loud = _log_lines(tmp_path, "prefopt.set_config(show_progress_bar=True)")
    assert len(loud) > 20  # the bars do show when asked, in a log too


def test_auto_shows_bars_in_a_terminal_only(monkeypatch):
    class Stream:
        def __init__(self, tty):
            self.tty = tty

        def isatty(self):
            return self.tty

        def write(self, text):
            return len(text)

        def flush(self):
            pass

    with prefopt.config_context(show_progress_bar="auto"):
        monkeypatch.setattr(sys, "stderr", Stream(False))
        assert prefopt.get_config()["show_progress_bar"] == "auto"
        assert not progress_shown()
        monkeypatch.setattr(sys, "stderr", Stream(True))
        assert progress_shown()
    with prefopt.config_context(show_progress_bar=True):
        monkeypatch.setattr(sys, "stderr", Stream(False))
        assert progress_shown()  # True forces them, in a log too
    with pytest.raises(ValueError, match="show_progress_bar must be True, False or 'auto'"):
        prefopt.set_config(show_progress_bar="yes")


def test_transformers_bars_follow_prefopts():
    from transformers.utils import logging as hf_logging

    assert hf_logging.is_progress_bar_enabled()
    with prefopt.config_context(show_progress_bar=False), quiet_transformers():
        assert not hf_logging.is_progress_bar_enabled()
    assert hf_logging.is_progress_bar_enabled()  # restored
    with prefopt.config_context(show_progress_bar=True), quiet_transformers():
        assert hf_logging.is_progress_bar_enabled()
