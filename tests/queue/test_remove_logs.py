"""`queue clean` removes the log files of the jobs it removes, and only theirs, in one listing of
the logs folder (a listing per job made a clean of 20,000 jobs take minutes)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpubox.paths import resolve_paths
from gpubox.queue.client import remove_logs
from gpubox.queue.layout import logs_dir


def test_only_the_removed_jobs_files_go_and_the_folder_is_listed_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    paths = resolve_paths({"HOME": str(tmp_path), "GPUBOX_STATE_DIR": str(tmp_path / "state")})
    folder = logs_dir(paths)
    folder.mkdir(parents=True)
    names = ["1.1.out", "1.1.err", "1.2.out", "1.2.exit", "12.1.out", "2.1.err", "21.1.out", "3.1.out"]
    for name in names:
        (folder / name).write_text("x")
    listings = 0
    real_listdir, real_scandir = os.listdir, os.scandir

    def listdir(*args: object) -> list[str]:
        nonlocal listings
        listings += 1
        return real_listdir(*args)  # type: ignore[arg-type]

    def scandir(*args: object) -> object:
        nonlocal listings
        listings += 1
        return real_scandir(*args)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "listdir", listdir)
    monkeypatch.setattr(os, "scandir", scandir)
    remove_logs(paths, list(range(1, 3)) + list(range(100, 400)))
    assert listings == 1
    monkeypatch.undo()
    assert sorted(os.listdir(folder)) == ["12.1.out", "21.1.out", "3.1.out"]


def test_no_logs_folder_is_nothing_to_remove(tmp_path: Path) -> None:
    paths = resolve_paths({"HOME": str(tmp_path), "GPUBOX_STATE_DIR": str(tmp_path / "state")})
    remove_logs(paths, [1, 2])  # no folder yet: no error
    assert not logs_dir(paths).exists()
