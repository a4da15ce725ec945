"""The commands people and scripts run most must start fast: `gpubox --version` and the help
screens import no Textual, no torch and no NVML bindings (and `--version` not even Typer).

Each command runs in a fresh interpreter under `python -X importtime`, which lists every module
it imports; a failure shows the chain of imports that brought the heavy one in.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

HEAVY = {"textual", "torch", "pynvml", "prometheus_client"}
LINE = re.compile(r"^import time:\s+\d+ \|\s+\d+ \| ( *)(\S+)$")


def _imports(args: list[str]) -> list[tuple[int, str]]:
    """Run `python -m gpubox ARGS`; return (nesting depth, module) for every module it imported."""
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb", "PYTHONDONTWRITEBYTECODE": "1"}
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "gpubox", *args],
        capture_output=True,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )
    assert result.returncode == 0, f"gpubox {' '.join(args)} exited {result.returncode}: {result.stderr[-2000:]}"
    assert result.stdout.strip(), f"gpubox {' '.join(args)} printed nothing"
    found = []
    for line in result.stderr.splitlines():
        match = LINE.match(line)
        if match:
            found.append((len(match.group(1)) // 2, match.group(2)))
    assert found, "python -X importtime printed no import lines"
    return found


def _chain(imports: list[tuple[int, str]], index: int) -> str:
    """The modules whose import led to imports[index]: importtime prints a module after the ones
    it imported, one level less indented."""
    depth, name = imports[index]
    chain = [name]
    for d, n in imports[index + 1 :]:
        if d < depth:
            chain.append(n)
            depth = d
    return " <- ".join(chain)


def _offenders(imports: list[tuple[int, str]], banned: set[str]) -> list[str]:
    return [_chain(imports, i) for i, (_, name) in enumerate(imports) if name.split(".")[0] in banned]


@pytest.mark.parametrize(
    "args",
    [["--version"], ["--help"], ["queue", "--help"], ["top", "--help"], ["doctor", "--help"], ["metrics", "--help"]],
    ids=lambda args: " ".join(args),
)
def test_fast_commands_import_no_heavy_module(args: list[str]) -> None:
    imports = _imports(args)
    offenders = _offenders(imports, HEAVY)
    assert not offenders, f"gpubox {' '.join(args)} imports heavy modules:\n" + "\n".join(offenders[:10])


def test_version_answers_before_typer_and_rich() -> None:
    imports = _imports(["--version"])
    offenders = _offenders(imports, {"typer", "rich", "click"})
    assert not offenders, "gpubox --version imports the CLI framework:\n" + "\n".join(offenders[:10])
