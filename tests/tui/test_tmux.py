"""`gpubox top --demo` in a real terminal: tmux runs it at a fixed size, reads the screen, sends keys."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

pytestmark = [
    pytest.mark.tmux,
    pytest.mark.skipif(shutil.which("tmux") is None, reason="needs the tmux binary (apt-get install tmux)"),
]

REPO = Path(__file__).resolve().parents[2]
WAIT = 30.0  # generous: a slow machine still gets there, a hang still ends


class Terminal:
    """One tmux server of our own, so a test never touches the user's sessions."""

    def __init__(self, command: str, width: int = 120, height: int = 40) -> None:
        self.socket = f"gpubox-test-{uuid.uuid4().hex[:8]}"
        env = {k: v for k, v in os.environ.items() if k not in {"TMUX", "NO_COLOR"}}
        # "; echo EXIT=$?" leaves the exit code on screen, and the pane open to read it
        shell = f"cd {shlex.quote(str(REPO))} && {command}; echo EXIT=$?; sleep 120"
        self._tmux("new-session", "-d", "-s", "top", "-x", str(width), "-y", str(height), shell, env=env)

    def _tmux(self, *args: str, env: dict[str, str] | None = None) -> str:
        result = subprocess.run(
            ["tmux", "-L", self.socket, *args], capture_output=True, text=True, env=env, timeout=WAIT, check=True
        )
        return result.stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "top")

    def keys(self, *keys: str) -> None:
        self._tmux("send-keys", "-t", "top", *keys)

    def type(self, text: str) -> None:
        self._tmux("send-keys", "-t", "top", "-l", text)

    def wait_for(self, condition: Callable[[str], bool], what: str) -> str:
        deadline = time.monotonic() + WAIT
        while True:
            screen = self.screen()
            if condition(screen):
                return screen
            if time.monotonic() > deadline:
                raise AssertionError(f"gave up waiting for {what}; the screen:\n{screen}")
            time.sleep(0.1)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], capture_output=True, timeout=WAIT)


@pytest.fixture
def terminal() -> Iterator[Callable[[str], Terminal]]:
    opened: list[Terminal] = []

    def open_terminal(args: str) -> Terminal:
        term = Terminal(f"{shlex.quote(sys.executable)} -m gpubox top {args}")
        opened.append(term)
        return term

    yield open_terminal
    for term in opened:
        term.close()


def table_users(screen: str) -> set[str]:
    """The User column of the process rows: lines that start with a pid."""
    users = set()
    for line in screen.splitlines():
        parts = line.split()
        if len(parts) > 3 and parts[0].isdigit() and int(parts[0]) >= 10_000:
            users.add(parts[2])
    return users


def test_top_demo_in_a_real_terminal(terminal: Callable[[str], Terminal]) -> None:
    term = terminal("--demo --demo-gpus 2 --demo-processes 12")
    screen = term.wait_for(lambda s: "alice" in s and "q Quit" in s and "▁" in s, "the live view, a few samples in")
    assert "0 NVIDIA H100 80GB HBM3" in screen
    assert "occupancy – n/a: no GPM" in screen  # GPU 1 is a GeForce: no GPM
    assert "PID" in screen and "Loader wait" in screen
    assert "every 1 s" in screen
    assert table_users(screen) == {"alice", "bob", "carol", "dave", "erin", "frank"}

    # "/" and the text in one go, as a fast typist sends them: "/" is handled as it is read, so
    # the text lands in the box however busy the machine. (Pressing "/" again, or C-u, while the
    # app lags would not be safe: Textual runs a plain binding only once the key has passed the
    # focused widget, after the letters behind it.)
    term.type("/user:alice")
    term.wait_for(lambda s: "user:alice" in s and "words…" not in s, "the filter text")
    term.keys("Enter")
    screen = term.wait_for(lambda s: "filter: user:alice (2 shown)" in s, "the filter")
    assert table_users(screen) == {"alice"}

    term.keys("space")
    term.wait_for(lambda s: "PAUSED" in s, "the pause")
    term.keys("q")
    screen = term.wait_for(lambda s: "EXIT=" in s, "gpubox to exit")
    assert "EXIT=0" in screen


def test_a_bad_gpu_is_one_line_and_exit_code_2(terminal: Callable[[str], Terminal]) -> None:
    term = terminal("--demo --demo-gpus 2 --gpu 7")
    screen = term.wait_for(lambda s: "EXIT=" in s, "gpubox to exit")
    assert "EXIT=2" in screen
    assert "gpubox: no GPU 7 on this box (GPUs: 0, 1)" in screen
    assert "Traceback" not in screen
