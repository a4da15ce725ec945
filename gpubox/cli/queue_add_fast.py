"""`gpubox queue add` without Typer: the command scripts and cron run most, at half the start-up.

Only a well-formed command line takes this path: every option known, each value present, whole
numbers that parse. Anything else (`--help`, an unknown or malformed option, a value that starts
with a dash) returns None, and Typer parses it and owns the message. The option table is checked
against the Typer command by a test, so the two cannot drift apart.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpubox.cli.plain import run_plain

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any

TEXT = {"--name": "name", "--kind": "kind", "--gpu-mem": "gpu_mem"}
TEXT |= {"--time-limit": "time_limit", "--cwd": "cwd", "--file": "file"}
WHOLE = {"--gpus": "gpus", "--priority": "priority", "--retries": "retries"}
MANY = {"--tag": "tag", "--env": "env", "--gpu": "gpu", "--after": "after"}
FLAGS = {"--shell": "shell", "--no-probe": "no_probe", "--share": "share", "--json": "as_json", "--wait": "wait"}
_INT = re.compile(r"[0-9]+")


def parse(args: list[str]) -> tuple[list[str], dict[str, Any]] | None:
    """(command, option values) for a plain command line; None for anything Typer should see."""
    values: dict[str, Any] = {"tag": [], "env": [], "gpu": [], "after": []}
    i = 0
    command: list[str] = []
    while i < len(args):
        arg = args[i]
        if arg == "--":
            command = args[i + 1 :]
            break
        if not arg.startswith("-") or arg == "-":
            command = args[i:]  # options end at the command's name, as in Typer's add
            break
        name, eq, value = arg.partition("=")
        if name in FLAGS and not eq:
            values[FLAGS[name]] = True
            i += 1
            continue
        if name not in TEXT and name not in WHOLE and name not in MANY:
            return None
        if not eq:
            if i + 1 >= len(args) or args[i + 1].startswith("-"):
                return None
            value = args[i + 1]
        i += 1 if eq else 2
        if name in WHOLE:
            if not _INT.fullmatch(value):
                return None
            values[WHOLE[name]] = int(value)
        elif name in MANY:
            values[MANY[name]].append(value)
        else:
            values[TEXT[name]] = value
    return command, values


def run_fast(args: list[str]) -> int | None:
    """Run `gpubox queue add ARGS` here; None when Typer must parse it."""
    parsed = parse(args)
    if parsed is None:
        return None
    command, v = parsed
    from gpubox.cli.queue_support import add_jobs, joined
    from gpubox.queue.submit import AddOptions

    opts = AddOptions(
        name=v.get("name"),
        kind=v.get("kind"),
        gpus=v.get("gpus"),
        gpu=joined(v["gpu"]),
        gpu_mem=v.get("gpu_mem"),
        priority=v.get("priority"),
        after=joined(v["after"]),
        time_limit=v.get("time_limit"),
        retries=v.get("retries"),
        tags=tuple(v["tag"]),
        env=tuple(v["env"]),
        cwd=v.get("cwd"),
        shell=bool(v.get("shell")),
        probe=not v.get("no_probe"),
        share=bool(v.get("share")),
    )
    file = Path(v["file"]) if "file" in v else None

    def add() -> int:
        return add_jobs(command or None, opts, file, bool(v.get("as_json")), bool(v.get("wait")))

    return run_plain(add)
