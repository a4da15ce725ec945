"""Scripted telemetry for the ledger tests: snapshots built by hand, a clock the test moves, and a
driver that feeds a recorder one sample every few seconds."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpubox.ledger.accounting import Allocation
from gpubox.ledger.recorder import Recorder
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, HostSnapshot, ProcessSnapshot

T0 = 1_700_002_800  # on an hour boundary (1_700_002_800 % 3600 == 0)
HOST = HostSnapshot(hostname="box")


def gpu(uuid: str = "GPU-0", index: int = 0, **figures: object) -> GpuSnapshot:
    return GpuSnapshot(index=index, uuid=uuid, name="Test GPU", pci_bus_id=None, **figures)  # type: ignore[arg-type]


def proc(
    pid: int,
    uuid: str = "GPU-0",
    user: str | None = "alice",
    job_id: int | None = None,
    loader_wait: float | None = None,
    mem: int | None = None,
    reasons: dict[str, str] | None = None,
) -> ProcessSnapshot:
    return ProcessSnapshot(
        pid=pid,
        gpu_index=0,
        gpu_uuid=uuid,
        kind="compute",
        user=user,
        job_id=job_id,
        loader_wait=loader_wait,
        loader_wait_source="probe" if loader_wait is not None else None,
        gpu_mem_bytes=mem,
        reasons=reasons or {},
    )


def snap(t: float, gpus: Sequence[GpuSnapshot], procs: Sequence[ProcessSnapshot] = ()) -> BoxSnapshot:
    return BoxSnapshot(taken_at=t, backend="simulated", host=HOST, gpus=tuple(gpus), processes=tuple(procs))


def job(
    job_id: int, *uuids: str, kind: str = "train", user: str | None = "alice", attempt: int = 1, **tags: str
) -> Allocation:
    return Allocation(job_id, attempt, kind, tuple(uuids), name=f"job{job_id}", user=user, tags=tags)


@dataclass
class Clock:
    now: float = 0.0

    def __call__(self) -> float:
        return self.now


Scene = Callable[[float], tuple[BoxSnapshot, Iterable[Allocation]]]


def drive(recorder: Recorder, clock: Clock, scene: Scene, start: float, end: float, step: float = 5.0) -> None:
    """Record one sample every `step` seconds for t in [start, end], the clock following the samples."""
    t = start
    while t <= end:
        clock.now = t
        snapshot, allocations = scene(t)
        recorder.record(snapshot, allocations)
        t += step


def open_store(tmp_path: Path) -> LedgerStore:
    return LedgerStore(tmp_path / "state" / "ledger.db")
