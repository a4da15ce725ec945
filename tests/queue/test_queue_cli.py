"""`gpubox queue` end to end: each verb through the real CLI, with a real daemon and real jobs.

Jobs here are CPU-only (`--gpus 0`), so they run on any machine; what a job did is read back from
its logs, from `queue show --json`, and from the database itself.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.queue.conftest import QueueBox


@pytest.fixture(autouse=True)
def daemon(queue: QueueBox) -> Iterator[None]:
    """A daemon listening before the first command: no command starts one of its own, which could
    still be starting (not yet holding the lock) when the teardown looks for daemons to kill."""
    queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] = "1"
    queue.start_daemon()
    yield


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, (result.returncode, result.stdout, result.stderr)
    assert result.stderr == "", result.stderr
    return result.stdout


def as_json(queue: QueueBox, noun: str, verb: str, *args: str) -> dict[str, Any]:
    """`gpubox NOUN VERB --json ARGS` (before any `--`), parsed."""
    doc: dict[str, Any] = json.loads(ok(queue(noun, verb, "--json", *args)))
    return doc


def show(queue: QueueBox, job_id: int) -> dict[str, Any]:
    data: dict[str, Any] = as_json(queue, "queue", "show", str(job_id))["data"]
    return data


def ids_of(output: str) -> list[int]:
    return [int(line) for line in output.split()]


def listed(queue: QueueBox, *args: str) -> list[int]:
    """The ids in the first column of `queue ls ARGS` (text)."""
    lines = ok(queue("queue", "ls", *args)).splitlines()
    assert lines[0].split()[:4] == ["ID", "NAME", "KIND", "STATE"]
    return [int(line.split()[0]) for line in lines[1:]]


def run_with_stdin(queue: QueueBox, text: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpubox", *args],
        input=text,
        capture_output=True,
        text=True,
        env={**os.environ, **queue.env, **queue.extra_env},
        timeout=60,
    )


def wait_ok(queue: QueueBox, *ids: int) -> None:
    result = queue("queue", "wait", *map(str, ids))
    assert result.returncode == 0, (result.stdout, result.stderr)


def poll(check: Any, timeout: float = 15.0, what: str = "condition") -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


# add


def test_add_prints_the_id_and_the_json_envelope(queue: QueueBox, tmp_path: Path) -> None:
    ok(queue("queue", "pause"))
    assert ok(queue("queue", "add", "--gpus", "0", "--", "true")) == "1\n"
    doc = as_json(
        queue,
        "queue",
        "add",
        "--gpus",
        "0",
        "--name",
        "nightly",
        "--kind",
        "train",
        "--priority",
        "3",
        "--time-limit",
        "90m",
        "--retries",
        "2",
        "--tag",
        "team=nlp",
        "--cwd",
        str(tmp_path),
        "--",
        "python",
        "train.py",
        "--lr",
        "3e-4",
    )
    assert doc["schema"] == 1 and doc["command"] == "queue add"
    assert doc["ok"] is True and doc["exit_code"] == 0 and doc["errors"] == []
    (job,) = doc["data"]["jobs"]
    expected = {
        "id": 2,
        "name": "nightly",
        "kind": "train",
        "state": "queued",
        "command": "python train.py --lr 3e-4",
        "argv": ["python", "train.py", "--lr", "3e-4"],
        "shell": False,
        "cwd": str(tmp_path),
        "priority": 3,
        "gpus_requested": 0,
        "gpu_ids_requested": None,
        "gpu_mem_bytes": None,
        "after": [],
        "time_limit_s": 5400.0,
        "retries": 2,
        "failures": 0,
        "tags": {"team": "nlp"},
        "attempt": 0,
        "started_at": None,
        "ended_at": None,
        "exit_code": None,
    }
    assert {k: job[k] for k in expected} == expected
    assert isinstance(job["submitted_at"], float)
    assert "env" not in job
    assert [r[0] for r in queue.rows("SELECT id FROM jobs ORDER BY id")] == [1, 2]


JOB_FILE = """\
# nightly jobs
echo plain 'two words'

{"cmd": "python eval.py --split test", "name": "eval", "kind": "infer", "priority": 7, "tags": {"team": "nlp"}}
   # an indented comment
{"argv": ["echo", "a;b"], "kind": "batch", "env": {"MODE": "fast"}, "retries": 3, "time_limit": "2h", "after": []}
{"cmd": "echo $MODE | tr a-z A-Z", "shell": true, "name": "piped", "gpus": 0}
"""


def test_add_file_with_commands_comments_and_json_lines(queue: QueueBox, tmp_path: Path) -> None:
    ok(queue("queue", "pause"))
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(JOB_FILE)
    added = ids_of(ok(queue("queue", "add", "--gpus", "0", "--tag", "src=file", "--file", str(jobs))))
    assert added == [1, 2, 3, 4]
    plain, evaluate, batch, piped = (show(queue, i)["job"] for i in added)

    assert plain["argv"] == ["echo", "plain", "two words"] and plain["shell"] is False
    assert (plain["kind"], plain["priority"], plain["gpus_requested"]) == ("other", 0, 0)
    assert plain["tags"] == {"src": "file"}

    assert evaluate["argv"] == ["python", "eval.py", "--split", "test"]
    assert (evaluate["name"], evaluate["kind"], evaluate["priority"]) == ("eval", "infer", 7)
    assert evaluate["tags"] == {"src": "file", "team": "nlp"}
    assert evaluate["gpus_requested"] == 0  # the command line's --gpus is every line's default

    assert batch["argv"] == ["echo", "a;b"] and batch["kind"] == "batch"
    assert (batch["retries"], batch["time_limit_s"], batch["after"]) == (3, 7200.0, [])  # [] names no dependency
    assert batch["env"]["MODE"] == "fast"

    assert piped["shell"] is True and piped["argv"] == ["echo $MODE | tr a-z A-Z"]
    assert piped["name"] == "piped" and piped["gpus_requested"] == 0


def test_a_tag_or_variable_given_twice_alike_is_kept_once_and_a_file_line_overrides_the_command_line(
    queue: QueueBox, tmp_path: Path
) -> None:
    """Only two values for one key are refused (tests/queue/test_queue_bad_input.py): the same
    pair twice is one, and a job file's line gives its own value of a key the command line gave."""
    ok(queue("queue", "pause"))
    twice = ("--tag", "team=a", "--tag", "team=a", "--env", "K=1", "--env", "K=1")
    (alike,) = ids_of(ok(queue("queue", "add", "--gpus", "0", *twice, "--", "true")))
    jobs = tmp_path / "jobs.txt"
    jobs.write_text('true\n{"cmd": "true", "tags": {"team": "b"}, "env": {"K": "2"}}\n')
    default, own = ids_of(
        ok(queue("queue", "add", "--gpus", "0", "--tag", "team=a", "--env", "K=1", "--file", str(jobs)))
    )
    for job_id, value, env in ((alike, "a", "1"), (default, "a", "1"), (own, "b", "2")):
        job = show(queue, job_id)["job"]
        assert (job["tags"], job["env"]["K"]) == ({"team": value}, env)


def test_a_job_file_is_read_as_a_shell_reads_comments_and_as_editors_write_it(queue: QueueBox, tmp_path: Path) -> None:
    ok(queue("queue", "pause"))
    jobs = tmp_path / "jobs.txt"
    lines = [
        '{"cmd": "echo first", "name": "after-a-bom"}',  # the file starts with a byte-order mark
        "python train.py --lr 3e-4  # baseline",
        "curl http://host/page#anchor 'a # b' \\#c",
        "echo a\\ #b  # an escaped blank starts no comment",
    ]
    jobs.write_bytes(b"\xef\xbb\xbf" + "\r\n".join(lines).encode() + b"\r\n")
    added = ids_of(ok(queue("queue", "add", "--gpus", "0", "--file", str(jobs))))
    first, train, curl, escaped = (show(queue, i)["job"] for i in added)
    assert escaped["argv"] == ["echo", "a #b"]
    assert (first["name"], first["argv"]) == ("after-a-bom", ["echo", "first"])
    assert train["argv"] == ["python", "train.py", "--lr", "3e-4"]
    assert curl["argv"] == ["curl", "http://host/page#anchor", "a # b", "#c"]


def test_control_characters_are_shown_escaped(queue: QueueBox) -> None:
    script = "echo one\necho \x1b[2J two"
    job = queue.add("--gpus", "0", "--shell", "--", script)
    wait_ok(queue, job)
    text = ok(queue("queue", "show", str(job)))
    assert "command     echo one\\necho \\x1b[2J two   (through /bin/sh -c)" in text
    assert "\x1b" not in text
    missing = queue.add("--gpus", "0", "--", "no-such\tprogram")
    assert queue("queue", "wait", str(missing)).returncode == 127
    row = next(line for line in ok(queue("queue", "ls", "--all")).splitlines() if line.startswith(f"{missing} "))
    assert row.endswith("no-such\\tprogram: command not found") and "\t" not in row


def test_add_file_from_stdin(queue: QueueBox) -> None:
    ok(queue("queue", "pause"))
    result = run_with_stdin(
        queue, 'true\n{"cmd": "sleep 1", "name": "s"}\n', "queue", "add", "--gpus", "0", "--file", "-"
    )
    assert ids_of(ok(result)) == [1, 2]
    assert show(queue, 2)["job"]["argv"] == ["sleep", "1"]
    assert show(queue, 2)["job"]["name"] == "s"


# ls


def test_ls_shows_queued_and_running_all_shows_ended_state_filters(queue: QueueBox) -> None:
    succeeded = queue.add("--gpus", "0", "--", "true")
    failed = queue.add("--gpus", "0", "--", "false")
    assert queue("queue", "wait", str(succeeded), str(failed)).returncode == 1
    running = queue.add("--gpus", "0", "--", "sleep", "60")
    queue.wait_state(running, ("running",))
    queued = queue.add("--gpus", "0", "--", "true")  # the one CPU slot is taken
    assert listed(queue) == [running, queued]
    assert listed(queue, "--all") == [succeeded, failed, running, queued]
    assert listed(queue, "--state", "failed") == [failed]
    assert listed(queue, "--state", "failed", "--state", "succeeded") == [succeeded, failed]
    assert listed(queue, "--state", "FAILED") == [failed]  # any case, as --kind
    doc = as_json(queue, "queue", "ls", "--all")
    assert doc["command"] == "queue ls" and doc["data"]["daemon"] is True
    assert [(j["id"], j["state"]) for j in doc["data"]["jobs"]] == [
        (succeeded, "succeeded"),
        (failed, "failed"),
        (running, "running"),
        (queued, "queued"),
    ]
    ok(queue("queue", "cancel", str(running), str(queued)))


def test_ls_json_says_why_queued_jobs_wait(queue: QueueBox) -> None:
    running = queue.add("--gpus", "0", "--", "sleep", "60")
    queue.wait_state(running, ("running",))
    after = queue.add("--gpus", "0", "--after", str(running), "--", "true")
    slot = queue.add("--gpus", "0", "--", "true")

    def reasons() -> dict[int, str] | None:
        jobs = as_json(queue, "queue", "ls")["data"]["jobs"]
        found = {j["id"]: j["reason"] for j in jobs if j["state"] == "queued"}
        return found if all(r and "next scheduling pass" not in r for r in found.values()) else None

    why = poll(reasons, what="the daemon's reasons")
    assert f"waits for job {running} (running)" in why[after]
    assert "waits for a CPU-only slot" in why[slot] and f"job {running}" in why[slot]
    text = ok(queue("queue", "ls"))
    assert f"waits for job {running} (running)" in text
    ok(queue("queue", "cancel", str(running)))
    assert queue.wait_state(after, ("failed",))["reason"] == f"job {running}, which it runs after, ended cancelled"


# show


def test_show_text_and_json(queue: QueueBox, tmp_path: Path) -> None:
    job = queue.add("--gpus", "0", "--name", "greet", "--env", "SECRET_TOKEN=abc123", "--", "echo", "hello")
    wait_ok(queue, job)
    text = ok(queue("queue", "show", str(job)))
    assert text.startswith(f"job {job} (greet)\n")
    assert "state       succeeded" in text
    assert "command     echo hello" in text
    assert "attempt 1   succeeded, exit 0" in text
    assert "SECRET_TOKEN" not in text and "abc123" not in text

    data = show(queue, job)
    record = data["job"]
    assert (record["id"], record["state"], record["exit_code"], record["attempt"]) == (job, "succeeded", 0, 1)
    assert record["env"]["SECRET_TOKEN"] == "abc123"
    (attempt,) = data["attempts"]
    assert (attempt["number"], attempt["outcome"], attempt["exit_code"]) == (1, "succeeded", 0)
    assert attempt["gpus"] == [] and attempt["gpu_uuids"] == []
    assert Path(attempt["stdout"]).read_text() == "hello\n"
    # `echo` wrote nothing to stderr: its log is where it would be, made only once written to.
    assert attempt["stderr"] == attempt["log_prefix"] + ".err" and not Path(attempt["stderr"]).exists()
    assert attempt["stdout"] == attempt["log_prefix"] + ".out"
    assert f"logs {attempt['log_prefix']}.out|.err" in text


# cancel, retry, edit


def test_cancel_a_queued_job_it_never_runs(queue: QueueBox, tmp_path: Path) -> None:
    ok(queue("queue", "pause"))
    marker = tmp_path / "ran"
    job = queue.add("--gpus", "0", "--", "touch", str(marker))
    assert ok(queue("queue", "cancel", str(job))) == f"job {job}: cancelled\n"
    ok(queue("queue", "resume"))
    later = queue.add("--gpus", "0", "--", "true")
    wait_ok(queue, later)
    assert not marker.exists()
    row = queue.job(job)
    assert (row["state"], row["attempt"], row["started_at"]) == ("cancelled", 0, None)
    assert queue.rows(f"SELECT * FROM attempts WHERE job_id = {job}") == []
    assert queue("queue", "wait", str(job)).returncode == 1


def test_cancel_a_running_job_stops_it(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "sleep", "60")
    queue.wait_state(job, ("running",))
    assert ok(queue("queue", "cancel", str(job))) == f"job {job}: stopping\n"
    row = queue.wait_state(job, ("cancelled",), timeout=15)
    assert row["ended_at"] is not None


def test_retry_a_failed_job_runs_it_again(queue: QueueBox, tmp_path: Path) -> None:
    marker = tmp_path / "tried"
    script = f"test -e {marker} || {{ touch {marker}; exit 3; }}"
    job = queue.add("--gpus", "0", "--shell", "--", script)
    assert queue("queue", "wait", str(job)).returncode == 3
    assert queue.job(job)["state"] == "failed"
    assert ok(queue("queue", "retry", str(job))) == f"job {job}: queued\n"
    wait_ok(queue, job)
    data = show(queue, job)
    assert (data["job"]["state"], data["job"]["attempt"], data["job"]["exit_code"]) == ("succeeded", 2, 0)
    assert [(a["number"], a["outcome"], a["exit_code"]) for a in data["attempts"]] == [
        (1, "failed", 3),
        (2, "succeeded", 0),
    ]
    assert data["attempts"][0]["log_prefix"] != data["attempts"][1]["log_prefix"]


def test_ids_given_twice_count_once(queue: QueueBox) -> None:
    done = queue.add("--gpus", "0", "--", "true")
    wait_ok(queue, done)
    ok(queue("queue", "pause"))
    assert ok(queue("queue", "retry", str(done), str(done))) == f"job {done}: queued\n"
    assert ok(queue("queue", "cancel", str(done), str(done))) == f"job {done}: cancelled\n"
    result = queue("queue", "wait", str(done), str(done))
    assert (result.returncode, result.stdout) == (1, f"job {done}: cancelled\n")


def test_retry_of_several_jobs_queues_all_or_none(queue: QueueBox) -> None:
    done = queue.add("--gpus", "0", "--", "true")
    wait_ok(queue, done)
    ok(queue("queue", "pause"))
    waiting = queue.add("--gpus", "0", "--", "true")
    before = queue.rows()
    result = queue("queue", "retry", str(done), str(waiting))
    assert (result.returncode, result.stdout) == (2, "")
    assert result.stderr == f"gpubox: job {waiting} is queued; only a finished job can be retried\n"
    assert queue.rows() == before  # job {done} was not queued again either


def test_a_job_queued_again_is_not_started_until_it_starts(queue: QueueBox) -> None:
    done = queue.add("--gpus", "0", "--", "true")
    wait_ok(queue, done)
    first = show(queue, done)["job"]
    ok(queue("queue", "pause"))
    ok(queue("queue", "retry", str(done)))
    again = show(queue, done)["job"]
    assert (again["state"], again["started_at"], again["ended_at"]) == ("queued", None, None)
    assert again["queued_at"] >= first["ended_at"] and first["queued_at"] == first["submitted_at"]
    ok(queue("queue", "cancel", str(done)))
    data = show(queue, done)
    assert data["job"]["started_at"] is None  # cancelled before its second attempt started
    assert data["attempts"][0]["started_at"] == first["started_at"]  # the first attempt keeps its times
    row = next(line for line in ok(queue("queue", "ls", "--all")).splitlines()[1:] if line.split()[0] == str(done))
    assert row.split()[6] == "-"  # RAN: nothing ran since it was queued again


def test_edit_a_queued_job(queue: QueueBox) -> None:
    ok(queue("queue", "pause"))
    job = queue.add("--gpus", "0", "--time-limit", "10m", "--", "true")
    assert ok(queue("queue", "edit", str(job), "--priority", "7", "--time-limit", "90m")) == f"job {job}: updated\n"
    record = show(queue, job)["job"]
    assert (record["priority"], record["time_limit_s"], record["state"]) == (7, 5400.0, "queued")
    assert queue.job(job)["priority"] == 7  # the column the scheduler sorts by
    doc = as_json(queue, "queue", "edit", str(job), "--no-time-limit", "--priority", "-2")
    assert doc["command"] == "queue edit"
    assert (doc["data"]["job"]["priority"], doc["data"]["job"]["time_limit_s"]) == (-2, None)
    assert show(queue, job)["job"]["time_limit_s"] is None


# clean


def test_zero_means_now_for_clean_and_wait(queue: QueueBox) -> None:
    done = queue.add("--gpus", "0", "--", "true")
    wait_ok(queue, done)
    running = queue.add("--gpus", "0", "--", "sleep", "60")
    queue.wait_state(running, ("running",))
    looked = queue("queue", "wait", str(running), "--timeout", "0")  # only looks: still running
    assert (looked.returncode, looked.stderr) == (124, f"gpubox: job(s) {running} not ended yet (--timeout 0)\n")
    assert queue("queue", "wait", str(done), "--timeout", "0s").returncode == 0
    assert ok(queue("queue", "clean", "--older-than", "0")) == "removed 1 finished job(s)\n"
    assert [r[0] for r in queue.rows("SELECT id FROM jobs ORDER BY id")] == [running]
    assert queue("queue", "edit", str(running), "--time-limit", "0").returncode == 2  # a limit stays positive
    ok(queue("queue", "cancel", str(running)))


def test_clean_removes_finished_jobs_and_their_logs(queue: QueueBox) -> None:
    done = [
        queue.add("--gpus", "0", "--shell", "--", "echo out; echo err >&2"),
        queue.add("--gpus", "0", "--", "false"),
    ]
    queue("queue", "wait", *map(str, done))
    ok(queue("queue", "pause"))
    waiting = queue.add("--gpus", "0", "--", "true")
    logs = queue.state_dir / "logs"
    # A log is made once the job writes to it: `false` has none.
    assert sorted(p.name for p in logs.iterdir()) == [f"{done[0]}.1.err", f"{done[0]}.1.out"]
    (logs / f"{done[0]}.1.exit").write_text("{}")  # as a supervisor leaves when no daemon records its end

    assert ok(queue("queue", "clean", "--older-than", "7d")) == "removed 0 finished job(s)\n"
    assert [r[0] for r in queue.rows("SELECT id FROM jobs ORDER BY id")] == [*done, waiting]

    doc = as_json(queue, "queue", "clean")
    assert doc["command"] == "queue clean" and doc["data"]["removed"] == done
    assert [r[0] for r in queue.rows("SELECT id FROM jobs ORDER BY id")] == [waiting]
    assert queue.rows("SELECT job_id FROM attempts") == []
    assert not [p for i in done for p in logs.glob(f"{i}.*")]
    assert (logs / f"{waiting}.1.out").exists() is False  # never ran, so it never had a log
    assert queue.job(waiting)["state"] == "queued"


# order


def test_priority_then_kind_order(queue: QueueBox) -> None:
    assert queue.extra_env["GPUBOX_QUEUE_MAX_CPU_JOBS"] == "1"  # the daemon runs one CPU-only job at a time
    ok(queue("queue", "pause"))
    jobs = {
        kind: queue.add("--gpus", "0", "--kind", kind, "--", "true") for kind in ("batch", "train", "infer", "quantize")
    }
    jobs["urgent"] = queue.add("--gpus", "0", "--kind", "batch", "--priority", "5", "--", "true")
    ok(queue("queue", "resume"))
    wait_ok(queue, *jobs.values())
    by_start = [r[0] for r in queue.rows("SELECT id FROM jobs ORDER BY started_at, id")]
    names = {v: k for k, v in jobs.items()}
    assert [names[i] for i in by_start] == ["urgent", "infer", "quantize", "train", "batch"]
    spans = queue.rows("SELECT started_at, ended_at FROM jobs ORDER BY started_at")
    for (_, ended), (started, _) in itertools.pairwise(spans):
        assert started >= ended, "two CPU-only jobs ran at once with one CPU slot"


# how commands run


def test_shell_runs_through_bin_sh(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--shell", "--", "echo hello world | tr a-z A-Z; echo $((6 * 7))")
    wait_ok(queue, job)
    assert ok(queue("queue", "logs", str(job))) == "HELLO WORLD\n42\n"
    assert show(queue, job)["job"]["command"] == "echo hello world | tr a-z A-Z; echo $((6 * 7))"


def test_argv_is_not_shell_interpreted(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "echo", "$HOME", "a;b", "|", "*")
    wait_ok(queue, job)
    assert ok(queue("queue", "logs", str(job))) == "$HOME a;b | *\n"


def test_a_command_that_does_not_exist_fails_with_127(queue: QueueBox) -> None:
    job = queue.add("--gpus", "0", "--", "gpubox-no-such-command-xyz", "--flag")
    assert queue("queue", "wait", str(job)).returncode == 127
    row = queue.job(job)
    assert (row["state"], row["exit_code"]) == ("failed", 127)
    err = ok(queue("queue", "logs", str(job), "--stderr"))
    assert "gpubox-no-such-command-xyz" in err and "command not found" in err
    assert ok(queue("queue", "logs", str(job))) == ""


def test_a_job_run_elsewhere_finds_its_own_folder_in_pwd(queue: QueueBox, tmp_path: Path) -> None:
    """$PWD is where the job runs (--cwd, or a job file's "cwd"), not where it was added from."""
    there = tmp_path / "run here"
    there.mkdir()
    shell_pwd = {"PWD": str(tmp_path)}  # the adding shell's, as a shell exports it
    moved = queue.add("--gpus", "0", "--cwd", str(there), "--", "printenv", "PWD", env=shell_pwd)
    link = tmp_path / "link"
    link.symlink_to(os.getcwd())  # the folder the job is added from, by the name a shell keeps
    stayed = queue.add("--gpus", "0", "--", "printenv", "PWD", env={"PWD": str(link)})
    chosen = queue.add("--gpus", "0", "--cwd", str(there), "--env", "PWD=/x", "--", "printenv", "PWD", env=shell_pwd)
    jobs = tmp_path / "jobs.txt"
    jobs.write_text(json.dumps({"argv": ["printenv", "PWD"], "cwd": str(there)}) + "\n")
    (from_file,) = ids_of(ok(queue("queue", "add", "--gpus", "0", "--file", str(jobs), env=shell_pwd)))
    for job in (moved, stayed, chosen, from_file):
        wait_ok(queue, job)
    assert ok(queue("queue", "logs", str(moved))) == f"{there}\n"
    assert ok(queue("queue", "logs", str(from_file))) == f"{there}\n"
    assert ok(queue("queue", "logs", str(stayed))) == f"{link}\n"  # right already: kept
    assert ok(queue("queue", "logs", str(chosen))) == "/x\n"  # asked for: kept


# add --wait


def test_add_wait_prints_the_id_then_exits_with_the_jobs_own_code(queue: QueueBox) -> None:
    # A plain line (the fast path) and one that Typer parses (a value that starts with a dash)
    # end alike.
    for args in (["--gpus", "0", "--wait"], ["--wait", "--gpus", "0", "--name", "-w"]):
        result = queue("queue", "add", *args, "--", "sh", "-c", "sleep 0.2; exit 3")
        job = int(result.stdout)  # stdout holds the id alone, as without --wait
        assert (result.returncode, result.stderr) == (3, f"gpubox: job {job}: failed (exit 3)\n")
        assert queue.job(job)["state"] == "failed"
    result = queue("queue", "add", "--gpus", "0", "--wait", "--", "true")
    assert (result.returncode, result.stderr) == (0, "")
    assert queue.job(int(result.stdout))["state"] == "succeeded"


def test_add_wait_of_a_file_waits_for_every_job_and_exits_with_the_first_failed_ones_code(
    queue: QueueBox, tmp_path: Path
) -> None:
    jobs = tmp_path / "jobs.txt"
    jobs.write_text("true\nsh -c 'sleep 0.3; exit 5'\nsh -c 'exit 4'\ntrue\n")
    result = queue("queue", "add", "--gpus", "0", "--file", str(jobs), "--wait")
    ids = [int(line) for line in result.stdout.split()]
    assert len(ids) == 4 and result.returncode == 5
    assert result.stderr == f"gpubox: job {ids[1]}: failed (exit 5)\ngpubox: job {ids[2]}: failed (exit 4)\n"
    assert [queue.job(i)["state"] for i in ids] == ["succeeded", "failed", "failed", "succeeded"]


def test_add_wait_json_is_one_document_of_the_ended_jobs(queue: QueueBox) -> None:
    result = queue("queue", "add", "--gpus", "0", "--wait", "--json", "--", "sh", "-c", "exit 4")
    doc = json.loads(result.stdout)  # one document: the ended jobs, not the added ones first
    assert (result.returncode, doc["command"], doc["ok"], doc["exit_code"]) == (4, "queue add", False, 4)
    (job,) = doc["data"]["jobs"]
    assert (job["state"], job["exit_code"], doc["data"]["exit_code"]) == ("failed", 4, 4)


def test_add_wait_that_cannot_add_waits_for_nothing(queue: QueueBox) -> None:
    result = queue("queue", "add", "--gpus", "0", "--wait", "--kind", "bogus", "--", "true")
    assert (result.returncode, result.stdout) == (2, "")
    assert "kind" in result.stderr and len(result.stderr.splitlines()) == 1
    assert queue.rows() == []


@pytest.mark.parametrize("how", [(), ("--json",), ("--name", "typer")])
def test_odd_terminal_sizes_are_captured_with_the_job(queue: QueueBox, how: tuple[str, ...]) -> None:
    """COLUMNS or LINES that Rich cannot read is taken out of gpubox's own environment, but it
    is the user's: the job gets it, as any other variable of theirs (the fast path and Typer's)."""
    sizes = {"COLUMNS": "\u00b2", "LINES": "x"}
    script = 'printf "%s|%s" "$COLUMNS" "$LINES"'
    result = queue("queue", "add", "--gpus", "0", *how, "--", "sh", "-c", script, env=sizes)
    assert result.returncode == 0, result.stderr
    job = json.loads(result.stdout)["data"]["jobs"][0]["id"] if how == ("--json",) else int(result.stdout)
    wait_ok(queue, job)
    (attempt,) = show(queue, job)["attempts"]
    assert Path(attempt["stdout"]).read_text() == "\u00b2|x"
