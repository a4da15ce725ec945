"""Shared pieces for the live-view tests: deterministic simulated boxes and patient waits."""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Callable

from textual import events
from textual.app import App
from textual.pilot import Pilot

from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, Reason
from gpubox.telemetry.simulated import SimulatedBackend
from gpubox.tui.top_app import TopApp

NOW = 1_700_000_000.0  # the simulated clock: uptimes and snapshots never depend on the real one
WAIT = 20.0  # generous: these waits guard against hangs, they do not measure speed


def sim(gpus: int = 2, processes: int = 6) -> SimulatedBackend:
    return SimulatedBackend(gpus=gpus, processes=processes, clock=lambda: NOW)


_KEY_NAMES = {"/": "slash", ":": "colon", "?": "question_mark", " ": "space"}
_KEY_CHARS = {name: char for char, name in _KEY_NAMES.items()}


def keys_in_one_read(app: App[int], *keys: str) -> None:
    """Queue keys as one read of the terminal brings them (typed fast, a slow link, a long
    redraw): all are on their way before the first is handled. A key is a name ("enter", "tab")
    or a character ("/", "a")."""
    for key in keys:
        name = _KEY_NAMES.get(key, key)
        char = _KEY_CHARS.get(name, name if len(name) == 1 else None)
        app.post_message(events.Key(name, char))


async def wait_until(pilot: Pilot[int], condition: Callable[[], bool], what: str, timeout: float = WAIT) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"gave up waiting for {what}")
        await pilot.pause(0.02)


async def settle(pilot: Pilot[int], app: TopApp, refreshes: int) -> None:
    """At least `refreshes` snapshots applied, then paused with no sample in flight: a still view."""
    await wait_until(pilot, lambda: app.refreshes >= refreshes, f"{refreshes} refreshes")
    await pilot.press("p")
    await wait_until(pilot, lambda: not app.poller.in_flight, "the last sample to land")
    await pilot.pause()


async def sample_exactly(pilot: Pilot[int], app: TopApp, refreshes: int) -> None:
    """Pause at once, then step with r until exactly `refreshes` snapshots are applied."""
    await pilot.press("p")
    await wait_until(pilot, lambda: app.refreshes >= 1 and not app.poller.in_flight, "the first sample")
    while app.refreshes < refreshes:
        want = app.refreshes + 1
        await pilot.press("r")
        await wait_until(pilot, lambda w=want: app.refreshes >= w and not app.poller.in_flight, f"refresh {want}")
    await pilot.pause()


def reference(gpus: int, processes: int, refreshes: int) -> BoxSnapshot:
    """What an identical box shows after the same number of samples."""
    box = sim(gpus, processes)
    snap = box.sample()
    for _ in range(refreshes - 1):
        snap = box.sample()
    return snap


class HangingBackend(SimulatedBackend):
    """sample() blocks on an Event while `hang` is set, counting calls and overlaps."""

    def __init__(self) -> None:
        super().__init__(gpus=2, processes=6, clock=lambda: NOW)
        self.hang = False
        self.release = threading.Event()
        self.calls = 0
        self.running = 0
        self.most_running = 0
        self._count = threading.Lock()

    def sample(self) -> BoxSnapshot:
        with self._count:
            self.calls += 1
            self.running += 1
            self.most_running = max(self.most_running, self.running)
        try:
            if self.hang:
                self.release.wait(WAIT)
            return super().sample()
        finally:
            with self._count:
                self.running -= 1


class FailingBackend(SimulatedBackend):
    """sample() raises on the calls numbered in `fail_on` (counting from 1)."""

    def __init__(self, fail_on: set[int]) -> None:
        super().__init__(gpus=2, processes=6, clock=lambda: NOW)
        self.fail_on = fail_on
        self.calls = 0

    def sample(self) -> BoxSnapshot:
        self.calls += 1
        if self.calls in self.fail_on:
            raise RuntimeError("NVML_ERROR_UNKNOWN from the driver")
        return super().sample()


class LostGpuBackend(SimulatedBackend):
    """GPU 1 has fallen off the bus: it stays in the snapshot, marked lost, with no figures."""

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        gpus = tuple(
            GpuSnapshot(g.index, g.uuid, g.name, g.pci_bus_id, lost=True, reasons={"gpu_busy": Reason.GPU_LOST.value})
            if g.index == 1
            else g
            for g in snap.gpus
        )
        return dataclasses.replace(snap, gpus=gpus, processes=tuple(p for p in snap.processes if p.gpu_index != 1))


class MigBackend(SimulatedBackend):
    """GPU 0 split into two MIG instances, 0/1 and 0/2, with its processes on the first."""

    def sample(self) -> BoxSnapshot:
        snap = super().sample()
        first = snap.gpus[0]
        migs = tuple(
            dataclasses.replace(first, uuid=f"MIG-{n}-{first.uuid[4:]}", name=f"{first.name} 3g.40gb", mig_instance=n)
            for n in (1, 2)
        )
        procs = tuple(dataclasses.replace(p, gpu_uuid=migs[0].uuid) if p.gpu_index == 0 else p for p in snap.processes)
        return dataclasses.replace(snap, gpus=migs + snap.gpus[1:], processes=procs)
