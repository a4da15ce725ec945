"""Start-up time of the gpubox commands that people and scripts run most, against bare Python.

Each command starts as a new process, N times, the commands interleaved so that a busy moment
of the machine falls on all of them alike; the table shows the median and the ratio to
`python -c pass` with the same interpreter. The budget: `gpubox --version` within 3x of it.

    python benchmarks/startup.py               # 30 runs of each
    python benchmarks/startup.py --runs 100
    python benchmarks/startup.py --importtime  # also: what `gpubox --help` imports, slowest first

Run it with the Python of the environment gpubox is installed in (its `gpubox` script sits next
to that interpreter). Exits 1 when `gpubox --version` is over budget.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

BUDGET = 3.0  # `gpubox --version` may take at most this many times `python -c pass`


def commands(python: str, gpubox: str) -> dict[str, list[str]]:
    return {
        "python3 -c pass": [python, "-c", "pass"],
        "gpubox --version": [gpubox, "--version"],
        "gpubox --help": [gpubox, "--help"],
        "gpubox queue --help": [gpubox, "queue", "--help"],
        "gpubox top --help": [gpubox, "top", "--help"],
    }


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, stdin=subprocess.DEVNULL, env=env, check=True
    )
    return time.perf_counter() - start


def measure(cmds: dict[str, list[str]], runs: int, env: dict[str, str]) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {name: [] for name in cmds}
    for argv in cmds.values():  # one unmeasured run each: page cache and .pyc files in place
        time_once(argv, env)
    for _ in range(runs):
        for name, argv in cmds.items():
            times[name].append(time_once(argv, env))
    return times


def import_report(gpubox: str, python: str, top: int, env: dict[str, str]) -> str:
    """The modules `gpubox --help` spends the most time importing (cumulative, with children)."""
    result = subprocess.run(
        [python, "-X", "importtime", gpubox, "--help"], capture_output=True, text=True, env=env, check=True
    )
    rows = []
    for line in result.stderr.splitlines():
        match = re.match(r"import time:\s+(\d+) \|\s+(\d+) \| ( *)(\S+)", line)
        if match:
            rows.append((int(match.group(2)), int(match.group(1)), len(match.group(3)) // 2, match.group(4)))
    rows.sort(reverse=True)
    lines = [f"{'cumulative ms':>13}  {'self ms':>7}  depth  module"]
    lines += [f"{cum / 1000:13.1f}  {own / 1000:7.1f}  {depth:5d}  {name}" for cum, own, depth, name in rows[:top]]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description="Start-up time of gpubox commands against bare Python.")
    parser.add_argument("--runs", type=int, default=30, help="runs of each command (default 30)")
    parser.add_argument("--importtime", action="store_true", help="also list what `gpubox --help` imports")
    parser.add_argument("--top", type=int, default=25, help="modules in the import list (default 25)")
    args = parser.parse_args()

    python = sys.executable
    gpubox = str(Path(python).parent / "gpubox")
    if not os.access(gpubox, os.X_OK):
        gpubox = shutil.which("gpubox") or ""
    if not gpubox:
        sys.stderr.write("no `gpubox` script next to this Python or on PATH: pip install -e . first\n")
        return 2
    env = {**os.environ, "COLUMNS": "80", "TERM": "dumb"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    times = measure(commands(python, gpubox), args.runs, env)
    base = statistics.median(times["python3 -c pass"])
    print(f"{args.runs} runs each, interleaved; {python} (Python {sys.version.split()[0]}); {gpubox}")
    print(f"{'command':<22} {'median ms':>10} {'min ms':>8} {'x python':>9}")
    for name, samples in times.items():
        median = statistics.median(samples)
        print(f"{name:<22} {median * 1000:10.1f} {min(samples) * 1000:8.1f} {median / base:9.2f}")
    ratio = statistics.median(times["gpubox --version"]) / base
    verdict = "within" if ratio <= BUDGET else "OVER"
    print(f"budget: gpubox --version <= {BUDGET:.0f}x python -c pass: {ratio:.2f}x, {verdict} budget")
    if args.importtime:
        print()
        print(import_report(gpubox, python, args.top, env))
    return 0 if ratio <= BUDGET else 1


if __name__ == "__main__":
    raise SystemExit(main())
