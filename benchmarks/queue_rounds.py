"""Throughput rounds of gpubox builds and task-spooler in a folder of choice, each round's folder
removed when the round ends (as queue_vs_peers.py keeps them all to the end instead).

On ext4 without a journal, a new file is slow to make for minutes after many files were
deleted near it (ext4 scans past the recently freed inodes), so a tool that makes files for each
job pays for the rounds before it. This shows what that does to each tool, and what it does not
do on tmpfs (`--folder /dev/shm`). The measures are queue_vs_peers.py's own.

    .venv/bin/python benchmarks/queue_rounds.py --rounds 8 [--folder /tmp] [--jobs 1000] [DIR=label ...]

Each DIR=label is a gpubox tree (a checkout or `git archive`, first on PYTHONPATH); without
any, the gpubox of this checkout.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import queue_vs_peers as peers  # the same environment and commands


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--jobs", type=int, default=1000)
    parser.add_argument("--folder", default="/tmp", help="where each round's folder is made (and removed)")
    parser.add_argument("trees", nargs="*", metavar="DIR=label")
    args = parser.parse_args()
    here = str(Path(__file__).resolve().parent.parent)
    trees = [tuple(t.split("=", 1)) for t in args.trees] or [(here, "gpubox")]
    times: dict[str, list[float]] = {label: [] for _, label in trees}
    times["task-spooler"] = []
    for r in range(args.rounds):  # interleaved: a slow moment of the machine hits every tool
        for tree, label in trees:
            with tempfile.TemporaryDirectory(dir=args.folder) as home:
                try:
                    times[label].append(peers.gpubox_throughput(args.jobs, Path(home), tree))
                finally:
                    peers._stop(Path(home), tree)
        with tempfile.TemporaryDirectory(dir=args.folder) as home:
            times["task-spooler"].append(peers.tsp_throughput(args.jobs, Path(home)))
        print(f"round {r + 1}: " + ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()), flush=True)
    tsp = statistics.median(times["task-spooler"])
    print(f"\n{args.jobs} `true` jobs, {args.rounds} rounds under {args.folder}:")
    print("| tool | median s | min s | ratio to task-spooler |")
    print("|---|---:|---:|---:|")
    for label, values in times.items():
        median = statistics.median(values)
        print(f"| {label} | {median:.2f} | {min(values):.2f} | {median / tsp:.2f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
