"""gpubox started with a standard stream closed (`gpubox ls >&-`, `2>&-`, `<&-`), as a shell or a
careless service file starts it: output that cannot be written is one line and exit 1, as on a
full disk (a failing command's envelope lost leaves the failure's own line and code); a closed
stderr costs the diagnostics, never the exit code; a closed stdin matters only to a command
that reads it. Never a traceback, never a hang. Real processes, real shells."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpubox.exit_codes import ExitCode
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.store import LedgerStore
from gpubox.queue.jobs import JobSpec
from gpubox.queue.store import JobStore
from tests.ledger.builders import T0, Clock, drive, gpu, job, proc, snap

CLOSED_STDOUT = "gpubox: cannot write the output: standard output is closed\n"


def _env(home: Path) -> dict[str, str]:
    return {
        **os.environ,
        "HOME": str(home),
        "GPUBOX_STATE_DIR": str(home / "state"),
        "GPUBOX_RUNTIME_DIR": str(home / "run"),
    }


def closed(redirects: str, args: tuple[str, ...], env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`gpubox ARGS` run by a shell with `redirects` (as `>&-`); what is left open is captured."""
    return subprocess.run(
        ["sh", "-c", f'exec "$@" {redirects}', "sh", sys.executable, "-m", "gpubox", *args],
        capture_output=True,
        text=True,
        env=dict(env),
        timeout=60,
    )


def _with_a_ledger(home: Path) -> None:
    """An hour of one GPU held by job 1, so `report` has rows to write."""
    store = LedgerStore(home / "state" / "ledger.db")
    clock = Clock()
    recorder = Recorder(store, interval_s=5, clock=clock)
    drive(
        recorder,
        clock,
        lambda t: (snap(t, [gpu("GPU-0", 0, gpu_busy=50.0)], [proc(10, job_id=1)]), [job(1, "GPU-0")]),
        T0,
        T0 + 3600,
    )
    recorder.close()
    store.close()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).isoformat()


REPORT = ("report", "--by", "job", "--since", _iso(T0 - 3600), "--until", _iso(T0 + 7200))

WRITERS = [
    ("--version",),  # answered before Typer
    ("--help",),
    ("queue", "ls"),
    ("queue", "ls", "--json"),
    ("top", "--once", "--demo", "--interval", "0.05"),  # rich's console
    ("metrics", "dump", "--demo"),
    REPORT,
    (*REPORT, "--csv"),
]


@pytest.mark.parametrize("args", WRITERS, ids=" ".join)
def test_output_to_a_closed_stdout_is_one_line_and_exit_1(tmp_path: Path, args: tuple[str, ...]) -> None:
    _with_a_ledger(tmp_path)
    assert closed("", args, _env(tmp_path)).returncode == 0  # the command itself works here
    result = closed(">&-", args, _env(tmp_path))
    assert (result.returncode, result.stderr) == (ExitCode.FAILED, CLOSED_STDOUT)


BAD_SETTING = {"GPUBOX_COLOR": "maybe"}
BAD_SETTING_LINE = "gpubox: environment variable GPUBOX_COLOR: color: expected true or false, got 'maybe'\n"
FAILING_JSON = [
    (("top", "--once", "--demo", "--json"), BAD_SETTING, ExitCode.USAGE, BAD_SETTING_LINE),
    (("report", "--json"), BAD_SETTING, ExitCode.USAGE, BAD_SETTING_LINE),
    (("doctor", "--json"), BAD_SETTING, ExitCode.USAGE, BAD_SETTING_LINE),
    (("queue", "add", "--json", "--", "true"), BAD_SETTING, ExitCode.USAGE, BAD_SETTING_LINE),  # without Typer
    (("queue", "show", "999", "--json"), {}, ExitCode.USAGE, "gpubox: job 999 does not exist\n"),
    (("daemon", "status", "--json"), {}, ExitCode.DAEMON_UNREACHABLE, "gpubox: the daemon is not running"),
]


@pytest.mark.parametrize("redirect", [">&-", ">/dev/full"], ids=["closed", "full"])
@pytest.mark.parametrize(("args", "env", "code", "line"), FAILING_JSON, ids=[" ".join(f[0]) for f in FAILING_JSON])
def test_a_failing_json_command_whose_envelope_cannot_be_written_still_says_why(
    tmp_path: Path, redirect: str, args: tuple[str, ...], env: dict[str, str], code: int, line: str
) -> None:
    """Its one line and exit code, as with stdout open: not Python's "Exception ignored" and exit
    120 at exit (a closed stdout), nor an error about the output in place of the failure's own."""
    if redirect == ">/dev/full" and not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full here")
    opened = closed("", args, {**_env(tmp_path), **env})
    assert opened.returncode == code and json.loads(opened.stdout)["exit_code"] == code  # the envelope, when it can
    result = closed(redirect, args, {**_env(tmp_path), **env})
    assert result.returncode == code, result.stderr
    assert result.stderr.startswith(line) and result.stderr.count("\n") == 1, result.stderr


def test_a_plain_queue_add_to_a_closed_stdout_stores_the_job_and_says_its_id_went_nowhere(tmp_path: Path) -> None:
    env = _env(tmp_path)
    try:
        result = closed(">&-", ("queue", "add", "--gpus", "0", "--", "true"), env)
        # The id went nowhere: stderr says it, so a script need not add the job again to learn it.
        assert (result.returncode, result.stderr) == (ExitCode.FAILED, CLOSED_STDOUT[:-1] + " (job 1 was added)\n")
        with JobStore(tmp_path / "state" / "queue.db") as store:
            assert [j.spec.argv for j in store.list(None)] == [("true",)]
        (tmp_path / "jobs.txt").write_text("true\ntrue\ntrue\n")
        result = closed(">&-", ("queue", "add", "--gpus", "0", "--file", str(tmp_path / "jobs.txt")), env)
        assert result.stderr == CLOSED_STDOUT[:-1] + " (jobs 2 to 4 were added)\n"
    finally:
        subprocess.run([sys.executable, "-m", "gpubox", "daemon", "stop"], capture_output=True, env=env, timeout=60)


def test_no_file_gpubox_opens_takes_a_closed_stdout(tmp_path: Path) -> None:
    """The database is opened on the lowest free fd: were it fd 1, the listing would go into it."""
    with JobStore(tmp_path / "state" / "queue.db") as store:
        store.add(JobSpec(argv=("echo", "marker-in-the-listing"), cwd="/", env={}, gpus=0, probe=False))
    db = tmp_path / "state" / "queue.db"
    before = db.read_bytes()
    result = closed(">&-", ("queue", "ls", "--all", "--json"), _env(tmp_path))
    assert (result.returncode, result.stderr) == (ExitCode.FAILED, CLOSED_STDOUT)
    assert db.read_bytes() == before
    assert not any(b"marker-in-the-listing" in p.read_bytes() for p in db.parent.iterdir() if p.name != db.name)


def test_stdout_and_stderr_both_closed(tmp_path: Path) -> None:
    result = closed(">&- 2>&-", ("queue", "ls"), _env(tmp_path))
    assert (result.returncode, result.stdout, result.stderr) == (ExitCode.FAILED, "", "")


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("queue", "show", "999"), ExitCode.USAGE),  # an error said to no one
        (("queue", "add", "--no-such-option"), ExitCode.USAGE),
        (("top", "--once", "--demo", "--gpu", "9"), ExitCode.USAGE),
        (("--version",), ExitCode.OK),
    ],
    ids=lambda value: " ".join(value) if isinstance(value, tuple) else str(int(value)),
)
def test_a_closed_stderr_keeps_the_exit_code(tmp_path: Path, args: tuple[str, ...], code: int) -> None:
    result = closed("2>&-", args, _env(tmp_path))
    assert result.returncode == code, result
    assert "Traceback" not in result.stdout
    if code == ExitCode.OK:
        assert result.stdout == "gpubox 0.1.0\n"


def test_a_closed_stdin_matters_only_to_a_command_that_reads_it(tmp_path: Path) -> None:
    env = _env(tmp_path)
    listed = closed("<&-", ("queue", "ls"), env)
    assert (listed.returncode, listed.stdout, listed.stderr) == (0, "no jobs\n", "")
    read = closed("<&-", ("queue", "add", "--file", "-"), env)
    assert (read.returncode, read.stderr) == (ExitCode.USAGE, "gpubox: cannot read -: standard input is closed\n")
    with JobStore(tmp_path / "state" / "queue.db") as store:
        assert store.list(None) == []  # nothing read, nothing stored


def test_a_command_run_by_gpubox_gets_the_streams_closed_as_gpubox_got_them(tmp_path: Path) -> None:
    check = "import sys; print(sys.stdin, sys.stdout, file=sys.stderr)"  # None where Python found it closed
    result = closed("<&- >&-", ("run", "--", sys.executable, "-c", check), _env(tmp_path))
    assert (result.returncode, result.stderr) == (0, "None None\n")
