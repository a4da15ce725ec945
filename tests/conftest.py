"""Fixtures every test gets: a private HOME and XDG tree, so no developer's config leaks in."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def isolated_env(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    for name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR", "NO_COLOR"):
        monkeypatch.delenv(name, raising=False)
    for name in list(os.environ):
        if name.startswith("GPUBOX_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("GPUBOX_SYSTEM_CONFIG", str(home / "etc-gpubox-config.toml"))
    yield home


from tests.fake_nvml.harness import nvml  # noqa: E402,F401  (the fixture, for every test)
