"""set_config / config_context: every value checked, and a refused call changes nothing."""

import threading

import numpy as np
import pytest

import prefopt


@pytest.mark.parametrize(
    "key, value, match",
    [
        ("show_progress_bar", "no", "show_progress_bar must be True, False or 'auto'; got 'no'"),
        ("show_progress_bar", 0, "show_progress_bar must be True, False or 'auto'; got 0"),
        ("eval_batch_size", 2.5, r"eval_batch_size must be an int.*got 2.5"),
        ("eval_batch_size", "8", "eval_batch_size must be an int.*got '8'"),
        ("eval_batch_size", True, "eval_batch_size must be an int.*got True"),
        ("eval_batch_size", 0, "eval_batch_size must be >= 1; got 0"),
        ("device", "cuda:first", r"device must be .*'cuda:N'.*got 'cuda:first'"),
        ("device", "cuda:", r"got 'cuda:'"),
        ("device", "gpu", r"got 'gpu'"),
        ("compile", "not-a-backend", "compile='not-a-backend' is not a torch.compile backend"),
    ],
)
def test_bad_value_is_refused_and_leaves_every_setting_as_it_was(key, value, match):
    before = prefopt.get_config()
    # The bad value comes with good ones for other keys: none of them may take effect.
    good = {"dtype": "bfloat16", "distributed": "none"}
    with pytest.raises(ValueError, match=match):
        prefopt.set_config(**good, **{key: value})
    assert prefopt.get_config() == before
    with pytest.raises(ValueError, match=match):
        with prefopt.config_context(**good, **{key: value}):
            pass  # pragma: no cover - never entered
    assert prefopt.get_config() == before


def test_unknown_key_in_context_changes_nothing():
    before = prefopt.get_config()
    with pytest.raises(TypeError, match=r"Unknown configuration keys \['batch_size'\]"):
        with prefopt.config_context(eval_batch_size=3, batch_size=3):
            pass  # pragma: no cover - never entered
    assert prefopt.get_config() == before


def test_legitimate_values_are_stored_normalised():
    before = prefopt.get_config()
    with prefopt.config_context(
        device="cuda:12", eval_batch_size=np.int64(5), show_progress_bar=np.bool_(False)
    ):
        config = prefopt.get_config()
        assert config["device"] == "cuda:12"
        assert config["eval_batch_size"] == 5 and type(config["eval_batch_size"]) is int
        assert config["show_progress_bar"] is False
    with prefopt.config_context(compile="eager"):  # a backend torch registers
        assert prefopt.get_config()["compile"] == "eager"
    assert prefopt.get_config() == before


def test_refused_set_config_reaches_no_new_thread():
    before = prefopt.get_config()
    with pytest.raises(ValueError):
        prefopt.set_config(eval_batch_size=17, device="cuda:x")
    seen = []
    thread = threading.Thread(target=lambda: seen.append(prefopt.get_config()))
    thread.start()
    thread.join()
    assert seen[0]["eval_batch_size"] == before["eval_batch_size"]
