"""What the dataloader probe costs a training process.

    .venv/bin/python benchmarks/probe_overhead.py
    .venv/bin/python benchmarks/probe_overhead.py --calls 200000 --rounds 9 --steps 2000 --loop-rounds 9

(a) The wrapper alone: `next()` on a trivial iterator whose `__next__` is wrapped exactly as the
    DataLoader's is (the same gpubox.probe.hook.timed, publishing into a real probe file),
    against the same iterator unwrapped; ns per call, median of rounds. Goal: at most 2 µs.
(b) A training loop: 1 ms steps (busy-wait) over an in-memory DataLoader, with and without the
    probe, alternated round by round; the median slowdown. Goal: under 0.5%.

Probe files go to a temporary runtime directory, removed at the end. Needs torch for (b).
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from typing import Any

GOAL_NS = 2000
GOAL_SLOWDOWN = 0.005


class Trivial:
    """An iterator that costs next to nothing, so what is measured is the wrapper."""

    def __iter__(self) -> Trivial:
        return self

    def __next__(self) -> int:
        return 1


def per_call_ns(it: Any, calls: int) -> float:
    nxt = next
    start = time.perf_counter_ns()
    for _ in range(calls):
        nxt(it)
    return (time.perf_counter_ns() - start) / calls


def wrapper_cost(calls: int, rounds: int) -> tuple[float, float, float]:
    from gpubox.probe import hook

    class Wrapped(Trivial):
        pass

    Wrapped.__next__ = hook.timed(Trivial.__next__)  # type: ignore[method-assign]
    plain, wrapped = Trivial(), Wrapped()
    per_call_ns(wrapped, 1000)  # the probe file is created here, outside the timing
    base, timed = [], []
    for _ in range(rounds):
        base.append(per_call_ns(plain, calls))
        timed.append(per_call_ns(wrapped, calls))
    b, t = statistics.median(base), statistics.median(timed)
    return b, t, statistics.median(x - y for x, y in zip(timed, base, strict=True))


def busy_wait(ns: int) -> None:
    end = time.perf_counter_ns() + ns
    while time.perf_counter_ns() < end:
        pass


def loop_seconds(loader: Any, steps: int, step_ns: int) -> float:
    start = time.perf_counter()
    done = 0
    while done < steps:
        for _batch in loader:
            busy_wait(step_ns)
            done += 1
            if done == steps:
                break
    return time.perf_counter() - start


def loop_slowdown(steps: int, rounds: int, step_ns: int) -> tuple[float, float, float]:
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import dataloader as dl

    from gpubox.probe import hook

    loader = DataLoader(TensorDataset(torch.arange(4096.0).reshape(-1, 4)), batch_size=8, shuffle=True)
    original = dl._BaseDataLoaderIter.__dict__["__next__"]
    probed = hook.timed(original)

    def with_probe(on: bool) -> None:
        type.__setattr__(dl._BaseDataLoaderIter, "__next__", probed if on else original)

    runs: dict[bool, list[float]] = {False: [], True: []}
    slowdowns = []
    for r in range(rounds + 1):
        pair = {}
        for on in (r % 2 == 0, r % 2 == 1):  # alternate which goes first
            with_probe(on)
            pair[on] = loop_seconds(loader, steps, step_ns)
        if r:  # the first round warms up
            runs[False].append(pair[False])
            runs[True].append(pair[True])
            slowdowns.append(pair[True] / pair[False] - 1)
    with_probe(False)
    return statistics.median(runs[False]), statistics.median(runs[True]), statistics.median(slowdowns)


def table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="next() calls per round in (a)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds in (a)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps per run in (b)")
    parser.add_argument("--loop-rounds", type=int, default=9, help="runs with and without the probe in (b)")
    parser.add_argument("--step-ms", type=float, default=1.0, help="busy-wait per training step in (b)")
    args = parser.parse_args(argv)

    with tempfile.TemporaryDirectory() as runtime:
        os.environ["GPUBOX_RUNTIME_DIR"] = runtime
        print(f"Python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.machine()}", file=sys.stderr)
        base, timed, extra = wrapper_cost(args.calls, args.rounds)
        rows = [("measure", "without probe", "with probe", "cost", "goal", "met")]
        rows.append(
            (
                "(a) next() on a trivial iterator",
                f"{base:.0f} ns",
                f"{timed:.0f} ns",
                f"{extra:.0f} ns per batch",
                f"<= {GOAL_NS} ns",
                "yes" if extra <= GOAL_NS else "NO",
            )
        )
        try:
            off, on, slowdown = loop_slowdown(args.steps, args.loop_rounds, int(args.step_ms * 1e6))
        except ImportError:
            print("torch is not installed: (b) skipped", file=sys.stderr)
        else:
            rows.append(
                (
                    f"(b) {args.steps} steps of {args.step_ms:g} ms",
                    f"{off:.3f} s",
                    f"{on:.3f} s",
                    f"{slowdown * 100:+.2f}% (median)",
                    f"< {GOAL_SLOWDOWN * 100:g}%",
                    "yes" if slowdown < GOAL_SLOWDOWN else "NO",
                )
            )
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
