"""Every probe test gets its own runtime directory, and the programs it starts inherit it."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    path = tmp_path / "runtime"
    monkeypatch.setenv("GPUBOX_RUNTIME_DIR", str(path))
    return path
