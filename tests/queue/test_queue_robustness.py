"""What the queue survives: odd bytes, daemons started from inside jobs, cancels that meet retries,
queues that share a runtime directory, GPUs that cannot be read, and more."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.queue import proctree
from gpubox.queue.jobs import Job, JobSpec
from gpubox.queue.schedule import QueueConfig, plan_pass
from tests.queue.conftest import QueueBox, wait_until

HANG = 60.0


def echo_through(queue: QueueBox, env: dict[str, str]) -> None:
    """Run `echo hello` through the queue as `env` names it: added, waited for, and its log read."""
    added = queue("queue", "add", "--gpus", "0", "--shell", "--", "echo hello", env=env)
    assert added.returncode == 0, added.stderr
    job = added.stdout.strip()
    waited = queue("queue", "wait", job, env=env, timeout=HANG)
    assert waited.returncode == 0, waited.stderr
    assert queue("queue", "logs", job, env=env).stdout == "hello\n"


def hold_until(go: Path) -> str:
    return f"while [ ! -e {go} ]; do sleep 0.05; done"


def test_a_command_name_that_is_not_utf8_fails_the_job_not_the_daemon(queue: QueueBox) -> None:
    bad = os.fsdecode(b"./no-such-\xff")
    job = queue.add("--gpus", "0", "--no-probe", "--", bad)
    assert queue("queue", "wait", str(job), timeout=HANG).returncode == 127
    row = queue.job(job)
    assert row["state"] == "failed" and "command not found" in row["reason"]
    after = queue.add("--gpus", "0", "--", "true")
    assert queue("queue", "wait", str(after), timeout=HANG).returncode == 0
    assert queue("daemon", "status").returncode == 0


def test_a_daemon_started_by_a_job_outlives_that_job(queue: QueueBox, tmp_path: Path) -> None:
    gpubox = f"{sys.executable} -m gpubox"
    env = {"GPUBOX_QUEUE_MAX_CPU_JOBS": "2"}
    inner = f"{hold_until(tmp_path / 'go-inner')}"
    script = f"{hold_until(tmp_path / 'go1')}; {gpubox} queue add --gpus 0 --shell -- '{inner}' > {tmp_path}/inner-id"
    queue.start_daemon(env=env)
    outer = queue.add("--gpus", "0", "--shell", "--", script, env=env)
    queue.wait_state(outer, ("running",), HANG)
    assert queue("daemon", "stop").returncode == 0
    # With no daemon running, the job's own `queue add` starts one, inside the job's tree.
    (tmp_path / "go1").touch()
    wait_until(lambda: (tmp_path / "inner-id").exists() and (tmp_path / "inner-id").read_text().strip() != "", HANG)
    inner_id = int((tmp_path / "inner-id").read_text())
    queue.wait_state(inner_id, ("running",), HANG)
    queue.wait_state(outer, ("succeeded",), HANG)
    daemon = queue.daemon_pid()
    assert daemon and proctree.is_alive(daemon, None), "the job's end took the daemon with it"
    assert queue.job(inner_id)["state"] == "running", "the job's end took another job with it"
    (tmp_path / "go-inner").touch()
    assert queue("queue", "wait", str(inner_id), timeout=HANG).returncode == 0


# A helper that leaves the job's session and process tree (setsid, then a double fork), and
# writes its pid: orphaned, its parent is init, not the job's supervisor.
ESCAPE = (
    "import os, sys, time\n"
    "if os.fork(): os.wait(); sys.exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n"
    "time.sleep(600)\n"
)


def test_a_killed_supervisor_leaves_no_escaped_helper_running(queue: QueueBox, tmp_path: Path) -> None:
    (tmp_path / "escape.py").write_text(ESCAPE)
    pid_file = tmp_path / "helper.pid"
    script = f"{sys.executable} {tmp_path / 'escape.py'} {pid_file}; {hold_until(tmp_path / 'never')}"
    queue.start_daemon()
    job = queue.add("--gpus", "0", "--shell", "--", script)
    row = queue.wait_state(job, ("running",), HANG)
    wait_until(lambda: pid_file.exists() and pid_file.read_text() != "", HANG, "the helper's pid")
    helper = int(pid_file.read_text())
    assert os.getsid(helper) != row["pid"]  # out of the supervisor's session
    os.kill(row["pid"], signal.SIGKILL)  # the supervisor itself, killed by someone
    ended = queue.wait_state(job, ("lost",), HANG)
    assert "process(es) were killed" in ended["reason"]
    wait_until(lambda: not proctree.is_alive(helper, None), HANG, "the escaped helper to be killed")


def test_a_killed_supervisor_spares_the_daemon_its_job_started(queue: QueueBox, tmp_path: Path) -> None:
    queue.start_daemon()
    outer = queue.add("--gpus", "0", "--shell", "--", hold_until(tmp_path / "never"))
    row = queue.wait_state(outer, ("running",), HANG)
    assert queue("daemon", "stop").returncode == 0
    # A daemon started from inside the job (its `queue add`) carries the job's marks.
    marks = {"GPUBOX_JOB_ID": str(outer), "GPUBOX_JOB_LOG": str(queue.state_dir / "logs" / f"{outer}.1")}
    queue.add("--gpus", "0", "--", "true", env=marks)
    daemon = queue.daemon_pid()
    assert daemon is not None
    assert marks["GPUBOX_JOB_LOG"].encode() in Path(f"/proc/{daemon}/environ").read_bytes()
    wait_until(lambda: proctree.descendants(daemon), HANG, "the daemon's spawner")
    spawner = sorted(proctree.descendants(daemon))[0]  # its first child, and what that forked
    assert marks["GPUBOX_JOB_LOG"].encode() in Path(f"/proc/{spawner}/environ").read_bytes()
    os.kill(row["pid"], signal.SIGKILL)
    queue.wait_state(outer, ("lost",), HANG)
    assert proctree.is_alive(daemon, None), "the daemon was taken for the job's"
    assert proctree.is_alive(spawner, None), "the daemon's spawner was taken for the job's"


def test_a_cancel_is_not_undone_by_retries(queue: QueueBox, tmp_path: Path) -> None:
    job = queue.add("--gpus", "0", "--retries", "2", "--shell", "--", f"{hold_until(tmp_path / 'go')}; exit 3")
    queue.wait_state(job, ("running",), HANG)
    assert queue("queue", "cancel", str(job)).returncode == 0
    assert queue("queue", "wait", str(job), timeout=HANG).returncode != 0
    row = queue.job(job)
    assert (row["state"], row["attempt"]) == ("cancelled", 1)


def test_two_queues_sharing_a_runtime_directory_answer_for_themselves(queue: QueueBox, tmp_path: Path) -> None:
    other = {"GPUBOX_STATE_DIR": str(tmp_path / "other-state")}
    first = queue.add("--gpus", "0", "--", "sh", "-c", "exit 4", env=other)
    assert queue("queue", "wait", str(first), env=other, timeout=HANG).returncode == 4
    mine = queue.add("--gpus", "0", "--", "sh", "-c", "exit 6")
    assert queue("queue", "wait", str(mine), timeout=HANG).returncode == 6
    status = json.loads(queue("daemon", "status", "--json").stdout)["data"]
    assert status["state_dir"] == str(queue.state_dir)
    assert queue("daemon", "stop", env=other).returncode == 0


def test_clean_keeps_a_job_that_a_queued_job_runs_after(queue: QueueBox) -> None:
    first = queue.add("--gpus", "0", "--", "true")
    assert queue("queue", "wait", str(first), timeout=HANG).returncode == 0
    assert queue("queue", "pause").returncode == 0
    second = queue.add("--gpus", "0", "--after", str(first), "--", "true")
    assert queue("queue", "clean").stdout == "removed 0 finished job(s)\n"
    assert queue("queue", "resume").returncode == 0
    assert queue("queue", "wait", str(second), timeout=HANG).returncode == 0


def test_waiting_for_a_job_that_is_cleaned_meanwhile_says_so(queue: QueueBox, tmp_path: Path) -> None:
    job = queue.add("--gpus", "0", "--shell", "--", hold_until(tmp_path / "go"))
    queue.wait_state(job, ("running",), HANG)
    import subprocess

    waiter = subprocess.Popen(
        [sys.executable, "-m", "gpubox", "queue", "wait", str(job)],
        env={**os.environ, **queue.env},
        stderr=subprocess.PIPE,
        text=True,
    )
    (tmp_path / "go").touch()
    queue.wait_state(job, ("succeeded",), HANG)
    # Between two of the waiter's looks, the job may be gone already, or (on a busy machine) before
    # the waiter's first look: whichever, one clear line.
    queue("queue", "clean")
    _, err = waiter.communicate(timeout=HANG)
    said = {
        0: "",
        1: f"gpubox: job {job} was removed (queue clean) before it ended",
        2: f"gpubox: job {job} does not exist",
    }
    assert waiter.returncode in said and err.strip() == said[waiter.returncode], (waiter.returncode, err)


def test_a_huge_job_id_is_a_usage_error(queue: QueueBox) -> None:
    for args in (
        ("queue", "show", "99999999999999999999"),
        ("queue", "add", "--after", "99999999999999999999", "--", "true"),
    ):
        result = queue(*args)
        assert result.returncode == 2, result.stderr
        assert "Traceback" not in result.stderr and len(result.stderr.splitlines()) == 1


def _job(
    job_id: int, kind: str, state: str, priority: int = 0, gpus: int | None = None, uuids: tuple[str, ...] = ()
) -> Job:
    return Job(
        id=job_id,
        spec=JobSpec(argv=("true",), kind=kind, priority=priority, gpus=gpus),
        state=state,
        submitted_at=float(job_id),
        started_at=100.0 if state == "running" else None,
        attempt=1 if state == "running" else 0,
        gpu_uuids=uuids,
    )


def test_unreadable_gpus_hold_gpu_jobs_and_let_cpu_jobs_run() -> None:
    queued = [_job(1, "train", "queued"), _job(2, "other", "queued", gpus=0), _job(3, "infer", "queued", gpus=1)]
    plan = plan_pass(queued, [], {}, None, {}, 200.0, QueueConfig(), gpus_unknown="NVML is not available (x)")
    assert [s.job_id for s in plan.starts] == [2]
    assert plan.waits[1] == plan.waits[3] == "waits for the GPUs to be readable: NVML is not available (x)"


def test_no_preemption_of_a_batch_job_that_would_win_its_gpu_back() -> None:
    from gpubox.queue.gpus import GpuInfo

    gpu = GpuInfo(0, "GPU-a", 80 << 30, 1 << 30)
    batch_high = _job(1, "batch", "running", priority=5, uuids=("GPU-a",))
    batch_low = _job(2, "batch", "running", priority=0, uuids=("GPU-a",))
    infer = _job(3, "infer", "queued", gpus=1)
    on = QueueConfig(preempt=True)
    assert plan_pass([infer], [batch_high], {}, [gpu], {}, 200.0, on).preempts == []
    chosen = plan_pass([infer], [batch_low], {}, [gpu], {}, 200.0, on).preempts
    assert [(p.job_id, p.for_job_id) for p in chosen] == [(2, 3)]


def test_relative_state_and_runtime_folders_are_the_clients_not_the_daemons(
    queue: QueueBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The daemon a client starts works from /: folders given relative to the client's working
    directory are passed to it resolved, so both use the same queue."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    relative = {"GPUBOX_STATE_DIR": "my-state", "GPUBOX_RUNTIME_DIR": "my-run"}
    echo_through(queue, relative)
    assert (work / "my-state" / "queue.db").is_file()
    assert queue("daemon", "stop", env=relative).returncode == 0
    # Started by hand from that directory, the daemon hands its supervisors whole paths too.
    subprocess.Popen(
        [sys.executable, "-m", "gpubox", "daemon"],
        env={**os.environ, **queue.env, **queue.extra_env, **relative},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    wait_until(lambda: queue("daemon", "status", env=relative).returncode == 0, HANG, "the daemon to answer")
    added = queue("queue", "add", "--gpus", "0", "--shell", "--", "echo again", env=relative)
    assert queue("queue", "wait", added.stdout.strip(), env=relative, timeout=HANG).returncode == 0
    assert queue("queue", "logs", added.stdout.strip(), env=relative).stdout == "again\n"
    assert queue("daemon", "stop", env=relative).returncode == 0


def test_a_relative_home_reaches_the_daemon_resolved(
    queue: QueueBox, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With HOME relative (and no folder set otherwise), the queue's state and config are under
    HOME as this client's directory resolves it; the daemon it starts works from /, so it gets
    HOME resolved: both use the same queue (and the same user settings, under the same HOME)."""
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    stray = Path("/") / "me" / ".local" / "state" / "gpubox"  # where a daemon in / would look
    assert not stray.exists()
    env = {
        "HOME": "me",
        "GPUBOX_STATE_DIR": "",
        "GPUBOX_RUNTIME_DIR": "",
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    (tmp_path / "run").mkdir(mode=0o700)
    try:
        echo_through(queue, env)
        assert (work / "me" / ".local" / "state" / "gpubox" / "queue.db").is_file()
        status = queue("daemon", "status", "--json", env=env)
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["data"]["state_dir"] == str(work / "me" / ".local" / "state" / "gpubox")
    finally:
        queue("daemon", "stop", env=env)
        if stray.exists():  # made by a daemon that took HOME from /: stop it, and leave / clean
            queue("daemon", "stop", env={**env, "HOME": "/me"})
            shutil.rmtree("/me")
            pytest.fail("the daemon used a HOME resolved from /, not from the client's directory")
