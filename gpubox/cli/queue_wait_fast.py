"""`gpubox queue wait` without Typer: scripts call it after each `queue add`, and Typer's import
was half of its start-up.

Only a plain command line takes this path: job ids written as digits, `--timeout VALUE` (or
`--timeout=VALUE`) and `--json`. Anything else (`--help`, an unknown option, an id Typer would
refuse or read differently) returns None, and Typer parses it and owns the message. Both paths
run the same command (`wait_jobs_command`).
"""

from __future__ import annotations

from gpubox.cli.plain import run_plain
from gpubox.digits import ascii_int


def parse(args: list[str]) -> tuple[list[int], str | None, bool] | None:
    """(ids, timeout, as_json) for a plain command line; None for anything Typer should see."""
    ids: list[int] = []
    timeout: str | None = None
    as_json = False
    i = 0
    while i < len(args):
        arg = args[i]
        if (job_id := ascii_int(arg)) is not None:
            ids.append(job_id)
        elif arg == "--json":
            as_json = True
        elif arg.startswith("--timeout="):
            timeout = arg.partition("=")[2]
        elif arg == "--timeout" and i + 1 < len(args) and not args[i + 1].startswith("-"):
            i += 1
            timeout = args[i]
        else:
            return None
        i += 1
    if not ids:
        return None  # Typer says that an id is missing
    return list(dict.fromkeys(ids)), timeout, as_json  # each id once, as Typer's callback does


def run_fast(args: list[str]) -> int | None:
    """Run `gpubox queue wait ARGS` here; None when Typer must parse it."""
    parsed = parse(args)
    if parsed is None:
        return None
    ids, timeout, as_json = parsed
    from gpubox.cli.queue_support import json_failure, wait_jobs_command

    def wait() -> int:
        with json_failure("queue wait", as_json):
            return wait_jobs_command(ids, timeout, as_json)

    return run_plain(wait)
