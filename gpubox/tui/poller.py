"""The sampling loop of the live view: one sample at a time, off the UI thread.

A sample runs in a thread worker. When it lands, the app applies it on the UI thread and the
poller schedules the next one with a one-shot timer, so two samples never overlap and a sampler
that hangs holds back only itself: the view stays live and reports how stale its figures are.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from textual.app import App
from textual.message import Message
from textual.timer import Timer

from gpubox.telemetry.backend import TelemetryBackend
from gpubox.telemetry.model import BoxSnapshot

MIN_INTERVAL = 0.25
MAX_INTERVAL = 10.0
INTERVAL_STEPS = (0.25, 0.5, 1.0, 2.0, 5.0, 10.0)
STALE_AFTER = 2.0  # seconds a sample may take before the view calls its figures stale
SIGNAL_WAIT = 2.0  # seconds a signal waits for a running sample before going ahead anyway


class SampleLanded(Message):
    """A sample came back from the worker thread: a snapshot, or the error it raised."""

    def __init__(self, snapshot: BoxSnapshot | None, error: Exception | None) -> None:
        super().__init__()
        self.snapshot = snapshot
        self.error = error


class SignalSent(Message):
    """A signal came back from the worker thread: None when sent, or the error it raised."""

    def __init__(self, pid: int, sig: int, error: Exception | None) -> None:
        super().__init__()
        self.pid = pid
        self.sig = sig
        self.error = error


def faster(interval: float) -> float:
    return max((s for s in INTERVAL_STEPS if s < interval), default=interval)


def slower(interval: float) -> float:
    return min((s for s in INTERVAL_STEPS if s > interval), default=interval)


class Poller:
    """Owns when the backend is sampled. The app passes each SampleLanded back to `landed`."""

    def __init__(
        self,
        app: App[Any],
        backend: TelemetryBackend,
        interval: float,
        stale_after: float = STALE_AFTER,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._app = app
        self._backend = backend
        self._clock = clock
        self.interval = interval
        self.stale_after = stale_after
        self.paused = False
        self.landed_count = 0
        self._timer: Timer | None = None
        self._in_flight_since: float | None = None
        self._last_landed: float | None = None
        # Held while the backend samples, so a signal is not sent to it in the middle of one.
        self._backend_lock = threading.Lock()

    @property
    def in_flight(self) -> bool:
        return self._in_flight_since is not None

    def poll_now(self) -> bool:
        """Start a sample unless one is running; False when one is."""
        if self.in_flight:
            return False
        self._cancel_timer()
        self._in_flight_since = self._clock()
        self._app.run_worker(self._sample, name="sample", group="sample", thread=True, exit_on_error=False)
        return True

    def _sample(self) -> None:  # on the worker thread
        try:
            with self._backend_lock:
                snap = self._backend.sample()
        except Exception as exc:  # the backend's error is shown, and polling goes on
            self._app.post_message(SampleLanded(None, exc))
        else:
            self._app.post_message(SampleLanded(snap, None))

    def landed(self) -> None:
        """Called on the UI thread once the app has taken a SampleLanded: schedule the next."""
        self._in_flight_since = None
        self._last_landed = self._clock()
        self.landed_count += 1
        if not self.paused:
            self._schedule()

    def _schedule(self) -> None:
        self._cancel_timer()
        self._timer = self._app.set_timer(self.interval, self._on_timer, name="next sample")

    def _on_timer(self) -> None:
        self._timer = None
        if not self.paused:
            self.poll_now()

    def _cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.stop()
            self._timer = None

    def pause(self) -> None:
        self.paused = True
        self._cancel_timer()

    def resume(self) -> None:
        self.paused = False
        self.poll_now()

    def set_interval(self, interval: float) -> None:
        self.interval = interval
        if self._timer is not None:  # a sample waits: wait the new interval instead
            self._schedule()

    def stale_for(self) -> float | None:
        """Seconds since the figures on screen were taken, once a sample runs too long; else None."""
        if self._in_flight_since is None:
            return None
        now = self._clock()
        if now - self._in_flight_since < self.stale_after:
            return None
        return now - (self._last_landed if self._last_landed is not None else self._in_flight_since)

    def close_backend(self, timeout: float = SIGNAL_WAIT) -> bool:
        """Close the backend once no sample is using it. A sample that hangs keeps it open:
        closing NVML under a running call could free what the call still reads, and the
        process is about to exit anyway. True when closed."""
        if not self._backend_lock.acquire(timeout=timeout):
            return False
        try:
            self._backend.close()
        finally:
            self._backend_lock.release()
        return True

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        """Signal a process from a worker thread; the app gets a SignalSent."""

        def send() -> None:  # on the worker thread
            # wait for a running sample to finish, but not for one that hangs
            locked = self._backend_lock.acquire(timeout=SIGNAL_WAIT)
            try:
                self._backend.send_signal(pid, sig, start_time)
            except Exception as exc:  # PermissionError, ProcessLookupError: a message, not a crash
                self._app.post_message(SignalSent(pid, sig, exc))
            else:
                self._app.post_message(SignalSent(pid, sig, None))
            finally:
                if locked:
                    self._backend_lock.release()

        self._app.run_worker(send, name="signal", group="signal", thread=True, exit_on_error=False)
