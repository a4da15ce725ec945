"""gpubox's core (its top-level modules and the telemetry, probe, queue, doctor, ledger and
metrics packages, whichever exist) never imports Textual, Rich or Typer: those belong to gpubox.cli and
gpubox.tui, and the core must load without them in a training process, a daemon or a script.

Every core module is imported in one fresh interpreter, in turn; the report names the first
module whose import brought a forbidden one in.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

FORBIDDEN = ("textual", "rich", "typer", "click")
CORE_PACKAGES = ("telemetry", "probe", "queue", "doctor", "ledger", "metrics")

CHILD = r"""
import importlib, json, sys
forbidden = set(sys.argv[1].split(","))
report = {}
for name in sys.argv[2:]:
    before = {m.partition(".")[0] for m in sys.modules}
    importlib.import_module(name)
    brought = sorted(({m.partition(".")[0] for m in sys.modules} - before) & forbidden)
    if brought:
        report[name] = brought
print(json.dumps(report))
"""


def core_modules() -> list[str]:
    spec = importlib.util.find_spec("gpubox")
    assert spec is not None and spec.submodule_search_locations
    root = Path(next(iter(spec.submodule_search_locations)))
    names = ["gpubox"]
    names += [f"gpubox.{f.stem}" for f in sorted(root.glob("*.py")) if f.stem not in {"__init__", "__main__"}]
    for package in CORE_PACKAGES:
        for f in sorted((root / package).rglob("*.py")):
            parts = f.relative_to(root).with_suffix("").parts
            names.append(".".join(["gpubox", *(parts[:-1] if parts[-1] == "__init__" else parts)]))
    return names


def test_core_modules_are_found() -> None:
    names = core_modules()
    assert "gpubox.telemetry" in names and "gpubox.telemetry.model" in names, names


def test_core_imports_no_ui_framework() -> None:
    names = core_modules()
    result = subprocess.run(
        [sys.executable, "-c", CHILD, ",".join(FORBIDDEN), *names],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=120,
    )
    assert result.returncode == 0, f"importing the core failed:\n{result.stderr[-3000:]}"
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert not report, "core modules import UI frameworks (move the import into gpubox.cli or gpubox.tui):\n" + (
        "\n".join(f"{module}: {', '.join(brought)}" for module, brought in report.items())
    )
