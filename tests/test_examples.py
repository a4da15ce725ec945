"""The runnable examples in examples/ run as documented."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fake_nvml import scenarios
from tests.fake_nvml.build import fake_nvml_env
from tests.helpers import REPO


@pytest.mark.skipif(shutil.which("jq") is None, reason="the cron example pipes through jq, which is not installed")
def test_cron_snapshot_appends_one_json_line_per_run(tmp_path: Path) -> None:
    box = scenarios.hopper(gpus=2, processes=3)
    env = fake_nvml_env(box.write(tmp_path / "s.txt"))
    env["GPUBOX_SNAPSHOT_DIR"] = str(tmp_path / "log")
    env["GPUBOX"] = str(Path(sys.executable).parent / "gpubox")
    env["PATH"] = "/usr/bin:/bin"  # as short as cron's
    for _ in range(2):
        subprocess.run([str(REPO / "examples/cron/gpu-snapshot.sh")], env=env, check=True, timeout=60)
    (log,) = (tmp_path / "log").iterdir()
    lines = log.read_text().splitlines()
    assert len(lines) == 2
    docs = [json.loads(line) for line in lines]
    assert all(d["ok"] and len(d["data"]["gpus"]) == 2 and len(d["data"]["processes"]) == 3 for d in docs)
    assert os.access(REPO / "examples/cron/gpu-snapshot.sh", os.X_OK)
