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


def _readme_python_blocks(readme: str, section: str) -> list[str]:
    """The ```python blocks of one README section (## heading)."""
    body = readme.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    return [b.split("```", 1)[0] for b in body.split("```python\n")[1:]]


@pytest.mark.slow  # the demo's --quick run and the README's usage blocks: 2 to 6 minutes
def test_the_readmes_new_user_path_runs_from_a_fresh_checkout(tmp_path):
    # What the README walks a newcomer through, from the committed tree (git archive of
    # HEAD, what a fresh clone holds): the demo, the usage blocks (the preference world,
    # the review task, a GRPO run on a table with an answer column, tracked to
    # TensorBoard and exported); then the export loads in transformers' pipeline. The
    # install step is pip's (not repeated here: the checkout is put on PYTHONPATH).
    root = DOCS.parent
    clone = tmp_path / "clone"
    clone.mkdir()
    archive = subprocess.run(
        ["git", "-C", str(root), "archive", "HEAD"], capture_output=True, check=True
    )
    subprocess.run(["tar", "-x", "-C", str(clone)], input=archive.stdout, check=True)
    readme = (clone / "README.md").read_text()
    assert "./dev demo" in readme and "./dev test" in readme
    env = {**__import__("os").environ, "PYTHONPATH": str(clone)}
    demo = subprocess.run(
        [sys.executable, "examples/demo.py", "--quick", "--no-progress", "--out", "d.png"],
        cwd=clone,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert demo.returncode == 0, demo.stderr[-3000:]
    blocks = _readme_python_blocks(readme, "Usage")
    assert len(blocks) == 3 and "answer" in blocks[2] and "save_pretrained" in blocks[2]
    work = tmp_path / "work"
    work.mkdir()
    for i, block in enumerate(blocks):
        run = subprocess.run(
            [sys.executable, "-c", block],
            cwd=work,
            env=env,
            capture_output=True,
            text=True,
            timeout=1200,
        )
        assert run.returncode == 0, f"README usage block {i}:\n{run.stderr[-3000:]}"
    assert any((work / "runs").rglob("events.out.tfevents.*"))  # tracked
    from transformers import pipeline

    generate = pipeline("text-generation", model=str(work / "grpo-model"), device="cpu")
    out = generate(["2+3=", "7+1="], do_sample=False, return_full_text=False)
    assert len(out) == 2
