"""benchmarks/compare_algorithms.ipynb runs top to bottom (small configuration) so it never rots."""

from pathlib import Path

import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")

NOTEBOOK = Path(__file__).resolve().parents[1] / "benchmarks" / "compare_algorithms.ipynb"


@pytest.mark.slow
def test_compare_algorithms_notebook_runs(monkeypatch):
    monkeypatch.setenv("PREFOPT_NOTEBOOK_SMALL", "1")
    monkeypatch.setenv("MPLBACKEND", "Agg")
    nb = nbformat.read(NOTEBOOK, as_version=4)
    client = nbclient.NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(NOTEBOOK.parent)}},
    )
    client.execute()
    outputs = [o for cell in nb.cells if cell.cell_type == "code" for o in cell.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    # import prefopt in a kernel without ipywidgets: tqdm's text bar, and no warning about it.
    warnings = [str(o.get("text", "")) for o in outputs if o.get("name") == "stderr"]
    assert not [w for w in warnings if "IProgress" in w], warnings
    text = "".join(
        str(o.get("text", "")) + str(o.get("data", {}).get("text/plain", "")) for o in outputs
    )
    assert "closed-form optimum" in text
    for name in ("PPO", "RLOO", "GRPO", "REINFORCE", "RAFT", "DPO"):
        assert name in text, name
