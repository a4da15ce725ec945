"""From two consecutive samples of a GPU, what to record for the interval between them.

Pure: no I/O, no clock. The interval (previous sample, this sample] is attributed at the later
sample's values: every rate gpubox reads is an average over a window that ends when the sample is
taken (GPM metrics between two GPM samples, PCIe counter deltas, NVML's utilisation period, the
probe's loader_wait window), so the later sample describes the interval just ended, and a mean
with the earlier one would smear the previous interval into this one. The same goes for the queue's
allocations: the job that holds the GPU at the later sample gets the interval, so an attempt's
start and end are each placed within one interval (5 s by default).

An interval longer than the max gap is not attributed at all: it is a `Gap`.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpubox.ledger.usage import GPU_BUSY, SM_ACTIVE, AttemptUsage, GpuUsage, UnqueuedUsage
from gpubox.telemetry.model import GpuSnapshot, ProcessSnapshot

AttemptKey = tuple[int, int]  # (job id, attempt number)


@dataclass(frozen=True)
class Allocation:
    """A running job attempt and the GPUs (UUIDs) the queue gave it."""

    job_id: int
    attempt: int
    kind: str
    gpu_uuids: tuple[str, ...]
    name: str | None = None
    user: str | None = None
    tags: Mapping[str, str] = field(default_factory=dict)

    @property
    def key(self) -> AttemptKey:
        return (self.job_id, self.attempt)


@dataclass(frozen=True)
class GpuMark:
    """What the ledger keeps of a GPU's latest sample: when, and its energy counter."""

    taken_at: float
    energy_mj: int | None = None


@dataclass(frozen=True)
class Gap:
    """Time a GPU was not sampled often enough to attribute: counted in calendar hours only."""

    uuid: str
    start: float
    end: float


@dataclass(frozen=True)
class AttemptInterval:
    """One attempt's part of one GPU's interval."""

    allocation: Allocation
    usage: AttemptUsage
    gpu_mem_bytes: int | None  # its processes' memory on this GPU at the later sample


@dataclass(frozen=True)
class IntervalUsage:
    """One GPU's attributed interval (start, end]."""

    uuid: str
    start: float
    end: float
    gpu: GpuUsage
    attempts: tuple[AttemptInterval, ...] = ()
    unqueued: tuple[tuple[str | None, UnqueuedUsage], ...] = ()  # by user (None: unknown)


def split_periods(start: float, end: float, period: int) -> list[tuple[int, float]]:
    """(period start, seconds of [start, end) inside it) for each period the interval touches."""
    pieces: list[tuple[int, float]] = []
    at = start
    while at < end:
        begin = math.floor(at / period) * period
        stop = min(end, begin + period)
        pieces.append((begin, stop - at))
        at = stop
    return pieces


def busy_fraction(gpu: GpuSnapshot) -> tuple[float | None, int]:
    """The busy share (0..1) and its source: sm_active where GPM gives it, else gpu_busy."""
    if gpu.lost:
        return None, 0
    sm_active, gpu_busy = reading(gpu.sm_active), reading(gpu.gpu_busy)
    if sm_active is not None:
        return _clamp(sm_active / 100.0), SM_ACTIVE
    if gpu_busy is not None:
        return _clamp(gpu_busy / 100.0), GPU_BUSY
    return None, 0


def reading(value: float | None) -> float | None:
    """A figure, or None where there is none: NaN or infinity (GPM's doubles can be) is no reading,
    and taken as one it would count as 0 % or 100 %, or stop every write of the ledger."""
    return value if value is not None and math.isfinite(value) else None


# Above any GPU's draw, a whole board included: a counter that gains more than this, or a power
# reading above it, was misread (all ones is how NVML says "not available"), not measured.
MAX_POWER_W = 5000.0


def energy_counter(gpu: GpuSnapshot) -> int | None:
    """The GPU's energy counter (mJ), or None where there is none to trust: one beyond 64-bit signed
    range is a misread, and could not be stored either."""
    counter = gpu.energy_mj
    return counter if counter is not None and 0 <= counter < 1 << 63 else None


def interval_energy(mark: GpuMark, gpu: GpuSnapshot, seconds: float) -> tuple[float | None, bool]:
    """Joules over the interval, and whether they are estimated from power × time."""
    counter = energy_counter(gpu)
    if mark.energy_mj is not None and counter is not None:
        if counter < mark.energy_mj:
            return None, False  # the counter restarted (driver reload): a gap for energy, never negative
        joules = (counter - mark.energy_mj) / 1000.0
        return (joules, False) if joules <= MAX_POWER_W * seconds else (None, False)
    power_w = reading(gpu.power_w)
    if power_w is not None and power_w <= MAX_POWER_W and not gpu.lost:
        return power_w * seconds, True
    return None, False


def account_interval(
    mark: GpuMark,
    gpu: GpuSnapshot,
    taken_at: float,
    processes: Sequence[ProcessSnapshot],
    holders: Sequence[Allocation],
    max_gap_s: float,
) -> IntervalUsage | Gap | None:
    """The usage of `gpu` between `mark` and this sample taken at `taken_at`.

    `processes` are the GPU processes on this GPU, `holders` the attempts the queue gave it to
    (several only for shared GPUs, which split the interval evenly). None when the sample is not
    newer than the mark: it was recorded already.
    """
    seconds = taken_at - mark.taken_at
    if seconds <= 0:
        return None
    if seconds > max_gap_s:
        return Gap(gpu.uuid, mark.taken_at, taken_at)
    busy, source = busy_fraction(gpu)
    energy_j, estimated = interval_energy(mark, gpu, seconds)
    owned, strangers = _owners(holders, processes)
    share = seconds / len(holders) if holders else 0.0
    attempts = tuple(
        _attempt_part(h, owned.get(h.key, []), share, seconds, busy, source, energy_j, estimated) for h in holders
    )
    # on a held GPU, only processes known to be outside the queue: one whose tag could not be read may be the job's
    outside = [p for p in strangers if "job_id" not in p.reasons] if holders else strangers
    unqueued = _unqueued(outside, seconds, busy)
    sm_occupancy, pcie_tx, pcie_rx = reading(gpu.sm_occupancy), reading(gpu.pcie_tx_Bps), reading(gpu.pcie_rx_Bps)
    occupancy = None if gpu.lost or sm_occupancy is None else _clamp(sm_occupancy / 100.0)
    pcie_known = not gpu.lost and pcie_tx is not None and pcie_rx is not None
    allocated = seconds if holders else 0.0
    usage = GpuUsage(
        observed_s=seconds,
        allocated_s=allocated,
        busy_s=seconds * busy if busy is not None else 0.0,
        busy_known_s=seconds if busy is not None else 0.0,
        idle_allocated_s=allocated * (1.0 - busy) if busy is not None else 0.0,
        starved_s=sum(a.usage.starved_s for a in attempts),
        loader_known_s=sum(a.usage.loader_known_s for a in attempts),
        occupancy_s=seconds * occupancy if occupancy is not None else 0.0,
        occupancy_known_s=seconds if occupancy is not None else 0.0,
        energy_j=energy_j or 0.0,
        energy_estimated_j=energy_j if energy_j is not None and estimated else 0.0,
        energy_known_s=seconds if energy_j is not None else 0.0,
        pcie_tx_bytes=(pcie_tx or 0.0) * seconds if pcie_known else 0.0,
        pcie_rx_bytes=(pcie_rx or 0.0) * seconds if pcie_known else 0.0,
        pcie_known_s=seconds if pcie_known else 0.0,
        unqueued_s=seconds if unqueued else 0.0,
        busy_source=source,
    )
    return IntervalUsage(gpu.uuid, mark.taken_at, taken_at, usage, attempts, unqueued)


def _attempt_part(
    holder: Allocation,
    processes: Sequence[ProcessSnapshot],
    share: float,
    seconds: float,
    busy: float | None,
    source: int,
    energy_j: float | None,
    estimated: bool,
) -> AttemptInterval:
    waits = [_clamp(w) for w in (reading(p.loader_wait) for p in processes) if w is not None]
    loader_wait = max(waits) if waits else None
    memory = [p.gpu_mem_bytes for p in processes if p.gpu_mem_bytes is not None]
    energy = energy_j * share / seconds if energy_j is not None else None
    usage = AttemptUsage(
        allocated_s=share,
        busy_s=share * busy if busy is not None else 0.0,
        busy_known_s=share if busy is not None else 0.0,
        idle_allocated_s=share * (1.0 - busy) if busy is not None else 0.0,
        starved_s=share * loader_wait if loader_wait is not None else 0.0,
        loader_known_s=share if loader_wait is not None else 0.0,
        energy_j=energy or 0.0,
        energy_estimated_j=energy if energy is not None and estimated else 0.0,
        energy_known_s=share if energy is not None else 0.0,
        busy_source=source if busy is not None else 0,
    )
    return AttemptInterval(holder, usage, sum(memory) if memory else None)


def _owners(
    holders: Sequence[Allocation], processes: Sequence[ProcessSnapshot]
) -> tuple[dict[AttemptKey, list[ProcessSnapshot]], list[ProcessSnapshot]]:
    """Each process's attempt: by its job id, or, where that could not be read, by its user when
    only one holder runs as that user. The rest (no job started them, or another job did) are
    strangers."""
    owned: dict[AttemptKey, list[ProcessSnapshot]] = {}
    strangers: list[ProcessSnapshot] = []
    for p in processes:
        if p.job_id is not None:
            matches = [h for h in holders if h.job_id == p.job_id]
        elif "job_id" in p.reasons and p.user is not None:
            # every job runs as the queue's owner, so a user match means something only when the tag is unreadable
            matches = [h for h in holders if h.user == p.user]
        else:
            matches = []
        if len(matches) == 1:
            owned.setdefault(matches[0].key, []).append(p)
        else:
            strangers.append(p)
    return owned, strangers


def _unqueued(
    processes: Sequence[ProcessSnapshot], seconds: float, busy: float | None
) -> tuple[tuple[str | None, UnqueuedUsage], ...]:
    """The processes outside the queue on a GPU, held or not: its time split evenly among their users."""
    users = sorted({p.user for p in processes}, key=lambda u: (u is None, u or ""))
    if not users:
        return ()
    part = seconds / len(users)
    usage = UnqueuedUsage(
        gpu_s=part,
        busy_s=part * busy if busy is not None else 0.0,
        busy_known_s=part if busy is not None else 0.0,
    )
    return tuple((user, usage) for user in users)


def _clamp(value: float) -> float:
    return min(1.0, max(0.0, value))
