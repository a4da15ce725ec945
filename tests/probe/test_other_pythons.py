"""Every Python a job starts runs the probe's sitecustomize, whatever its version: an old one
prints nothing more and still runs its own sitecustomize; from 3.8 on the probe counts too."""

from __future__ import annotations

import ast
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from gpubox.probe.launch import SITE_DIR
from tests.probe.support import GPUBOX_RUN, run

SITECUSTOMIZE = SITE_DIR / "sitecustomize.py"


def test_the_sitecustomize_is_written_for_any_python() -> None:
    """No syntax that Python 2 or 3.6 rejects: a SyntaxError there is printed in every job."""
    tree = ast.parse(SITECUSTOMIZE.read_text())
    found = []
    for node in ast.walk(tree):
        annotated = getattr(node, "annotation", None) is not None or getattr(node, "returns", None) is not None
        if isinstance(node, ast.JoinedStr):
            found.append(f"f-string, line {node.lineno}")
        elif annotated:
            found.append(f"annotation, line {getattr(node, 'lineno', '?')}")
        elif isinstance(node, ast.ImportFrom) and node.module == "__future__":
            found.append(f"from __future__, line {node.lineno}")
    assert found == []


# Torch's iterator class, as far as the probe knows it, written for any Python.
FAKE_DATALOADER = """
class _BaseDataLoaderIter(object):
    def __init__(self, n):
        self.n = n

    def __iter__(self):
        return self

    def __next__(self):
        if not self.n:
            raise StopIteration
        self.n -= 1
        return self.n

    next = __next__
"""

PROGRAM = """
import os, sys
from torch.utils.data.dataloader import _BaseDataLoaderIter
sys.stdout.write("%s %s\\n" % (list(_BaseDataLoaderIter(3)), os.environ.get("USER_SITE_RAN")))
probes = os.path.join(os.environ["GPUBOX_RUNTIME_DIR"], "probe")
mine = [n for n in os.listdir(probes) if n.startswith(str(os.getpid()) + "-")]
batches = 0
for name in mine:
    with open(os.path.join(probes, name), "rb") as fh:
        batches = sum(c << 8 * i for i, c in enumerate(bytearray(fh.read()[40:48])))
sys.stdout.write("batches %d\\n" % batches)
"""

VERSIONS = ["2.7", "3.6", "3.7", "3.8", "3.9", "3.10", "3.12", "3.13"]


def _interpreter(version: str) -> str:
    """`python<version>` from PATH, if it is there and runs."""
    name = f"python{version}"
    path = shutil.which(name)
    if path is None:
        pytest.skip(f"no {name} on PATH")
    shown = subprocess.run(
        [path, "-c", "import sys; sys.stdout.write('%d.%d' % sys.version_info[:2])"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": ""},
    )
    if shown.returncode != 0 or shown.stdout != version:
        pytest.skip(f"{name} on PATH does not run")
    return path


@pytest.mark.parametrize("version", VERSIONS)
def test_another_python_runs_as_without_the_probe(tmp_path: Path, runtime: Path, version: str) -> None:
    python = _interpreter(version)
    fake = tmp_path / "fake"
    (fake / "torch" / "utils" / "data").mkdir(parents=True)
    for package in ("torch", "torch/utils", "torch/utils/data"):
        (fake / package / "__init__.py").write_text("")
    (fake / "torch" / "utils" / "data" / "dataloader.py").write_text(FAKE_DATALOADER)
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("import os\nos.environ['USER_SITE_RAN'] = 'yes'\n")
    (runtime / "probe").mkdir(parents=True)
    (runtime / "probe" / "1-1.probe").write_bytes(b"")  # left by a process long gone: swept
    program = tmp_path / "program.py"
    program.write_text(PROGRAM)
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{user}"}
    plain = run([python, str(program)], env=env, cwd=tmp_path)
    probed = run([*GPUBOX_RUN, python, str(program)], env=env, cwd=tmp_path)
    assert (plain.returncode, plain.stdout, plain.stderr) == (0, "[2, 1, 0] yes\nbatches 0\n", "")
    counted = 3 if tuple(map(int, version.split("."))) >= (3, 8) else 0
    assert (probed.returncode, probed.stdout, probed.stderr) == (0, f"[2, 1, 0] yes\nbatches {counted}\n", "")
