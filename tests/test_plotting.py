import re
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt
import numpy as np
import pytest

from prefopt.plotting import plot_exact_path, plot_history, plot_response_probs

KEYS = ("objective/reward", "objective/kl", "objective/beta", "policy/clipfrac")


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def history(seed, n_steps=5, clipfrac=True):
    rng = np.random.RandomState(seed)
    rows = []
    for step in range(1, n_steps + 1):
        row = {
            "step": step,
            "objective/reward": step + rng.normal(),
            "objective/kl": 0.1 * step,
            "objective/beta": 0.3,
        }
        if clipfrac:
            row["policy/clipfrac"] = 0.05
        rows.append(row)
    return rows


def test_plot_history_one_history_one_line_per_key():
    h = history(0)
    axes = plot_history(h)
    assert len(axes) == len(KEYS)
    assert [a.get_title() for a in axes] == list(KEYS)
    for a, key in zip(axes, KEYS):
        assert len(a.lines) == 1 and len(a.collections) == 0
        np.testing.assert_allclose(a.lines[0].get_ydata(), [row[key] for row in h])
        np.testing.assert_array_equal(a.lines[0].get_xdata(), [1, 2, 3, 4, 5])


@pytest.mark.parametrize("band", ["std", "minmax"])
def test_plot_history_several_histories_mean_and_band(band):
    runs = [history(seed) for seed in range(3)]
    axes = plot_history(runs, keys=["objective/reward"], band=band)
    (ax,) = axes
    assert len(ax.lines) == 1 and len(ax.collections) == 1  # the mean and its band
    table = np.array([[row["objective/reward"] for row in h] for h in runs])
    np.testing.assert_allclose(ax.lines[0].get_ydata(), table.mean(0))
    low, high = (
        (table.mean(0) - table.std(0), table.mean(0) + table.std(0))
        if band == "std"
        else (table.min(0), table.max(0))
    )
    band_y = ax.collections[0].get_paths()[0].vertices[:, 1]
    np.testing.assert_allclose([band_y.min(), band_y.max()], [low.min(), high.max()])
    assert ax.get_legend() is not None


def test_plot_history_aligns_unequal_lengths_on_step():
    runs = [history(0, n_steps=3), history(1, n_steps=5)]
    (ax,) = plot_history(runs, keys="objective/kl")
    np.testing.assert_allclose(ax.lines[0].get_ydata(), [0.1, 0.2, 0.3, 0.4, 0.5])


def test_plot_history_skips_unrecorded_keys_and_accepts_estimators():
    class Fitted:
        history_ = history(0, clipfrac=False)

    axes = plot_history([Fitted(), Fitted()])
    assert [a.get_title() for a in axes] == list(KEYS[:3])
    assert [a.get_legend() is not None for a in axes] == [True, False, False]
    with pytest.raises(ValueError, match="None of the keys"):
        plot_history(history(0), keys=["loss/value"])


def test_plot_history_accepts_ax():
    fig, axes = plt.subplots(2, 2)
    out = plot_history(history(0), ax=axes)
    assert [a.figure for a in out] == [fig] * 4
    _, ax = plt.subplots()
    (out,) = plot_history([history(0), history(1)], keys=["objective/reward"], ax=ax)
    assert out is ax
    with pytest.raises(ValueError, match="2 Axes for 4"):
        plot_history(history(0), ax=plt.subplots(1, 2)[1])


def test_plot_exact_path_solid_and_dashed_lines():
    path = [
        {"step": s, "reward": 0.1 * s, "true_quality": 0.2 * s, "kl": 0.05 * s} for s in range(4)
    ]
    optimum = {"reward": 0.5, "true_quality": 0.4, "kl": 0.2}
    _, ax = plt.subplots()
    out = plot_exact_path(path, optimum, ax=ax)
    assert out is ax
    solid = [line for line in ax.lines if line.get_linestyle() == "-"]
    dashed = [line for line in ax.lines if line.get_linestyle() == "--"]
    assert len(solid) == 3 and len(dashed) == 3
    np.testing.assert_allclose(solid[1].get_ydata(), [0.0, 0.2, 0.4, 0.6])
    assert [line.get_ydata()[0] for line in dashed] == [0.5, 0.4, 0.2]
    assert [line.get_color() for line in solid] == [line.get_color() for line in dashed]
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["reward", "true quality", "KL (nats)", "closed-form optimum"]


def test_plot_exact_path_names_missing_keys():
    with pytest.raises(ValueError, match="kl"):
        plot_exact_path(
            [{"step": 0, "reward": 0.0, "true_quality": 0.0}],
            {"reward": 1.0, "true_quality": 1.0, "kl": 0.1},
        )


def test_plot_response_probs_bars_average_over_prompts():
    labels = ["a", "b", "c"]
    before = np.array([[0.2, 0.3, 0.5], [0.4, 0.3, 0.3]])
    after = np.array([0.6, 0.3, 0.1])
    ax = plot_response_probs(before, after, labels)
    heights = [bar.get_height() for bar in ax.patches]
    np.testing.assert_allclose(heights, [0.3, 0.3, 0.4, 0.6, 0.3, 0.1])
    assert [t.get_text() for t in ax.get_xticklabels()] == labels
    assert [t.get_text() for t in ax.get_legend().get_texts()] == ["before", "after"]


def test_plot_response_probs_optimum_and_ax():
    _, ax = plt.subplots()
    out = plot_response_probs(
        [0.5, 0.5], [0.9, 0.1], ["x", "y"], optimum=[[0.8, 0.2]], names=("ref", "PPO"), ax=ax
    )
    assert out is ax
    assert len(ax.patches) == 4 and len(ax.collections) == 1
    np.testing.assert_allclose(ax.collections[0].get_segments()[0][:, 1], [0.8, 0.8])
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {
        "ref",
        "PPO",
        "closed-form optimum",
    }
    with pytest.raises(ValueError, match="3 labels"):
        plot_response_probs([0.5, 0.5], [0.9, 0.1], ["x", "y", "z"])


def test_missing_matplotlib_names_the_install_command(monkeypatch):
    # A None entry in sys.modules makes `import matplotlib...` raise ImportError, as if absent.
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(ImportError, match=re.escape("pip install 'prefopt[plot]'")):
        plot_history([history(0)])
    with pytest.raises(ImportError, match=re.escape("pip install 'prefopt[plot]'")):
        plot_exact_path([{"step": 0, "reward": 1.0}], {"reward": 1.0}, keys=["reward"])
