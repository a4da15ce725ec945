"""Helpers shared by tests."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def run_gpubox(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """Run the real CLI in a subprocess (what a script or cron job sees)."""
    full_env = dict(os.environ)
    full_env.update(env or {})
    return subprocess.run(
        [sys.executable, "-m", "gpubox", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )
