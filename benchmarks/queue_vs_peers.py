"""The figures behind benchmarks/queue_vs_peers.sh (run that; it installs the peers).

1. Throughput: N jobs running `true`, one at a time (each tool's default: one slot; `--slots K`
   gives gpubox and task-spooler K; nq has no such setting and stays at one), from the first
   submission to the last job finished. Each tool submits its fastest way:
   gpubox `queue add --file` (one call), task-spooler one `tsp true` per job (its server starts
   on the first call, as gpubox's daemon does; its slots come from TS_SLOTS), nq one `nq true`
   per job. The end is when the tool's own wait returns (`tsp -w`, `nq -w`, `gpubox queue
   wait`; with `--add-wait`, gpubox's add itself, `queue add --file ... --wait`). `--warm`
   starts gpubox's daemon and task-spooler's server before the clock, as a daemon that systemd
   runs would be.
2. Latency of one `gpubox queue add --gpus 0 -- true` with the daemon running (median of 40).
3. Daemon CPU while idle, with N finished and 100 queued jobs (the queue paused), over 20 s.

`--baseline DIR` also runs, in the same rounds, the gpubox found in DIR (a checkout or `git
archive` of another commit, first on PYTHONPATH): a before and after under the same load.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

# -P: `-m` would put the working directory first on the path, and from this project's folder
# the gpubox there would answer even where PYTHONPATH names another (--baseline).
GPUBOX = [sys.executable, "-P", "-m", "gpubox"]
TICK = os.sysconf("SC_CLK_TCK")
SLOTS = 1
WARM = False
ADD_WAIT = False


def _env(home: Path) -> dict[str, str]:
    # PYTHONDONTWRITEBYTECODE off: an installed gpubox has its .pyc files, as pip writes them.
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("GPUBOX_", "TS_", "NQ")) and k != "PYTHONDONTWRITEBYTECODE"
    }
    env.update(
        HOME=str(home),
        GPUBOX_STATE_DIR=str(home / "state"),
        GPUBOX_RUNTIME_DIR=str(home / "run"),
        GPUBOX_SYSTEM_CONFIG=str(home / "none.toml"),
        TS_SOCKET=str(home / "ts.sock"),
        TS_MAXFINISHED=str(100000),
        TS_SLOTS=str(SLOTS),
        TMPDIR=str(home / "tmp"),
        NQDIR=str(home / "nq"),
        GPUBOX_QUEUE_MAX_CPU_JOBS=str(SLOTS),
    )
    (home / "tmp").mkdir(parents=True, exist_ok=True)
    (home / "nq").mkdir(parents=True, exist_ok=True)
    return env


def _run(cmd: list[str], env: dict[str, str], **kw: object) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, env=env, check=True, text=True, capture_output=True, **kw)  # type: ignore[call-overload]


def gpubox_throughput(n: int, home: Path, pythonpath: str | None = None) -> float:
    env = _env(home)
    if pythonpath is not None:
        env["PYTHONPATH"] = pythonpath
    jobs = home / "jobs.txt"
    jobs.write_text("true\n" * n)
    if WARM:
        subprocess.Popen([*GPUBOX, "daemon"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        while subprocess.run([*GPUBOX, "daemon", "status"], env=env, capture_output=True).returncode:
            time.sleep(0.05)
    t0 = time.perf_counter()
    add = [*GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--file", str(jobs)]
    if ADD_WAIT:  # (not in a baseline from before `queue add --wait`)
        _run([*add, "--wait"], env)
    else:
        out = _run(add, env).stdout.split()
        _run([*GPUBOX, "queue", "wait", out[-1]], env)
    elapsed = time.perf_counter() - t0
    states = _run([*GPUBOX, "queue", "ls", "--all", "--json"], env).stdout
    assert states.count('"state": "succeeded"') == n, "not every gpubox job succeeded"
    return elapsed


def tsp_throughput(n: int, home: Path) -> float:
    env = _env(home)
    if WARM:
        subprocess.run(["tsp", "-S", str(SLOTS)], env=env, check=True, stdout=subprocess.DEVNULL)  # starts it
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["tsp", "true"], env=env, check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["tsp", "-w"], env=env, check=False, stdout=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    listing = _run(["tsp"], env).stdout
    assert listing.count("finished") == n, "not every task-spooler job finished"
    subprocess.run(["tsp", "-K"], env=env, check=False, capture_output=True)
    return elapsed


def nq_throughput(n: int, home: Path) -> float:
    env = _env(home)
    t0 = time.perf_counter()
    for _ in range(n):
        subprocess.run(["nq", "true"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run(["nq", "-w"], env=env, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    elapsed = time.perf_counter() - t0
    assert len(list((home / "nq").glob(",*"))) == n, "not every nq job ran"
    return elapsed


def add_latency(home: Path, runs: int = 40) -> list[float]:
    env = _env(home)
    _run([*GPUBOX, "queue", "pause"], env)
    _run([*GPUBOX, "queue", "add", "--gpus", "0", "--", "true"], env)  # starts the daemon
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        _run([*GPUBOX, "queue", "add", "--gpus", "0", "--", "true"], env)
        times.append(time.perf_counter() - t0)
    return times


def idle_cpu(n: int, home: Path, seconds: float = 20.0) -> float:
    env = _env(home)
    jobs = home / "jobs.txt"
    jobs.write_text("true\n" * n)
    last = _run([*GPUBOX, "queue", "add", "--gpus", "0", "--no-probe", "--file", str(jobs)], env).stdout.split()[-1]
    _run([*GPUBOX, "queue", "wait", last], env)
    _run([*GPUBOX, "queue", "pause"], env)
    jobs.write_text("true\n" * 100)
    _run([*GPUBOX, "queue", "add", "--gpus", "0", "--file", str(jobs)], env)
    pid = int((home / "state" / "daemon.lock").read_text().split()[0])

    def cpu() -> float:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / TICK

    time.sleep(2.0)  # let the resume of the last pass settle
    c0, t0 = cpu(), time.monotonic()
    time.sleep(seconds)
    return 100.0 * (cpu() - c0) / (time.monotonic() - t0)


def _stop(home: Path, pythonpath: str | None = None) -> None:
    env = _env(home) if pythonpath is None else {**_env(home), "PYTHONPATH": pythonpath}
    subprocess.run([*GPUBOX, "daemon", "stop"], env=env, capture_output=True, check=False)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=3, help="throughput runs per tool (median reported)")
    parser.add_argument("--slots", type=int, default=1, help="jobs at once for gpubox and task-spooler")
    parser.add_argument("--baseline", type=Path, help="also run the gpubox in this directory, in the same rounds")
    parser.add_argument("--warm", action="store_true", help="start gpubox's daemon and tsp's server before the clock")
    parser.add_argument("--add-wait", action="store_true", help="gpubox waits by `queue add --wait`, not `queue wait`")
    args = parser.parse_args()
    missing = [tool for tool in ("tsp", "nq") if shutil.which(tool) is None]
    if missing:
        print(f"queue_vs_peers: {', '.join(missing)} not found (queue_vs_peers.sh installs them)", file=sys.stderr)
        return 2
    global SLOTS, WARM, ADD_WAIT
    SLOTS, WARM, ADD_WAIT = args.slots, args.warm, args.add_wait
    gpubox_dir = Path(__file__).resolve().parent.parent / "gpubox"
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": ""}
    baseline = None if args.baseline is None else str(args.baseline.resolve())
    for folder in (gpubox_dir, *(() if baseline is None else (Path(baseline) / "gpubox",))):
        subprocess.run(
            [sys.executable, "-m", "compileall", "-q", str(folder)], check=False, capture_output=True, env=env
        )
    root = Path(tempfile.mkdtemp(prefix="gpubox-bench-"))
    tools: list[tuple[str, Callable[[int, Path], float]]] = [("gpubox", gpubox_throughput)]
    if baseline is not None:
        tools.append(("gpubox (baseline)", lambda n, home: gpubox_throughput(n, home, baseline)))
    tools += [("task-spooler", tsp_throughput), ("nq", nq_throughput)]
    results: dict[str, list[float]] = {name: [] for name, _ in tools}
    try:
        for r in range(args.rounds):  # interleaved, so a busy moment hits every tool alike
            for name, fn in tools:
                home = root / f"{name.replace(' (baseline)', '-baseline')}-{r}"
                try:
                    results[name].append(fn(args.jobs, home))
                finally:
                    if name.startswith("gpubox"):
                        _stop(home, baseline if name != "gpubox" else None)
        print(
            f"{args.jobs} jobs running `true`, {SLOTS} slot(s) (nq: 1), first submission to last job finished "
            f"(median of {args.rounds}{', daemons started before the clock' if WARM else ''}"
            f"{'; gpubox waits with queue add --wait' if ADD_WAIT else ''}):"
        )
        print("| tool | median s | min s | jobs/s |")
        print("|---|---:|---:|---:|")
        for name, times in results.items():
            med = statistics.median(times)
            print(f"| {name} | {med:.2f} | {min(times):.2f} | {args.jobs / med:.0f} |")
        home = root / "latency"
        try:
            lat = add_latency(home)
        finally:
            _stop(home)
        print(
            f"\none `gpubox queue add` with the daemon running: median {1000 * statistics.median(lat):.1f} ms, "
            f"min {1000 * min(lat):.1f} ms, max {1000 * max(lat):.1f} ms ({len(lat)} runs)"
        )
        home = root / "idle"
        try:
            pct = idle_cpu(args.jobs, home)
        finally:
            _stop(home)
        print(f"daemon CPU while idle with {args.jobs} finished and 100 queued jobs: {pct:.2f}% of one core")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
