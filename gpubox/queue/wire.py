"""How clients and supervisors talk to the daemon: one JSON line each way over a Unix socket.

Submitting does not need the daemon (clients write the database); the socket only says "look
now" (`wake`, no answer), and answers `status`, `view` (why jobs wait, GPU indexes) and `stop`.
"""

from __future__ import annotations

import json
import socket
from pathlib import Path

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any


class Unreachable(Exception):
    """No daemon answers on the socket."""


def poke(path: Path) -> bool:
    """Tell the daemon to look at the queue now; False when no daemon listens."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(1.0)
            sock.connect(str(path))
            sock.sendall(b'{"op": "wake"}\n')
        return True
    except OSError:
        return False


def ask(path: Path, op: str, timeout: float = 5.0) -> dict[str, Any]:
    """Send one request and read its one-line answer."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            sock.sendall(json.dumps({"op": op}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
    except OSError as exc:
        raise Unreachable(f"no daemon answers on {path} ({exc.strerror or exc})") from None
    try:
        answer = json.loads(data)
    except ValueError:
        raise Unreachable(f"the daemon on {path} gave no answer") from None
    if not isinstance(answer, dict):
        raise Unreachable(f"the daemon on {path} gave a malformed answer")
    return answer
