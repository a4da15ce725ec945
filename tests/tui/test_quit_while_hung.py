"""q ends gpubox top even while a sample is stuck in the driver (a GPU off the bus can do that)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import threading
    from gpubox.telemetry.simulated import SimulatedBackend
    from gpubox.tui.top_app import TopApp

    class StuckBackend(SimulatedBackend):
        def sample(self):
            if self.stuck:
                threading.Event().wait()  # never returns, like a hung driver call
            self.stuck = True
            return super().sample()

    backend = StuckBackend(gpus=1, processes=2)
    backend.stuck = False

    async def press_q_while_stuck(pilot):
        app = pilot.app
        while not (app.refreshes >= 1 and app.poller.in_flight):
            await pilot.pause(0.05)
        await pilot.press("q")

    app = TopApp(backend, interval=0.05)
    app.run(headless=True, auto_pilot=press_q_while_stuck)
    print("exited", app.return_code, flush=True)
    """
)


def test_q_exits_while_a_sample_hangs() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL
    )
    assert done.returncode == 0, done.stderr
    assert "exited 0" in done.stdout
