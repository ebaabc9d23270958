"""The API reference builds with warnings as errors: numpydoc's checks pass and no public
name is missing from docs/api.rst."""

import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parents[1] / "docs"


@pytest.mark.slow  # about 15 s: sphinx imports prefopt and renders every docstring
def test_docs_build_without_warnings(tmp_path):
    pytest.importorskip("sphinx")
    pytest.importorskip("numpydoc")
    command = [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-q", "-b", "html"]
    command += ["-d", str(tmp_path / "doctrees"), str(DOCS), str(tmp_path / "html")]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-6000:]
    assert (tmp_path / "html" / "api.html").exists()
    for page in ("preference", "verifiable", "comparing", "scaling"):  # the user guide
        assert (tmp_path / "html" / "guide" / f"{page}.html").exists()


@pytest.mark.slow  # a few seconds: sphinx and prefopt imported in a subprocess
def test_an_executed_block_that_fails_fails_the_build(tmp_path):
    # The user guide's code runs at build time (docs/_ext/prefopt_run.py): its output is
    # rendered, and a block that raises stops the build, with or without -W.
    pytest.importorskip("sphinx")
    src = tmp_path / "src"
    src.mkdir()
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(DOCS.parent)!r})\n"
        f"sys.path.insert(0, {str(DOCS / '_ext')!r})\nextensions = ['prefopt_run']\n"
    )
    page = "Page\n====\n\n.. prefopt-run::\n\n   x = 6 * 7\n   x\n\n.. prefopt-run::\n\n   {}\n"
    command = [sys.executable, "-m", "sphinx", "-q", "-b", "html", str(src), str(tmp_path / "h")]
    (src / "index.rst").write_text(page.format("print(x + 1)"))
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    html = (tmp_path / "h" / "index.html").read_text()
    assert "42" in html and "43" in html  # the last expression's value, then the print
    (src / "index.rst").write_text(page.format("1 / (x - 42)"))
    result = subprocess.run(command + ["-E"], capture_output=True, text=True, timeout=600)
    assert result.returncode != 0
    assert "index.rst, line 9 failed" in result.stderr and "ZeroDivisionError" in result.stderr
