"""The `nvml` fixture: the real pynvml, in this process, on the fake library."""

from __future__ import annotations

import ctypes
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pynvml
import pytest

from tests.fake_nvml.build import library_path
from tests.fake_nvml.scenarios import FakeBox


def shutdown_all(lib: ctypes.CDLL) -> None:
    """Bring the library's init count back to zero, whatever a test left behind."""
    for _ in range(64):
        if lib.nvmlShutdown() != 0:
            return


@pytest.fixture
def nvml(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Any]]:
    """Start the real pynvml on the fake library in this process: nvml(box) -> pynvml module."""
    saved = pynvml.nvmlLib
    libs: list[ctypes.CDLL] = []

    def start(box: FakeBox, variant: str | None = None, init: bool = True) -> Any:
        path = box.write(tmp_path / "scenario.txt")
        monkeypatch.setenv("FAKE_NVML_SCENARIO", str(path))
        lib = ctypes.CDLL(str(library_path(variant or box.library_variant)))
        libs.append(lib)
        shutdown_all(lib)
        pynvml.nvmlLib = lib
        pynvml._nvmlGetFunctionPointer_cache.clear()
        if init:
            pynvml.nvmlInit()
        return pynvml

    yield start
    for lib in libs:
        shutdown_all(lib)
    pynvml.nvmlLib = saved
    pynvml._nvmlGetFunctionPointer_cache.clear()
