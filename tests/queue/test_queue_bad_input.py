"""Bad input to `gpubox queue` and `gpubox daemon`, through the real CLI.

Every case must end with exactly one line on stderr ("gpubox: ..."), no traceback, the exit code
from gpubox.exit_codes, and a database that is exactly as it was: every row of jobs, attempts and
paused is compared before and after. Most cases run against one seeded queue, shared by the
module, that holds a job in every useful state: two that succeeded, one that failed, one that is
running and one that is queued behind a paused queue.
"""

from __future__ import annotations

import os
import random
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

import pytest

from gpubox.queue.jobs import JobSpec
from gpubox.queue.store import JobStore
from tests.queue.conftest import QueueBox, kill_everything, queue_env

Snapshot = dict[str, list[tuple[Any, ...]]]


def snapshot(db: Path) -> Snapshot:
    """Every row of the queue's tables, read-only."""
    conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return {
            table: list(conn.execute(f"SELECT * FROM {table} ORDER BY rowid").fetchall())
            for table in ("jobs", "attempts", "paused")
        }
    finally:
        conn.close()


def assert_one_error_line(result: subprocess.CompletedProcess[str], code: int, fragment: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, (
        f"expected one line on stderr, got {len(lines)}: {result.stderr!r} (stdout {result.stdout!r})"
    )
    assert lines[0].startswith("gpubox: "), lines[0]
    assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert result.returncode == code, f"exit {result.returncode}, expected {code}: {lines[0]}"


@cache
def nvml_present() -> bool:
    """Whether this machine has a working NVML (checked in a child, so this process stays clean)."""
    probe = subprocess.run(
        [sys.executable, "-c", "import pynvml; pynvml.nvmlInit()"],
        capture_output=True,
        timeout=30,
    )
    return probe.returncode == 0


# The seeded queue


@dataclass
class Seeded:
    box: QueueBox
    ids: dict[str, int]
    files: Path

    def args(self, template: tuple[str, ...]) -> list[str]:
        return [a.format(files=self.files, **self.ids) for a in template]


def _wait_stable(box: QueueBox, timeout: float = 10.0) -> None:
    """Until two snapshots half a second apart agree: nothing is moving in the seeded queue."""
    deadline = time.monotonic() + timeout
    last = snapshot(box.db)
    while True:
        time.sleep(0.5)
        now = snapshot(box.db)
        if now == last:
            return
        assert time.monotonic() < deadline, "the seeded queue did not settle"
        last = now


JOB_FILES = {
    "bad-shell-line": "true\necho 'unterminated\n",
    "bad-json": 'true\n{"cmd": \n',
    "unknown-key": '{"cmd": "true", "gpus": 0, "bogus": 1}\n',
    "cmd-and-argv": '{"cmd": "true", "argv": ["true"], "gpus": 0}\n',
    "argv-not-list": '{"argv": "true", "gpus": 0}\n',
    "gpus-not-int": '{"cmd": "true", "gpus": "two"}\n',
    "empty-object": "true\n{}\n",
    "empty": "",
    "only-comments": "# nothing to run\n\n   \n# still nothing\n",
    "three-good-one-bad": 'true\n{"cmd": "echo hi", "gpus": 0}\n\n{"cmd": "true", "kind": "foo"}\necho fine\n',
    "bad-tag": '{"cmd": "true", "gpus": 0, "tags": {"a b": "c"}}\n',
    "missing-after": 'true\n{"cmd": "true", "gpus": 0, "after": [999]}\n',
    "empty-after": 'true\n{"cmd": "true", "gpus": 0, "after": ""}\n',
    "retries-negative": 'true\n{"cmd": "true", "gpus": 0, "retries": -1}\n',
    "priority-huge": '{"cmd": "true", "gpus": 0}\n{"cmd": "true", "gpus": 0, "priority": 99999999999999999999}\n',
    "nul-in-command": 'true\n{"argv": ["tr\\u0000ue"], "gpus": 0}\n',
    "good": "true\n",
    "env-name-with-equals": '{"cmd": "env", "gpus": 0, "env": {"A=B": "1"}}\n',
    "tag-name-with-equals": '{"cmd": "true", "gpus": 0, "tags": {"team=x": "nlp"}}\n',
    "lone-surrogate": 'true\n{"cmd": "echo \\ud800", "gpus": 0}\n',
    "lone-surrogate-env": '{"cmd": "true", "gpus": 0, "env": {"X": "\\udfff"}}\n',
    "tag-twice": 'true\n{"cmd": "true", "gpus": 0, "tags": {"team": "a", "team": "b"}}\n',
    "tag-escape": '{"cmd": "true", "gpus": 0, "tags": {"team": "a\\u001b[2Jb"}}\n',
    "kind-twice": '{"cmd": "true", "gpus": 0, "kind": "train", "kind": "infer"}\n',
    "json-list": 'true\n["python", "x.py"]\n',
    "gpus-no-nvml": 'true\n{"cmd": "true", "gpus": 2}\n',
}


@pytest.fixture(scope="module")
def seeded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seeded]:
    home = tmp_path_factory.mktemp("seeded-queue")
    env = queue_env(home)
    files = home / "files"
    files.mkdir()
    for name, text in JOB_FILES.items():
        (files / name).write_text(text)
    box = QueueBox(home, env)
    ids: dict[str, int] = {}
    with pytest.MonkeyPatch.context() as mp:
        # No developer setting may reach the CLI or the daemon it starts.
        for name in list(os.environ):
            if name.startswith("GPUBOX_") or name in ("XDG_CONFIG_HOME", "XDG_STATE_HOME", "XDG_RUNTIME_DIR"):
                mp.delenv(name)
        try:
            box.start_daemon()  # listening before the first command, which then starts none of its own
            ids["done1"] = box.add("--gpus", "0", "--", "true")
            ids["done2"] = box.add("--gpus", "0", "--", "true")
            assert box("queue", "wait", str(ids["done1"]), str(ids["done2"])).returncode == 0
            ids["failed"] = box.add("--gpus", "0", "--", "false")
            assert box("queue", "wait", str(ids["failed"])).returncode == 1
            ids["running"] = box.add("--gpus", "0", "--name", "sleeper", "--", "sleep", "300")
            box.wait_state(ids["running"], ("running",))
            assert box("queue", "pause").returncode == 0
            ids["queued"] = box.add("--gpus", "0", "--name", "waiting", "--", "true")
            _wait_stable(box)
            rows = {r[0]: r[1] for r in box.rows("SELECT id, state FROM jobs")}
            assert rows == {
                ids["done1"]: "succeeded",
                ids["done2"]: "succeeded",
                ids["failed"]: "failed",
                ids["running"]: "running",
                ids["queued"]: "queued",
            }
            yield Seeded(box, ids, files)
        finally:
            if "running" in ids:
                box("queue", "cancel", str(ids["running"]), timeout=20)
            kill_everything(box)


# Cases against the seeded queue: (id, args, exit code, fragment of the one line on stderr)

USAGE, FAILED, NO_GPU, TIMED_OUT = 2, 1, 3, 124
NEEDS_NO_NVML = {"add-gpu-no-nvml", "add-gpu-mem-no-nvml", "add-gpus-2-no-nvml", "pause-gpu", "resume-gpu", "edit-gpu"}
NEEDS_NO_NVML |= {"file-gpus-no-nvml"}

CASES: list[tuple[str, tuple[str, ...], int, str]] = [
    # queue add: option values
    ("unknown-kind", ("queue", "add", "--kind", "foo", "--", "true"), USAGE, "unknown kind 'foo'"),
    ("unknown-kind-json", ("queue", "add", "--json", "--kind", "foo", "--", "true"), USAGE, "unknown kind 'foo'"),
    ("gpus-negative", ("queue", "add", "--gpus", "-1", "--", "true"), USAGE, "invalid GPU count -1"),
    ("gpu-mem-negative", ("queue", "add", "--gpu-mem", "-3", "--", "true"), USAGE, "invalid size '-3'"),
    ("gpu-mem-bad-unit", ("queue", "add", "--gpu-mem", "40Q", "--", "true"), USAGE, "invalid size '40Q'"),
    ("gpu-mem-zero", ("queue", "add", "--gpu-mem", "0", "--", "true"), USAGE, "invalid size '0'"),
    ("gpu-mem-text", ("queue", "add", "--gpu-mem", "lots", "--", "true"), USAGE, "invalid size 'lots'"),
    ("time-limit-bad-unit", ("queue", "add", "--time-limit", "2x", "--", "true"), USAGE, "invalid duration '2x'"),
    ("time-limit-negative", ("queue", "add", "--time-limit", "-5m", "--", "true"), USAGE, "invalid duration '-5m'"),
    ("time-limit-zero", ("queue", "add", "--time-limit", "0", "--", "true"), USAGE, "invalid duration '0'"),
    (
        "time-limit-past-a-century",
        ("queue", "add", "--time-limit", "99999999999999999999999d", "--", "true"),
        USAGE,
        "invalid duration '99999999999999999999999d': at most 36500d (100 years)",
    ),
    ("time-limit-empty", ("queue", "add", "--time-limit", "", "--", "true"), USAGE, "invalid duration ''"),
    ("time-limit-trailing", ("queue", "add", "--time-limit", "1h30", "--", "true"), USAGE, "invalid duration '1h30'"),
    ("retries-negative", ("queue", "add", "--retries", "-1", "--", "true"), USAGE, "invalid retries -1"),
    ("retries-too-many", ("queue", "add", "--retries", "1000", "--", "true"), USAGE, "invalid retries 1000"),
    ("priority-too-high", ("queue", "add", "--priority", "5000", "--", "true"), USAGE, "invalid priority 5000"),
    ("priority-too-low", ("queue", "add", "--priority", "-5000", "--", "true"), USAGE, "invalid priority -5000"),
    ("after-missing-job", ("queue", "add", "--after", "999", "--", "true"), USAGE, "job 999"),
    ("after-not-a-number", ("queue", "add", "--after", "abc", "--", "true"), USAGE, "invalid job id 'abc'"),
    ("after-twice", ("queue", "add", "--after", "1,1", "--", "true"), USAGE, "duplicate job id 1"),
    ("after-zero", ("queue", "add", "--after", "0", "--", "true"), USAGE, "invalid job id '0'"),
    ("after-trailing-comma", ("queue", "add", "--after", "1,", "--", "true"), USAGE, "invalid job id ''"),
    # A script's `--after "$ID"` whose submission failed: never a job with no dependency.
    ("after-empty", ("queue", "add", "--after", "", "--", "true"), USAGE, "--after is empty"),
    ("after-blank", ("queue", "add", "--after=  ", "--", "true"), USAGE, "--after is empty"),
    (
        "after-empty-in-file",
        ("queue", "add", "--file", "{files}/empty-after"),
        USAGE,
        "empty-after:2: --after is empty",
    ),
    # Refused as written, before any GPU is looked for (this box may have no NVML).
    ("gpu-empty", ("queue", "add", "--gpu", "", "--", "true"), USAGE, "--gpu is empty"),
    ("no-command", ("queue", "add"), USAGE, "no command given"),
    ("no-command-after-dashes", ("queue", "add", "--"), USAGE, "no command given"),
    ("shell-empty-command", ("queue", "add", "--shell", "--", ""), USAGE, "no command given"),
    ("empty-name", ("queue", "add", "--name", "", "--", "true"), USAGE, "invalid name ''"),
    ("two-line-name", ("queue", "add", "--name", "a\nb", "--", "true"), USAGE, "invalid name 'a\\nb'"),
    ("tag-without-value", ("queue", "add", "--tag", "novalue", "--", "true"), USAGE, "invalid tag 'novalue'"),
    ("tag-without-key", ("queue", "add", "--tag", "=x", "--", "true"), USAGE, "invalid tag '=x'"),
    ("tag-empty-value", ("queue", "add", "--tag", "team=", "--", "true"), USAGE, "invalid tag 'team='"),
    ("tag-two-lines", ("queue", "add", "--tag", "team=a\nb", "--", "true"), USAGE, "expected a value on one line"),
    (
        "env-name-digit",
        ("queue", "add", "--env", "1BAD=x", "--", "true"),
        USAGE,
        "invalid environment variable '1BAD=x'",
    ),
    ("env-no-equals", ("queue", "add", "--env", "NOEQUALS", "--", "true"), USAGE, "invalid environment variable"),
    # a key given twice with two values: which was meant cannot be known
    (
        "tag-twice",
        ("queue", "add", "--gpus", "0", "--tag", "team=a", "--tag", "team=b", "--", "true"),
        USAGE,
        "gpubox: --tag team=a and --tag team=b disagree: give team once",
    ),
    (
        "tag-twice-typer",  # a value that starts with a dash: Typer parses this one
        ("queue", "add", "--name", "-x", "--gpus", "0", "--tag=team=a", "--tag", "team=b", "--", "true"),
        USAGE,
        "gpubox: --tag team=a and --tag team=b disagree: give team once",
    ),
    (
        "env-twice",
        ("queue", "add", "--gpus", "0", "--env", "K=1", "--env", "K=2", "--", "true"),
        USAGE,
        "gpubox: --env K=1 and --env K=2 disagree: give K once",
    ),
    (
        "tag-twice-with-file",  # the command line's own error, not the file's first line's
        ("queue", "add", "--gpus", "0", "--tag", "team=a", "--tag", "team=b", "--file", "{files}/good"),
        USAGE,
        "gpubox: --tag team=a and --tag team=b disagree: give team once",
    ),
    (
        "cwd-missing",
        ("queue", "add", "--cwd", "/does/not/exist", "--", "true"),
        USAGE,
        "/does/not/exist does not exist",
    ),
    ("cwd-empty", ("queue", "add", "--cwd", "", "--", "true"), USAGE, "the working directory (--cwd) is empty"),
    ("cwd-a-file", ("queue", "add", "--cwd", "{files}/good", "--", "true"), USAGE, "good is not a directory"),
    ("gpus-0-with-gpu-mem", ("queue", "add", "--gpus", "0", "--gpu-mem", "1G", "--", "true"), USAGE, "--gpus 0"),
    (
        "add-gpu-no-nvml",
        ("queue", "add", "--gpu", "0", "--", "true"),
        NO_GPU,
        "this job asks for GPUs, but NVML cannot start: ",
    ),
    (
        "add-gpu-mem-no-nvml",
        ("queue", "add", "--gpu-mem", "1G", "--", "true"),
        NO_GPU,
        "this job asks for GPUs, but NVML cannot start: ",
    ),
    (
        "add-gpus-2-no-nvml",
        ("queue", "add", "--gpus", "2", "--", "true"),
        NO_GPU,
        "this job asks for GPUs, but NVML cannot start: ",
    ),
    (
        "file-gpus-no-nvml",  # which line of the file asks for GPUs, as for any line refused
        ("queue", "add", "--file", "{files}/gpus-no-nvml"),
        NO_GPU,
        "gpus-no-nvml:2: this job asks for GPUs, but NVML cannot start: ",
    ),
    # queue add: what Typer itself rejects
    ("gpus-not-a-number", ("queue", "add", "--gpus", "abc", "--", "true"), USAGE, "'abc' is not a valid int"),
    ("priority-not-a-number", ("queue", "add", "--priority", "high", "--", "true"), USAGE, "'high' is not a valid int"),
    ("unknown-option", ("queue", "add", "--bogus", "--", "true"), USAGE, "No such option: --bogus"),
    ("option-without-value", ("queue", "add", "--kind"), USAGE, "'--kind' requires an argument"),
    # queue add --file
    ("file-missing", ("queue", "add", "--file", "{files}/nope"), USAGE, "cannot read {files}/nope"),
    ("file-is-a-directory", ("queue", "add", "--file", "{files}"), USAGE, "cannot read {files}"),
    ("file-bad-line", ("queue", "add", "--file", "{files}/bad-shell-line"), USAGE, "bad-shell-line:2: No closing"),
    ("file-bad-json", ("queue", "add", "--file", "{files}/bad-json"), USAGE, "bad-json:2: not valid JSON"),
    (
        "file-unknown-key",
        ("queue", "add", "--file", "{files}/unknown-key"),
        USAGE,
        "unknown-key:1: unknown key 'bogus'",
    ),
    (
        "file-cmd-and-argv",
        ("queue", "add", "--file", "{files}/cmd-and-argv"),
        USAGE,
        'cmd-and-argv:1: give the command as "cmd"',
    ),
    (
        "file-argv-not-list",
        ("queue", "add", "--file", "{files}/argv-not-list"),
        USAGE,
        "argv-not-list:1: 'argv' must be a list",
    ),
    (
        "file-gpus-not-int",
        ("queue", "add", "--file", "{files}/gpus-not-int"),
        USAGE,
        "gpus-not-int:1: 'gpus' must be a whole",
    ),
    (
        "file-empty-object",
        ("queue", "add", "--file", "{files}/empty-object"),
        USAGE,
        "empty-object:2: give the command",
    ),
    ("file-empty", ("queue", "add", "--file", "{files}/empty"), USAGE, "empty: no jobs in the file"),
    ("file-only-comments", ("queue", "add", "--file", "{files}/only-comments"), USAGE, "only-comments: no jobs"),
    (
        "file-one-bad-adds-none",
        ("queue", "add", "--gpus", "0", "--file", "{files}/three-good-one-bad"),
        USAGE,
        "three-good-one-bad:4: unknown kind 'foo'",
    ),
    ("file-retries", ("queue", "add", "--file", "{files}/retries-negative"), USAGE, "negative:2: invalid retries -1"),
    ("file-priority", ("queue", "add", "--file", "{files}/priority-huge"), USAGE, "priority-huge:2: invalid priority"),
    ("file-nul", ("queue", "add", "--file", "{files}/nul-in-command"), USAGE, "nul-in-command:2: the command contains"),
    ("file-bad-tag", ("queue", "add", "--file", "{files}/bad-tag"), USAGE, "bad-tag:1: invalid tag 'a b=c'"),
    ("file-env-name-equals", ("queue", "add", "--file", "{files}/env-name-with-equals"), USAGE, "'A=B' in 'env'"),
    ("file-tag-twice", ("queue", "add", "--file", "{files}/tag-twice"), USAGE, "tag-twice:2: 'team' is given twice"),
    ("file-key-twice", ("queue", "add", "--file", "{files}/kind-twice"), USAGE, "kind-twice:1: 'kind' is given twice"),
    ("file-tag-name-equals", ("queue", "add", "--file", "{files}/tag-name-with-equals"), USAGE, "'team=x' in 'tags'"),
    ("file-tag-escape", ("queue", "add", "--file", "{files}/tag-escape"), USAGE, "expected a value on one line"),
    ("file-json-list", ("queue", "add", "--file", "{files}/json-list"), USAGE, "json-list:2: a JSON list is not a job"),
    (
        "file-lone-surrogate",
        ("queue", "add", "--file", "{files}/lone-surrogate"),
        USAGE,
        "lone-surrogate:2: the command holds '\\ud800', which is not text a program can be given",
    ),
    (
        "file-lone-surrogate-env",
        ("queue", "add", "--file", "{files}/lone-surrogate-env"),
        USAGE,
        "the environment variable 'X' holds '\\udfff'",
    ),
    # names and directories the terminal would print on two lines, or move the cursor with
    ("name-escape-sequence", ("queue", "add", "--name", "x\x1b[2J", "--", "true"), USAGE, "'x\\x1b[2J': expected one"),
    ("name-carriage-return", ("queue", "add", "--name", "a\rZZ", "--", "true"), USAGE, "no control characters"),
    ("name-newline", ("queue", "add", "--name", "a\nb", "--", "true"), USAGE, "invalid name 'a\\nb'"),
    ("name-not-utf8", ("queue", "add", "--name", "n\udce9", "--", "true"), USAGE, "expected UTF-8 text"),
    ("name-c1-csi", ("queue", "add", "--name", "x\x9b2J", "--", "true"), USAGE, "no control characters"),
    ("name-line-separator", ("queue", "add", "--name", "a\u2028b", "--", "true"), USAGE, "no control characters"),
    ("tag-c1-csi", ("queue", "add", "--tag", "team=x\x9b2J", "--", "true"), USAGE, "expected a value on one line"),
    ("tag-not-utf8", ("queue", "add", "--tag", "team=n\udce9", "--", "true"), USAGE, "expected UTF-8 text"),
    ("cwd-newline", ("queue", "add", "--cwd", "/nowhere/x\ny", "--", "true"), USAGE, "/nowhere/x\\ny does not exist"),
    (
        "file-missing-after",
        ("queue", "add", "--gpus", "0", "--file", "{files}/missing-after"),
        USAGE,
        "missing-after:2: job 999",
    ),
    (
        "file-default-kind-bad",
        ("queue", "add", "--kind", "foo", "--file", "{files}/good"),
        USAGE,
        "good:1: unknown kind 'foo'",
    ),
    ("file-and-command", ("queue", "add", "--file", "{files}/good", "--", "true"), USAGE, "either --file or a command"),
    ("file-stdin-empty", ("queue", "add", "--file", "-"), USAGE, "-: no jobs in the file"),
    # queue ls / show / logs
    ("ls-unknown-state", ("queue", "ls", "--state", "done"), USAGE, "unknown state 'done'"),
    ("ls-state-without-value", ("queue", "ls", "--state"), USAGE, "'--state' requires an argument"),
    ("show-missing-job", ("queue", "show", "999"), USAGE, "job 999 does not exist"),
    ("show-not-a-number", ("queue", "show", "abc"), USAGE, "'abc' is not a valid int"),
    ("show-without-id", ("queue", "show"), USAGE, "Missing argument 'ID'"),
    ("logs-missing-job", ("queue", "logs", "999"), USAGE, "job 999 does not exist"),
    ("logs-never-started", ("queue", "logs", "{queued}"), FAILED, "has not started yet"),
    ("logs-no-such-attempt", ("queue", "logs", "{running}", "--attempt", "5"), USAGE, "has no attempt 5"),
    ("logs-attempt-zero", ("queue", "logs", "{done1}", "--attempt", "0"), USAGE, "has no attempt 0"),
    # queue cancel
    ("cancel-missing-job", ("queue", "cancel", "999"), USAGE, "job 999 does not exist"),
    ("cancel-queued-and-missing", ("queue", "cancel", "{queued}", "999"), USAGE, "job 999 does not exist"),
    ("cancel-running-and-missing", ("queue", "cancel", "{running}", "999"), USAGE, "job 999 does not exist"),
    ("cancel-1-and-missing", ("queue", "cancel", "1", "999"), USAGE, "job 999 does not exist"),
    ("cancel-finished", ("queue", "cancel", "{done1}"), FAILED, "ended already"),
    ("cancel-without-id", ("queue", "cancel"), USAGE, "Missing argument"),
    # queue retry
    ("retry-running", ("queue", "retry", "{running}"), USAGE, "is running; only a finished job can be retried"),
    ("retry-queued", ("queue", "retry", "{queued}"), USAGE, "is queued; only a finished job can be retried"),
    ("retry-missing-job", ("queue", "retry", "999"), USAGE, "job 999 does not exist"),
    ("retry-failed-and-missing", ("queue", "retry", "{failed}", "999"), USAGE, "job 999 does not exist"),
    ("retry-failed-and-queued", ("queue", "retry", "{failed}", "{queued}"), USAGE, "is queued"),
    # queue edit
    ("edit-running", ("queue", "edit", "{running}", "--priority", "1"), USAGE, "is running; only a queued job"),
    ("edit-finished", ("queue", "edit", "{done1}", "--priority", "1"), USAGE, "has ended (succeeded); only a queued"),
    # With nothing to change, what stops the edit comes first: no option would help.
    ("edit-running-nothing", ("queue", "edit", "{running}"), USAGE, "is running; only a queued job"),
    ("edit-missing-nothing", ("queue", "edit", "999"), USAGE, "job 999 does not exist"),
    ("edit-missing-job", ("queue", "edit", "999", "--priority", "1"), USAGE, "job 999 does not exist"),
    (
        "edit-nothing",
        ("queue", "edit", "{queued}"),
        USAGE,
        "nothing to change: give --priority, --gpus, --gpu, --gpu-mem, --time-limit or --no-time-limit",
    ),
    (
        "edit-limit-and-no-limit",
        ("queue", "edit", "{queued}", "--time-limit", "5m", "--no-time-limit"),
        USAGE,
        "not both",
    ),
    ("edit-bad-time-limit", ("queue", "edit", "{queued}", "--time-limit", "0"), USAGE, "invalid duration '0'"),
    ("edit-gpus-negative", ("queue", "edit", "{queued}", "--gpus", "-1"), USAGE, "invalid GPU count -1"),
    ("edit-gpu-mem-zero", ("queue", "edit", "{queued}", "--gpu-mem", "0"), USAGE, "invalid size '0'"),
    ("edit-gpus-0-with-gpu-mem", ("queue", "edit", "{queued}", "--gpus", "0", "--gpu-mem", "1G"), USAGE, "--gpus 0"),
    ("edit-priority-too-high", ("queue", "edit", "{queued}", "--priority", "5000"), USAGE, "priority 5000"),
    ("edit-gpu", ("queue", "edit", "{queued}", "--gpu", "0"), NO_GPU, "NVML"),
    # A job that does not exist or does not wait says so before the GPUs are asked about.
    ("edit-missing-job-gpu", ("queue", "edit", "999", "--gpu", "0"), USAGE, "job 999 does not exist"),
    ("edit-running-gpus", ("queue", "edit", "{running}", "--gpus", "2"), USAGE, "is running; only a queued job"),
    # queue clean / wait / pause / resume
    ("clean-bad-age", ("queue", "clean", "--older-than", "soon"), USAGE, "invalid duration 'soon'"),
    ("clean-negative-age", ("queue", "clean", "--older-than", "-1d"), USAGE, "invalid duration '-1d'"),
    ("wait-missing-job", ("queue", "wait", "999"), USAGE, "job 999 does not exist"),
    ("wait-some-missing", ("queue", "wait", "{done1}", "999"), USAGE, "job 999 does not exist"),
    ("wait-bad-timeout", ("queue", "wait", "{running}", "--timeout", "soon"), USAGE, "invalid duration 'soon'"),
    ("wait-times-out", ("queue", "wait", "{running}", "--timeout", "1s"), TIMED_OUT, "timed out after 1s"),
    ("wait-times-out-bare-number", ("queue", "wait", "{running}", "--timeout", "1"), TIMED_OUT, "timed out after 1s"),
    ("pause-gpu", ("queue", "pause", "--gpu", "0"), NO_GPU, "NVML"),
    ("resume-gpu", ("queue", "resume", "--gpu", "0"), NO_GPU, "NVML"),
    ("pause-gpu-empty", ("queue", "pause", "--gpu", ""), USAGE, "--gpu is empty"),
    # A repeated option with one empty value names that option, not a joined list never typed.
    ("add-gpu-twice-one-empty", ("queue", "add", "--gpu", "0", "--gpu", "", "--", "true"), USAGE, "--gpu is empty"),
    ("after-twice-one-empty", ("queue", "add", "--after", "1", "--after", "", "--", "true"), USAGE, "--after is empty"),
    ("after-twice-one-blank", ("queue", "add", "--after", " ", "--after", "1", "--", "true"), USAGE, "is empty"),
    ("edit-gpu-twice-one-empty", ("queue", "edit", "{queued}", "--gpu", "0", "--gpu", ""), USAGE, "--gpu is empty"),
    ("add-gpu-list-with-a-hole", ("queue", "add", "--gpu", "0,,1", "--", "true"), USAGE, "--gpu 0,,1 names an empty"),
    ("pause-gpu-twice", ("queue", "pause", "--gpu", "0", "--gpu", "1"), USAGE, "--gpu is given 2 times"),
    ("resume-gpu-twice", ("queue", "resume", "--gpu", "0", "--gpu", "1"), USAGE, "--gpu is given 2 times"),
    ("resume-gpu-empty", ("queue", "resume", "--gpu", ""), USAGE, "--gpu is empty"),
    # unknown verbs, and a daemon option Typer rejects (the shared daemon must keep running)
    ("unknown-verb", ("queue", "bogus"), USAGE, "No such command 'bogus'"),
    ("daemon-unknown-verb", ("daemon", "bogus"), USAGE, "No such command 'bogus'"),
    ("daemon-stop-bad-timeout", ("daemon", "stop", "--timeout", "abc"), USAGE, "'abc' is not a valid float"),
]


@pytest.mark.parametrize(("args", "code", "fragment"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_rejected_and_nothing_changes(
    seeded: Seeded, request: pytest.FixtureRequest, args: tuple[str, ...], code: int, fragment: str
) -> None:
    if request.node.callspec.id in NEEDS_NO_NVML and nvml_present():
        pytest.skip("this machine has NVML: the command would reach the GPUs")
    box = seeded.box
    before = snapshot(box.db)
    result = box(*seeded.args(args), timeout=30)
    after = snapshot(box.db)
    assert_one_error_line(result, code, fragment.format(files=seeded.files, **seeded.ids))
    assert after == before
    assert box.daemon_pid() is not None, "the shared daemon stopped"


def test_the_file_with_one_bad_line_added_no_job(seeded: Seeded) -> None:
    """The good lines around the bad one were not added, and used up no ids."""
    box = seeded.box
    sequence = "SELECT seq FROM sqlite_sequence WHERE name = 'jobs'"
    before, ids_before = snapshot(box.db), box.rows(sequence)
    result = box("queue", "add", "--gpus", "0", "--file", str(seeded.files / "three-good-one-bad"))
    assert result.returncode == USAGE
    assert snapshot(box.db) == before
    assert box.rows(sequence) == ids_before, "job ids were used up"


@pytest.mark.parametrize(
    ("content", "why"),
    [
        (b"true\necho caf\xe9\n", "not UTF-8 text (byte 0xe9)"),
        ("true\n".encode("utf-16"), "not UTF-8 text (UTF-16, by its byte-order mark)"),
    ],
    ids=["latin-1", "utf-16"],
)
@pytest.mark.parametrize("where", ["file", "stdin"])
def test_a_job_file_that_is_not_utf8_is_refused_on_stdin_as_in_a_file(
    seeded: Seeded, tmp_path: Path, where: str, content: bytes, why: str
) -> None:
    """The same bytes, named or piped, are read alike: never as jobs made of undecodable bytes.
    PYTHONUTF8=1: stdin as many boxes give it to Python, whose decoding lets such bytes through."""
    box = seeded.box
    source = tmp_path / "jobs.txt"
    source.write_bytes(content)
    name = "-" if where == "stdin" else str(source)
    before = snapshot(box.db)
    result = subprocess.run(
        [sys.executable, "-m", "gpubox", "queue", "add", "--gpus", "0", "--file", name],
        input=content if where == "stdin" else b"",
        capture_output=True,
        env={**os.environ, **box.env, "PYTHONUTF8": "1"},
        timeout=30,
    )
    text = subprocess.CompletedProcess(result.args, result.returncode, result.stdout.decode(), result.stderr.decode())
    line = 1 if content.startswith(b"\xff\xfe") else 2
    assert_one_error_line(text, USAGE, f"{name}:{line}: {why}")
    assert snapshot(box.db) == before


def test_cancel_with_a_missing_id_cancels_none(seeded: Seeded) -> None:
    box = seeded.box
    ids = seeded.ids
    result = box("queue", "cancel", str(ids["queued"]), str(ids["running"]), "999")
    assert result.returncode == USAGE
    assert box.job(ids["queued"])["state"] == "queued"
    assert box.job(ids["running"])["state"] == "running"
    assert box.job(ids["running"])["request"] is None


# A database that is not a queue


def _seed_in_process(box: QueueBox) -> None:
    """Two jobs and a paused queue, written directly (no daemon is started)."""
    with JobStore(box.db) as store:
        store.add(JobSpec(argv=("true",), gpus=0))
        store.add(JobSpec(argv=("sleep", "1"), gpus=0, kind="train", priority=3))
        store.pause()


COMMANDS_ON_A_BAD_DB: list[tuple[str, ...]] = [
    ("queue", "ls"),
    ("queue", "ls", "--all", "--json"),
    ("queue", "show", "1"),
    ("queue", "logs", "1"),
    ("queue", "add", "--gpus", "0", "--", "true"),
    ("queue", "cancel", "1"),
    ("queue", "retry", "1"),
    ("queue", "wait", "1", "--timeout", "5s"),
    ("queue", "edit", "1", "--priority", "3"),
    ("queue", "clean"),
    ("queue", "pause"),
    ("queue", "resume"),
    ("daemon",),
]


@pytest.mark.parametrize("args", COMMANDS_ON_A_BAD_DB, ids=[" ".join(a) for a in COMMANDS_ON_A_BAD_DB])
def test_corrupt_database(queue: QueueBox, args: tuple[str, ...]) -> None:
    queue.state_dir.mkdir(parents=True)
    garbage = random.Random(7).randbytes(16384)
    queue.db.write_bytes(garbage)
    result = queue(*args, timeout=30)
    assert_one_error_line(result, FAILED, "corrupt")
    assert queue.db.read_bytes() == garbage
    assert queue.daemon_pid() is None


def test_damaged_pages_are_named_as_such(queue: QueueBox) -> None:
    """A database whose header and schema are whole but whose tables are damaged (a disk error):
    it opens, then fails on the first read of a job; each command says it is damaged."""
    _seed_in_process(queue)
    with JobStore(queue.db) as store:
        store.add_many([JobSpec(argv=("echo", str(i)), gpus=0) for i in range(300)])
    with sqlite3.connect(queue.db) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = conn.execute("PRAGMA page_size").fetchone()[0]
    data = bytearray(queue.db.read_bytes())
    data[page:] = random.Random(3).randbytes(len(data) - page)  # every page after the schema's
    queue.db.write_bytes(bytes(data))
    for args in (("queue", "ls"), ("queue", "show", "2"), ("queue", "add", "--gpus", "0", "--", "true")):
        result = queue(*args, timeout=30)
        assert_one_error_line(result, FAILED, "is damaged (database disk image is malformed)")
        assert queue.db.read_bytes() == data
    assert queue.daemon_pid() is None


def test_a_state_folder_others_may_write_to_is_refused_and_left_as_it_is(queue: QueueBox) -> None:
    """Whoever may write there may replace the database, and so run commands as its owner."""
    queue.state_dir.mkdir(parents=True)
    queue.state_dir.chmod(0o777)
    for args in (("queue", "ls"), ("queue", "add", "--gpus", "0", "--", "true"), ("daemon",)):
        result = queue(*args, timeout=30)
        assert_one_error_line(result, FAILED, f"{queue.state_dir} is writable by other users (mode 0777)")
    assert queue.state_dir.stat().st_mode & 0o7777 == 0o777
    assert list(queue.state_dir.iterdir()) == []
    assert queue.daemon_pid() is None


@pytest.mark.parametrize("after", [False, True], ids=["plain", "with-after"])
def test_a_runtime_folder_others_may_write_to_stores_no_job(queue: QueueBox, after: bool) -> None:
    """The daemon `queue add` would start stops at once on it: the job is refused first."""
    _seed_in_process(queue)
    runtime = Path(queue.env["GPUBOX_RUNTIME_DIR"])
    runtime.mkdir(parents=True, exist_ok=True)
    runtime.chmod(0o775)
    before = snapshot(queue.db)
    dependency = ("--after", "1") if after else ()
    result = queue("queue", "add", "--gpus", "0", *dependency, "--", "true")
    assert_one_error_line(result, FAILED, f"{runtime} is writable by other users (mode 0775)")
    assert snapshot(queue.db) == before
    assert queue.daemon_pid() is None


def test_foreign_sqlite_database_is_refused_and_left_alone(queue: QueueBox) -> None:
    queue.state_dir.mkdir(parents=True)
    conn = sqlite3.connect(queue.db)
    conn.execute("CREATE TABLE notes (body TEXT)")
    conn.execute("INSERT INTO notes VALUES ('mine, not gpubox''s')")
    conn.commit()
    conn.close()
    original = queue.db.read_bytes()
    for args in (("queue", "ls"), ("queue", "add", "--gpus", "0", "--", "true"), ("daemon",)):
        result = queue(*args, timeout=30)
        assert_one_error_line(result, FAILED, "not gpubox's")
        assert queue.db.read_bytes() == original, f"`gpubox {' '.join(args)}` changed someone else's database"


# The daemon


def test_daemon_status_when_none_runs(queue: QueueBox) -> None:
    _seed_in_process(queue)
    before = snapshot(queue.db)
    result = queue("daemon", "status")
    assert_one_error_line(result, 4, "the daemon is not running")
    assert snapshot(queue.db) == before


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("GPUBOX_QUEUE_MAX_CPU_JOBS", "-1"),
        ("GPUBOX_QUEUE_MAX_CPU_JOBS", "two"),
        ("GPUBOX_QUEUE_KIND_ORDER", "infer,train"),
        ("GPUBOX_QUEUE_POLL_INTERVAL", "0"),
        ("GPUBOX_QUEUE_KILL_GRACE", "-3"),
        ("GPUBOX_QUEUE_PREEMPT", "maybe"),
    ],
)
def test_daemon_refuses_a_bad_setting(queue: QueueBox, variable: str, value: str) -> None:
    _seed_in_process(queue)
    before = snapshot(queue.db)
    result = queue("daemon", env={variable: value}, timeout=20)
    assert_one_error_line(result, USAGE, variable)
    assert snapshot(queue.db) == before
    assert queue.daemon_pid() is None


@pytest.mark.parametrize("after", [False, True], ids=["plain", "with-after"])
def test_a_job_no_daemon_could_run_is_not_stored(queue: QueueBox, after: bool) -> None:
    """With no daemon running, `queue add` would start one that stops on its settings: the job
    is refused before it is stored (also with --after, whose check reads the database first)."""
    _seed_in_process(queue)
    before = snapshot(queue.db)
    dependency = ("--after", "1") if after else ()
    result = queue("queue", "add", "--gpus", "0", *dependency, "--", "true", env={"GPUBOX_QUEUE_MAX_CPU_JOBS": "-1"})
    assert_one_error_line(result, USAGE, "GPUBOX_QUEUE_MAX_CPU_JOBS")
    assert snapshot(queue.db) == before
    assert queue.daemon_pid() is None


CHANGES_FOR_A_DAEMON: list[tuple[str, ...]] = [
    ("queue", "retry", "3"),
    ("queue", "edit", "2", "--priority", "5"),
    ("queue", "resume"),
]


@pytest.mark.parametrize("problem", ["bad-setting", "runtime-folder"])
@pytest.mark.parametrize("args", CHANGES_FOR_A_DAEMON, ids=[" ".join(a) for a in CHANGES_FOR_A_DAEMON])
def test_a_change_no_daemon_could_act_on_is_not_made(queue: QueueBox, problem: str, args: tuple[str, ...]) -> None:
    """With no daemon running, a retry, an edit or a resume would start one that stops at once:
    the change is refused before it is made, with `queue add`'s message and exit code."""
    _seed_in_process(queue)
    with JobStore(queue.db) as store:
        store.request_stop(store.add(JobSpec(argv=("false",), gpus=0)).id, "cancel")  # job 3, ended
    env: dict[str, str] = {}
    if problem == "bad-setting":
        env, code, fragment = {"GPUBOX_QUEUE_MAX_CPU_JOBS": "-1"}, USAGE, "GPUBOX_QUEUE_MAX_CPU_JOBS"
    else:
        queue.runtime_dir.mkdir(parents=True, exist_ok=True)
        queue.runtime_dir.chmod(0o775)
        code, fragment = FAILED, f"{queue.runtime_dir} is writable by other users (mode 0775)"
    before = snapshot(queue.db)
    added = queue("queue", "add", "--gpus", "0", "--", "true", env=env)
    assert_one_error_line(added, code, fragment)
    result = queue(*args, env=env)
    assert_one_error_line(result, code, fragment)
    assert result.stderr == added.stderr
    assert snapshot(queue.db) == before
    assert queue.daemon_pid() is None


def test_daemon_refuses_a_bad_config_file(queue: QueueBox) -> None:
    _seed_in_process(queue)
    config = Path(queue.env["GPUBOX_SYSTEM_CONFIG"])
    config.write_text("[queue]\nmax_cpu_jobs = -1\n")
    before = snapshot(queue.db)
    result = queue("daemon", timeout=20)
    assert_one_error_line(result, USAGE, "max_cpu_jobs")
    assert str(config) in result.stderr
    assert snapshot(queue.db) == before
    assert queue.daemon_pid() is None


@pytest.mark.parametrize(
    ("args", "fragment"),
    [(("queue", "retry", "999"), "job 999 does not exist"), (("queue", "edit", "999", "--priority", "1"), "job 999")],
)
def test_a_missing_job_is_said_before_a_daemon_that_could_not_start(
    queue: QueueBox, args: tuple[str, ...], fragment: str
) -> None:
    _seed_in_process(queue)
    before = snapshot(queue.db)
    result = queue(*args, env={"GPUBOX_QUEUE_MAX_CPU_JOBS": "-1"})
    assert_one_error_line(result, USAGE, fragment)
    assert snapshot(queue.db) == before
