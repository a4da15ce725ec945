"""The floor under any queue that keeps a durable record and logs, in three shapes, against
task-spooler in the same run.

For each of N `true` jobs, one after another, each shape does only what the record needs: a
commit that starts the job, two log files, `posix_spawn`, the wait, a commit that ends it
(SQLite in WAL mode, synchronous=NORMAL).

- `one`: a single Python process does it all (no daemon, no supervisor), and writes an exit
  record for each job;
- `runner`: gpubox's shape, less its supervisor per job. A planner sends the next launch over a
  socket to one long-lived runner process while the job before runs; the runner opens its logs
  and waits. When a job ends (the runner waits on a pidfd and answers), the planner records the
  end and the next start in one transaction and says "go". One runner for every job instead of
  a supervisor per job: the cheapest form of this shape.
- `chained`: the planner hands the next launch to the runner while the current job runs; the
  runner opens its logs then, and when the job ends records the end and the next start in one
  transaction of its own (checking that the queue's revision has not moved) and starts it at
  once, telling the planner afterwards. The planner is off the path from one job to the next.
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
from collections.abc import Iterator

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


Prepared = tuple[int, list[str], int, int]  # a job, its argv, its two logs


def _prepare(folder: str, launch: dict[str, object]) -> Prepared:
    """Open a launch's two logs ahead of its start."""
    job = int(str(launch["id"]))
    out = os.open(os.path.join(folder, f"{job}.out"), FLAGS, 0o600)
    err = os.open(os.path.join(folder, f"{job}.err"), FLAGS, 0o600)
    return job, [str(a) for a in launch["argv"]], out, err  # type: ignore[attr-defined]


def _start(prepared: Prepared, env: dict[str, str]) -> int:
    """Start a prepared job with its logs; its pid."""
    _, argv, out, err = prepared
    actions = [(os.POSIX_SPAWN_DUP2, out, 1), (os.POSIX_SPAWN_DUP2, err, 2)]
    try:
        return os.posix_spawnp(argv[0], argv, env, file_actions=actions, setpgroup=0)
    finally:
        os.close(out)
        os.close(err)


def _end(job: int, status: int) -> bytes:
    return json.dumps({"job": job, "exit_code": os.waitstatus_to_exitcode(status), "ended_at": time.time()}).encode()


def _exit_record(folder: str, job: int, status: int) -> bytes:
    record = _end(job, status).decode()
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


class _Wakes:
    """What wakes a runner: a message from the planner, or the end of a job it started (watched
    through a pidfd)."""

    def __init__(self, control: socket.socket) -> None:
        self.control = control
        self.sel = selectors.DefaultSelector()
        self.sel.register(control, selectors.EVENT_READ, None)

    def watch(self, job: int, pid: int) -> None:
        self.sel.register(os.pidfd_open(pid), selectors.EVENT_READ, (job, pid))

    def __iter__(self) -> Iterator[tuple[bytes, None] | tuple[None, tuple[int, int]]]:
        """(message, None), or (None, (job, wait status)); ends when the planner hangs up."""
        while True:
            for key, _ in self.sel.select():
                if key.data is None:
                    message = self.control.recv(65536)
                    if not message:
                        return
                    yield message, None
                else:
                    job, pid = key.data
                    self.sel.unregister(key.fd)
                    os.close(key.fd)
                    yield None, (job, os.waitpid(pid, 0)[1])


def _runner(control: socket.socket, folder: str) -> None:
    """Prepare each launch it is sent (its logs), while the job before runs; start it on "go";
    answer with the job's end."""
    wakes = _Wakes(control)
    env = dict(os.environ)
    prepared: Prepared | None = None
    for message, ended in wakes:
        if ended is not None:
            # The end goes over the socket; gpubox writes an exit record only when its daemon
            # does not acknowledge it.
            control.send(_end(*ended))
        elif message is not None and message != b"G":
            prepared = _prepare(folder, json.loads(message))
        else:
            assert prepared is not None
            wakes.watch(prepared[0], _start(prepared, env))
            prepared = None


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
    queued = [row[0] for row in db.execute("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id")]

    def prepare(job: int) -> None:
        row = db.execute("SELECT id, argv FROM jobs WHERE id = ?", (job,)).fetchone()
        ours.send(json.dumps({"id": row[0], "argv": json.loads(row[1])}).encode())

    def end_and_start(ended: dict[str, int] | None) -> bool:
        """Record the end and the start of the job prepared, say go, then prepare the one after."""
        db.execute("BEGIN IMMEDIATE")
        if ended is not None:
            db.execute(
                "UPDATE jobs SET state = 'succeeded', exit_code = ? WHERE id = ?", (ended["exit_code"], ended["job"])
            )
        nxt = queued.pop(0) if queued else None
        if nxt is not None:
            db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (nxt,))
        db.execute("COMMIT")
        if nxt is None:
            return False
        ours.send(b"G")
        if queued:
            prepare(queued[0])
        return True

    t0 = time.perf_counter()
    if queued:
        prepare(queued[0])
    running = end_and_start(None)
    while running:
        running = end_and_start(json.loads(ours.recv(65536)))
    took = time.perf_counter() - t0
    ours.close()
    os.waitpid(pid, 0)
    assert db.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0] == n
    shutil.rmtree(folder)
    return took


def _chained_runner(control: socket.socket, folder: str, db_path: str) -> None:
    """Run the launch it was given; while a job runs, take and prepare the next one; when the job
    ends, record its end and the next start in one transaction of its own (if the queue is as
    the planner saw it), start the next job at once, then tell the planner."""
    db = sqlite3.connect(db_path, isolation_level=None)
    db.execute("PRAGMA synchronous=NORMAL")
    env = dict(os.environ)
    wakes = _Wakes(control)
    prepared: Prepared | None = None
    running = False
    for message, ended in wakes:
        if ended is None:
            assert message is not None
            prepared = _prepare(folder, json.loads(message))
            if running:
                continue  # it starts when the job running now ends
            db.execute("BEGIN IMMEDIATE")
            db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (prepared[0],))
            db.execute("COMMIT")
        else:
            running = False
            job, status = ended
            db.execute("BEGIN IMMEDIATE")
            db.execute("SELECT value FROM rev").fetchone()  # the planner's guess still holds
            code = os.waitstatus_to_exitcode(status)
            db.execute("UPDATE jobs SET state = 'succeeded', exit_code = ? WHERE id = ?", (code, job))
            if prepared is not None:
                db.execute("UPDATE jobs SET state = 'running' WHERE id = ?", (prepared[0],))
            db.execute("COMMIT")
            if prepared is None:
                control.send(json.dumps({"ended": job}).encode())
                continue
        wakes.watch(prepared[0], _start(prepared, env))
        running = True
        control.send(json.dumps({"started": prepared[0]}).encode())
        prepared = None


def planner_and_chained_runner(n: int) -> float:
    folder = tempfile.mkdtemp(prefix="gpubox-floor-")
    db = _db(folder, n)
    # Every change to a job moves the revision: a runner starts the next job only if it has not
    # moved since the planner chose that job.
    db.execute("CREATE TABLE rev (value INTEGER)")
    db.execute("INSERT INTO rev VALUES (0)")
    db.execute("CREATE TRIGGER jobs_rev AFTER UPDATE ON jobs BEGIN UPDATE rev SET value = value + 1; END")
    ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    pid = os.fork()
    if pid == 0:
        ours.close()
        try:
            _chained_runner(theirs, folder, os.path.join(folder, "q.db"))
        finally:
            os._exit(0)
    theirs.close()
    queued = [row[0] for row in db.execute("SELECT id FROM jobs WHERE state = 'queued' ORDER BY id")]
    in_flight = 0  # launches sent and not started yet

    def send_next() -> None:
        nonlocal in_flight
        row = db.execute("SELECT id, argv FROM jobs WHERE id = ?", (queued.pop(0),)).fetchone()
        ours.send(json.dumps({"id": row[0], "argv": json.loads(row[1])}).encode())
        in_flight += 1

    t0 = time.perf_counter()
    if queued:
        send_next()
    while in_flight or queued:
        said = json.loads(ours.recv(65536))
        if "started" in said:
            in_flight -= 1
            if queued:  # plan the next while this one runs
                send_next()
        elif not in_flight:
            break  # ended with nothing prepared or on its way: the stream is done
    while in_flight == 0 and "ended" not in said:  # the last job's end
        said = json.loads(ours.recv(65536))
    took = time.perf_counter() - t0
    ours.close()
    os.waitpid(pid, 0)
    assert db.execute("SELECT count(*) FROM jobs WHERE state = 'succeeded'").fetchone()[0] == n
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
    shapes = {
        "one": one_process,
        "runner": planner_and_runner,
        "chained": planner_and_chained_runner,
        "tsp": task_spooler,
    }
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
