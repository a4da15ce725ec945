"""What the metrics tests share: the CLI in a subprocess, the exposition parsed with
prometheus_client's own parser, and backends that remember or script their snapshots."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence

from prometheus_client.parser import text_string_to_metric_families

from gpubox.telemetry.backend import TelemetryBackend
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, HostSnapshot, ProcessSnapshot

SampleKey = tuple[str, frozenset[tuple[str, str]]]


def metrics_argv(*args: str) -> list[str]:
    """gpubox's own entry point, as `gpubox metrics ARGS`."""
    return [sys.executable, "-m", "gpubox", "metrics", *args]


def run_metrics(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """`gpubox metrics ARGS` in a subprocess, as a script or cron job runs it."""
    return subprocess.run(
        metrics_argv(*args),
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def key(name: str, labels: Mapping[str, str]) -> SampleKey:
    return (name, frozenset(labels.items()))


def samples(text: str) -> dict[SampleKey, float]:
    """Every sample of an exposition, parsed by prometheus_client; a repeated series fails."""
    found: dict[SampleKey, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            k = key(s.name, s.labels)
            assert k not in found, f"{s.name}{s.labels} is exported twice"
            found[k] = s.value
    return found


def family_types(text: str) -> dict[str, str]:
    """Family name (a counter's without `_total`) to its type."""
    return {f.name: f.type for f in text_string_to_metric_families(text)}


def names(text: str) -> set[str]:
    return {name for name, _ in samples(text)}


def of(found: Mapping[SampleKey, float], name: str) -> dict[frozenset[tuple[str, str]], float]:
    """The samples of one metric, by their labels."""
    return {labels: value for (n, labels), value in found.items() if n == name}


class RecordingBackend:
    """Another backend, remembering every snapshot it handed out."""

    def __init__(self, inner: TelemetryBackend) -> None:
        self.name = inner.name
        self._inner = inner
        self.snapshots: list[BoxSnapshot] = []
        self.closed = False

    def sample(self) -> BoxSnapshot:
        self.snapshots.append(self._inner.sample())
        return self.snapshots[-1]

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        self._inner.send_signal(pid, sig, start_time)

    def close(self) -> None:
        self.closed = True
        self._inner.close()


class ScriptedBackend:
    """Hands out the snapshots it was given, in turn, the last one repeating."""

    name = "scripted"

    def __init__(self, snapshots: Sequence[BoxSnapshot]) -> None:
        self._snapshots = list(snapshots)
        self.calls = 0

    def sample(self) -> BoxSnapshot:
        self.calls += 1
        return self._snapshots[min(self.calls, len(self._snapshots)) - 1]

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        raise ProcessLookupError(pid)

    def close(self) -> None:
        pass


def box(
    gpus: Sequence[GpuSnapshot], processes: Sequence[ProcessSnapshot] = (), errors: Sequence[str] = ()
) -> BoxSnapshot:
    return BoxSnapshot(1000.0, "scripted", HostSnapshot("test-box"), tuple(gpus), tuple(processes), tuple(errors))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_for_port(host: str, port: int, proc: subprocess.Popen[str], within_s: float = 30.0) -> None:
    """Until something accepts connections there; fails early when the process exits."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited {proc.returncode}: {proc.stderr.read() if proc.stderr else ''}")
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise AssertionError(f"nothing listened on {host}:{port} within {within_s} s")
