"""The floor under any queue that keeps a durable record and logs, in two shapes, against
task-spooler in the same run.

For each of N `true` jobs, one after another, each shape does only what the record needs: a
commit that starts the job, two log files, `posix_spawn`, the wait, an exit record, a commit
that ends it (SQLite in WAL mode, synchronous=NORMAL).

- `one`: a single Python process does it all (no daemon, no supervisor);
- `runner`: a planner process commits and sends each launch over a socket to one long-lived
  runner process, which starts the job, waits on a pidfd and answers; the planner records the
  end and the next start in one transaction. This is the cheapest shape a daemon whose jobs
  outlive it can take: one runner for every job instead of a supervisor per job.
- `tsp`: task-spooler, one `tsp true` a job, then `tsp -w` (skipped when it is not installed).

    .venv/bin/python benchmarks/queue_floor.py --jobs 1000 --rounds 5
"""

from __future__ import annotations

import argparse
import json
import os
import selectors
import shutil
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time

FLAGS = os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC


def _db(folder: str, n: int) -> sqlite3.Connection:
    db = sqlite3.connect(os.path.join(folder, "q.db"), isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA synchronous=NORMAL")
    db.execute("CREATE TABLE jobs (id INTEGER PRIMARY KEY, state TEXT, exit_code INTEGER, argv TEXT)")
    db.executemany("INSERT INTO jobs (state, argv) VALUES ('queued', '[\"true\"]')", [()] * n)
    return db


def _spawn(folder: str, job: int, argv: list[str], env: dict[str, str]) -> int:
    out = os.open(os.path.join(folder, f"{job}.out"), FLAGS, 0o600)
    err = os.open(os.path.join(folder, f"{job}.err"), FLAGS, 0o600)
    try:
        actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
        return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setpgroup=0)
    finally:
        os.close(out)
        os.close(err)


def _exit_record(folder: str, job: int, status: int) -> bytes:
    record = json.dumps({"job": job, "exit_code": os.waitstatus_to_exitcode(status), "ended_at": time.time()})
    fd = os.open(os.path.join(folder, f"{job}.exit"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    os.write(fd, record.encode())
    os.close(fd)
    return record.encode()


def one_process(n: int) -> float:
    folder = tempfile.mkdtemp(prefix="gpubox-floor-")
    db = _db(folder, n)
    env = dict(os.environ)
    t0 = time.perf_counter()
    for i in range(1, n + 1):
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (i,))
        db.execute("COMMIT")
        _, status = os.waitpid(_spawn(folder, i, ["true"], env), 0)
        _exit_record(folder, i, status)
        db.execute("BEGIN IMMEDIATE")
        db.execute("UPDATE jobs SET state = 'succeeded', exit_code = 0 WHERE id = ?", (i,))
        db.execute("COMMIT")
    took = time.perf_counter() - t0
    shutil.rmtree(folder)
    return took


def _runner(control: socket.socket, folder: str) -> None:
    """Start each launch it is sent; answer with the exit record when the job ends."""
    sel = selectors.DefaultSelector()
    sel.register(control, selectors.EVENT_READ, None)
    env = dict(os.environ)
    while True:
        for key, _ in sel.select():
            if key.data is None:
                message = control.recv(65536)
                if not message:
                    return
                launch = json.loads(message)
                pid = _spawn(folder, launch["id"], launch["argv"], env)
                sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (launch["id"], pid))
            else:
                job, pid = key.data
                sel.unregister(key.fd)
                os.close(key.fd)
                _, status = os.waitpid(pid, 0)
                control.send(_exit_record(folder, job, status))


def planner_and_runner(n: int) -> float:
    folder = tempfile.mkdtemp(prefix="gpubox-floor-")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            _runner(theirs, folder)
        finally:
            os._exit(0)
    theirs.close()
    db = _db(folder, n)

    def end_and_start(ended: dict[str, int] | None) -> bool:
        db.execute("BEGIN IMMEDIATE")
        if ended is not None:
            db.execute(
                "UPDATE jobs SET state = 'succeeded', exit_code = ? WHERE id = ?", (ended["exit_code"], ended["job"])
            )
        row = db.execute("SELECT id, argv FROM jobs WHERE state = 'queued' ORDER BY id LIMIT 1").fetchone()
        if row is not None:
            db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (row[0],))
        db.execute("COMMIT")
        if row is not None:
            ours.send(json.dumps({"id": row[0], "argv": json.loads(row[1])}).encode())
        return row is not None

    t0 = time.perf_counter()
    running = end_and_start(None)
    while running:
        running = end_and_start(json.loads(ours.recv(65536)))
    took = time.perf_counter() - t0
    ours.close()
    os.waitpid(pid, 0)
    shutil.rmtree(folder)
    return took


def task_spooler(n: int) -> float | None:
    tsp = shutil.which("tsp") or shutil.which("ts")
    if tsp is None:
        return None
    folder = tempfile.mkdtemp(prefix="gpubox-floor-tsp-")
    env = {**os.environ, "TS_SOCKET": os.path.join(folder, "ts.sock"), "TMPDIR": folder}
    quiet = {"env": env, "stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    # Submitted from a shell loop, as a user would: a fork of this Python would cost more.
    script = f'i=0; while [ $i -lt {n} ]; do "$0" true; i=$((i+1)); done; "$0" -w'
    t0 = time.perf_counter()
    subprocess.run(["sh", "-c", script, tsp], **quiet)  # type: ignore[call-overload]
    took = time.perf_counter() - t0
    subprocess.run([tsp, "-K"], **quiet)  # type: ignore[call-overload]
    shutil.rmtree(folder, ignore_errors=True)
    return took


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    shapes = {"one": one_process, "runner": planner_and_runner, "tsp": task_spooler}
    times: dict[str, list[float]] = {name: [] for name in shapes}
    for _ in range(args.rounds):  # interleaved: a slow moment of the machine hits every shape
        for name, run in shapes.items():
            took = run(args.jobs)
            if took is not None:
                times[name].append(took)
    print(f"{args.jobs} `true` jobs one after another, {args.rounds} rounds:")
    for name, values in times.items():
        if values:
            runs = ", ".join(f"{v:.2f}" for v in values)
            print(f"  {name:7} median {statistics.median(values):.2f} s ({runs})")
        else:
            print(f"  {name:7} not installed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
