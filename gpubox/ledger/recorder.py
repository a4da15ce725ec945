"""The recorder the queue daemon holds: one call per telemetry sample, with the queue's allocations.

It keeps each GPU's previous sample (its mark) in memory and the increments since the last write
in a rollup, and writes them once a minute (`flush_every_s`), not every sample: every commit writes
a few whole pages, so for 8 GPUs a write every 5 s puts about 420 MiB a day through the database
files and one a minute 44 MiB (benchmarks/ledger_year.py --record-day), for the same rows. A crash
between writes loses at most that minute, which the next recorder records as a gap: the marks in
the database move only with the increments, so nothing is counted twice.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace

from gpubox.ledger.accounting import Allocation, Gap, GpuMark, account_interval, energy_counter
from gpubox.ledger.rollup import GpuSeen, Rollup
from gpubox.ledger.store import LedgerStore
from gpubox.telemetry.model import BoxSnapshot, ProcessSnapshot

_NUMBER = re.compile(r"\d+(\.\d+)?")
_COUNTED = re.compile(r"\bN (GPU|job)s?\b")


def wait_kind(reason: str) -> str:
    """A waiting job's reason with its numbers as N ("needs N GPU(s) with N GiB free: GPU N held by
    job N (train)"): one row per kind of wait and hour, however many jobs waited."""
    kind = _COUNTED.sub(r"N \1(s)", _NUMBER.sub("N", reason.strip()))  # "1 GPU" and "2 GPUs" are one kind
    return kind[:200] or "waits"


def _holders(snapshot: BoxSnapshot, allocations: Iterable[Allocation]) -> dict[str, list[Allocation]]:
    """Each GPU's holders by UUID. The queue hands out whole cards while the telemetry lists a MIG
    card's processes under its instances, so an instance is held by whoever holds its card (by
    index), as well as by any allocation naming the instance itself."""
    holders: dict[str, list[Allocation]] = {}
    for allocation in allocations:
        for uuid in dict.fromkeys(allocation.gpu_uuids):
            holders.setdefault(uuid, []).append(allocation)
    cards = {g.index: g.uuid for g in snapshot.gpus if g.mig_instance is None}
    for g in snapshot.gpus:
        card = cards.get(g.index) if g.mig_instance is not None else None
        if card is None or card not in holders:
            continue
        own = holders.get(g.uuid, [])
        keys = {a.key for a in own}
        holders[g.uuid] = own + [a for a in holders[card] if a.key not in keys]
    return holders


DEFAULT_INTERVAL_S = 5.0
DEFAULT_FLUSH_EVERY_S = 60.0


class Recorder:
    """Turns the daemon's samples into ledger rows. One at a time per database: two would both count the same time."""

    def __init__(
        self,
        store: LedgerStore,
        interval_s: float = DEFAULT_INTERVAL_S,
        max_gap_s: float | None = None,
        clock: Callable[[], float] = time.monotonic,
        flush_every_s: float = DEFAULT_FLUSH_EVERY_S,
    ) -> None:
        """`max_gap_s` (default 3 × `interval_s`): a longer interval between two samples of a GPU is
        a gap. `clock` paces the writes only; intervals are timed by the samples' `taken_at`.
        `flush_every_s=0` writes on every call."""
        if interval_s <= 0:
            raise ValueError("the ledger interval must be positive")
        self.store = store
        self.interval_s = interval_s
        self.max_gap_s = 3 * interval_s if max_gap_s is None else max_gap_s
        if self.max_gap_s < interval_s:
            raise ValueError("the ledger's max gap must be at least its interval")
        self.flush_every_s = flush_every_s
        self._clock = clock
        self._marks: dict[str, GpuMark] = store.load_marks()
        self._rollup = Rollup()
        self._flushed_at = clock()
        self._waits_at: float | None = None
        # The latest sample recorded, here or by an earlier recorder: waits up to it are counted.
        self._waits_until = max((m.taken_at for m in self._marks.values()), default=None)

    def record(
        self, snapshot: BoxSnapshot, allocations: Iterable[Allocation], waiting: Mapping[int, str] | None = None
    ) -> None:
        """Attribute the time since each GPU's previous sample; a sample not newer than it (recorded
        before a restart, or after the clock was set back) is skipped. Raises LedgerError when a
        write fails; what it held is kept and goes with the next write."""
        holders = _holders(snapshot, allocations)
        processes: dict[str, list[ProcessSnapshot]] = {}
        for p in snapshot.processes:
            processes.setdefault(p.gpu_uuid, []).append(p)
        mig_indices = {g.index for g in snapshot.gpus if g.mig_instance is not None}
        taken_at = snapshot.taken_at
        free: list[str] = []  # neither held by a job nor used outside the queue (MIG: the instances)
        for gpu in snapshot.gpus:
            mark = self._marks.get(gpu.uuid)
            parent = gpu.mig_instance is None and gpu.index in mig_indices
            if not parent and not holders.get(gpu.uuid) and not processes.get(gpu.uuid):
                free.append(gpu.uuid)
            if mark is not None:
                if taken_at <= mark.taken_at:
                    continue
                found = account_interval(
                    mark, gpu, taken_at, processes.get(gpu.uuid, []), holders.get(gpu.uuid, []), self.max_gap_s
                )
                if isinstance(found, Gap):
                    self._rollup.add_gap(found)
                elif found is not None:
                    # a MIG card's jobs are charged on its instances, where their work runs, not twice
                    self._rollup.add(replace(found, attempts=()) if parent else found)
            new_mark = GpuMark(taken_at, energy_counter(gpu))
            self._marks[gpu.uuid] = new_mark
            self._rollup.see_gpu(GpuSeen(gpu.uuid, gpu.index, gpu.name, gpu.mig_instance, parent, new_mark))
        if waiting is not None:
            self._record_waits(taken_at, waiting, free)
        if self._clock() - self._flushed_at >= self.flush_every_s:
            self.flush()

    def _record_waits(self, taken_at: float, waiting: Mapping[int, str], free: Iterable[str]) -> None:
        """The queued jobs and why they wait, and the GPUs free meanwhile, as this sample found them,
        for the time since the previous one (none across a gap). A sample not newer than the latest
        one is skipped, as for the GPUs: after the clock was set back, that time was counted already."""
        if self._waits_until is not None and taken_at <= self._waits_until:
            return
        self._waits_until = taken_at
        before, self._waits_at = self._waits_at, taken_at
        if before is None or not before < taken_at <= before + self.max_gap_s:
            return
        reasons: dict[str, int] = {}
        for reason in waiting.values():
            kind = wait_kind(reason)
            reasons[kind] = reasons.get(kind, 0) + 1
        self._rollup.add_waits(before, taken_at, reasons, free)

    def flush(self) -> None:
        """Write what was gathered since the last write, in one transaction. On failure (LedgerError)
        the increments stay here and go with the next write."""
        batch = self._rollup.batch(
            {"max_gap_s": self.max_gap_s, "interval_s": self.interval_s, "stale_after_s": self.stale_after_s}
        )
        self._flushed_at = self._clock()
        if batch.empty:
            return
        self.store.write(batch)
        self._rollup.clear()

    @property
    def stale_after_s(self) -> float:
        """How old the last recorded sample may be while recording goes on (writes wait up to a flush)."""
        return self.max_gap_s + self.flush_every_s

    def close(self) -> None:
        """Write what is pending; the store stays open for whoever opened it."""
        self.flush()
