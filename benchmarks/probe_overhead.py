"""What the dataloader probe costs a training process.

    .venv/bin/python benchmarks/probe_overhead.py
    .venv/bin/python benchmarks/probe_overhead.py --calls 200000 --rounds 9 --steps 2000 --chunk 10 --loop-rounds 9

(a) The wrapper alone: `next()` on a trivial iterator whose `__next__` is wrapped exactly as the
    DataLoader's is (the same gpubox.probe.hook.timed, publishing into a real probe file),
    against the same iterator unwrapped; ns per call, median of rounds. Goal: at most 2 µs.
(b) A training loop: 1 ms steps (busy-wait) over an in-memory DataLoader, with and without the
    probe, alternated every few steps so that a busy moment of the machine falls on both alike;
    the slowdown per round, median of rounds, with quartiles to show the noise. Goal: under 0.5%.

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
from collections.abc import Sequence
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

    Wrapped.__next__ = hook.timed(Trivial.__next__)  # type: ignore[method-assign,assignment]
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


class Steps:
    """Training steps over a loader, epoch after epoch, with the probe on or off between chunks."""

    def __init__(self, loader: Any, step_ns: int) -> None:
        self.loader, self.step_ns = loader, step_ns
        self.it = iter(loader)

    def seconds(self, steps: int) -> float:
        start = time.perf_counter()
        for _ in range(steps):
            try:
                next(self.it)
            except StopIteration:
                self.it = iter(self.loader)
                next(self.it)
            busy_wait(self.step_ns)
        return time.perf_counter() - start


def loop_slowdown(steps: int, rounds: int, step_ns: int, chunk: int) -> tuple[float, float, list[float]]:
    """Per round, `steps` steps with the probe and as many without, switched every `chunk`
    steps, so a busy moment of the machine falls on both alike."""
    import torch
    from torch.utils.data import DataLoader, TensorDataset
    from torch.utils.data import dataloader as dl

    from gpubox.probe import hook

    loader = DataLoader(TensorDataset(torch.arange(4096.0).reshape(-1, 4)), batch_size=8, shuffle=True)
    original = dl._BaseDataLoaderIter.__dict__["__next__"]
    probed = hook.timed(original)
    run = Steps(loader, step_ns)
    totals: dict[bool, list[float]] = {False: [], True: []}
    slowdowns = []
    for r in range(rounds + 1):
        spent = {False: 0.0, True: 0.0}
        for c in range(2 * steps // chunk):
            on = (c + r) % 2 == 0
            type.__setattr__(dl._BaseDataLoaderIter, "__next__", probed if on else original)
            spent[on] += run.seconds(chunk)
        if r:  # the first round warms up
            totals[False].append(spent[False])
            totals[True].append(spent[True])
            slowdowns.append(spent[True] / spent[False] - 1)
    type.__setattr__(dl._BaseDataLoaderIter, "__next__", original)
    return statistics.median(totals[False]), statistics.median(totals[True]), slowdowns


def table(rows: Sequence[tuple[str, ...]]) -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) + " |" for r in rows]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.partition("\n")[0])
    parser.add_argument("--calls", type=int, default=200_000, help="next() calls per round in (a)")
    parser.add_argument("--rounds", type=int, default=9, help="rounds in (a)")
    parser.add_argument("--steps", type=int, default=2000, help="training steps with the probe per round in (b)")
    parser.add_argument("--chunk", type=int, default=10, help="steps between switching the probe on or off in (b)")
    parser.add_argument("--loop-rounds", type=int, default=9, help="rounds in (b)")
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
            off, on, slowdowns = loop_slowdown(args.steps, args.loop_rounds, int(args.step_ms * 1e6), args.chunk)
        except ImportError:
            print("torch is not installed: (b) skipped", file=sys.stderr)
        else:
            slowdown = statistics.median(slowdowns)
            low, _, high = statistics.quantiles(slowdowns, n=4)
            rows.append(
                (
                    f"(b) {args.steps} steps of {args.step_ms:g} ms",
                    f"{off:.3f} s",
                    f"{on:.3f} s",
                    f"{slowdown * 100:+.2f}% (quartiles {low * 100:+.2f}%, {high * 100:+.2f}%)",
                    f"< {GOAL_SLOWDOWN * 100:g}%",
                    "yes" if slowdown < GOAL_SLOWDOWN else "NO",
                )
            )
            # What (a) predicts: the wrapper's cost over one step of the loop without the probe.
            print(f"(a) predicts a slowdown of {extra / (off / args.steps * 1e9) * 100:+.3f}%", file=sys.stderr)
        print(table(rows))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
