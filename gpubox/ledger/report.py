"""Where the GPU hours went over [since, until), grouped by gpu, job, kind, tag or user.

Definitions (GPU-hours: one GPU for one hour; a MIG instance counts as a GPU of its own, and the
total takes a MIG card's calendar, energy and PCIe from the card and its work from its instances):
- calendar = observed + gap: the wall-clock time of each GPU in the window, whether sampled or
  not (by gpu only). Gaps include the time since recording stopped, when it has.
- allocated: held by a queue job. busy: by `sm_active` where GPM gives it, else `gpu_busy`
  (`busy_source` says which, or "mixed").
- idle_allocated (idle-while-allocated) = allocated × (1 − busy share), interval by interval, so
  it is never negative and time whose busy share is unknown counts as neither.
- starved = allocated × the job's loader_wait, where loader_wait is known; it overlaps idle, since
  a GPU that waits for data is mostly idle. null where loader_wait was never known.
- energy: from the GPUs' energy counters; `energy_estimated_kwh` is the part estimated from
  power × time on GPUs without one.

Cost: `price_per_gpu_hour` is applied to calendar GPU-hours for `--by gpu` (a GPU costs by the
hour whether used or not; MIG instances get none, their card carries it) and to allocated
GPU-hours for job, kind, tag and user (what the work held); `price_per_kwh`, when given, to energy.

By gpu the window is exact: a minute it cuts counts for its part inside (outside gaps). By job,
kind, tag and user use is kept per hour, and every hour that overlaps the window counts whole.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from gpubox.ledger import queries
from gpubox.ledger.findings import (
    AttemptFinding,
    UnallocatedHour,
    WaitHistory,
    free_hours,
    idle_attempts,
    starved_attempts,
)
from gpubox.ledger.queries import AttemptTotals, GpuInfo
from gpubox.ledger.store import LedgerStore
from gpubox.ledger.usage import AttemptUsage, GpuUsage, UnqueuedUsage, busy_source_name

GROUPINGS = ("gpu", "job", "kind", "tag", "user")
_H = 3600.0
_KWH = 3.6e6


@dataclass(frozen=True)
class Prices:
    per_gpu_hour: float | None = None
    per_kwh: float | None = None


@dataclass(frozen=True)
class UsageRow:
    """One group's figures; every field is present, null where it does not apply or is unknown."""

    group: str  # the GPU label, job id, kind, "key=value" tag, user, or "total"
    gpu_uuid: str | None
    gpu_index: int | None
    mig_instance: int | None
    gpu_name: str | None
    job_id: int | None
    job_name: str | None
    attempts: int | None
    kind: str | None
    user: str | None
    tag: str | None
    calendar_gpu_hours: float | None
    observed_gpu_hours: float | None
    gap_gpu_hours: float | None
    allocated_gpu_hours: float
    busy_gpu_hours: float | None
    busy_source: str | None
    idle_allocated_gpu_hours: float | None
    starved_gpu_hours: float | None
    loader_wait_known_gpu_hours: float
    unqueued_gpu_hours: float | None
    mean_sm_occupancy: float | None  # %
    energy_kwh: float | None
    energy_estimated_kwh: float | None
    pcie_tx_bytes: int | None
    pcie_rx_bytes: int | None
    peak_gpu_mem_bytes: int | None
    gpu_hour_cost: float | None
    energy_cost: float | None
    cost: float | None


@dataclass(frozen=True)
class LedgerReport:
    since: float
    until: float
    by: str
    tag_key: str | None
    price_per_gpu_hour: float | None
    price_per_kwh: float | None
    recorded_from: float | None  # the start of the first hour the ledger keeps; null when it keeps none
    recorded_until: float | None  # the last sample recorded; null when nothing was
    recording_stale: bool  # recording has stopped (no sample within its max gap and a flush)
    rows: tuple[UsageRow, ...]
    total: UsageRow
    idle_attempts: tuple[AttemptFinding, ...]
    starved_attempts: tuple[AttemptFinding, ...]
    unallocated_hours: tuple[UnallocatedHour, ...]


def build_report(
    store: LedgerStore,
    since: float,
    until: float,
    by: str = "gpu",
    *,
    prices: Prices = Prices(),
    tag_key: str | None = None,
    now: float | None = None,
    limit: int = 5,
    waits: WaitHistory | None = None,
) -> LedgerReport:
    """The report; `tag_key` groups `--by tag` by that key's values (untagged attempts in one row)
    instead of by every key=value pair (where an attempt with two tags counts in both rows)."""
    if by not in GROUPINGS:
        raise ValueError(f"--by must be one of {', '.join(GROUPINGS)}, not {by!r}")
    if not until > since:
        raise ValueError("the report's --until must be later than its --since")
    for price in (prices.per_gpu_hour, prices.per_kwh):
        if price is not None and not price >= 0:
            raise ValueError("prices must be zero or more")
    now = time.time() if now is None else now
    with store.reading():
        meta = store.meta()
        gpus = queries.gpus(store)
        attempts = queries.attempt_usage(store, since, until)
        if by == "gpu":
            rows, total = _by_gpu(store, since, until, now, gpus, prices)
        else:
            unqueued = queries.unqueued_by_user(store, since, until) if by == "user" else {}
            rows, total = _by_attempts(attempts, by, tag_key, unqueued, prices)
        unallocated = free_hours(store, since, until, gpus, limit, waits)
        first = queries.first_hour(store)
    last = meta.get("last_sample_at")
    return LedgerReport(
        since=since,
        until=until,
        by=by,
        tag_key=tag_key,
        price_per_gpu_hour=prices.per_gpu_hour,
        price_per_kwh=prices.per_kwh,
        recorded_from=first,
        recorded_until=last,
        recording_stale=last is not None and now - last > meta.get("stale_after_s", 0.0),
        rows=rows,
        total=total,
        idle_attempts=idle_attempts(attempts, limit),
        starved_attempts=starved_attempts(attempts, limit),
        unallocated_hours=unallocated,
    )


def _by_gpu(
    store: LedgerStore, since: float, until: float, now: float, gpus: Mapping[int, GpuInfo], prices: Prices
) -> tuple[tuple[UsageRow, ...], UsageRow]:
    spans = queries.gap_intervals(store, since, until, now)
    usage = queries.gpu_usage(store, since, until, spans)
    gaps = queries.gap_seconds(spans)
    rows: list[UsageRow] = []
    cards = GpuUsage()  # whole GPUs and MIG cards: the calendar, energy and PCIe
    workers = GpuUsage()  # whole GPUs and MIG instances: where jobs run
    cards_gap = 0.0
    for gpu_id in sorted(set(usage) | set(gaps), key=lambda g: _gpu_order(gpus.get(g))):
        info = gpus.get(gpu_id)
        u, gap = usage.get(gpu_id, GpuUsage()), gaps.get(gpu_id, 0.0)
        instance = info is not None and info.mig_instance is not None
        if not instance:
            cards, cards_gap = cards.plus(u), cards_gap + gap
        if info is None or not info.mig_parent:
            workers = workers.plus(u)
        label = info.label if info else f"#{gpu_id}"
        rows.append(_gpu_row(label, info, u, gap, prices, billed=not instance))
    total = _gpu_row("total", None, _total_of(cards, workers), cards_gap, prices, billed=True)
    return tuple(rows), total


_CARD_FIELDS = (  # a MIG card's own figures; its instances' copies would count them twice
    "observed_s",
    "energy_j",
    "energy_estimated_j",
    "energy_known_s",
    "pcie_tx_bytes",
    "pcie_rx_bytes",
    "pcie_known_s",
)


def _total_of(cards: GpuUsage, workers: GpuUsage) -> GpuUsage:
    """The box's usage: time, energy and PCIe of the cards, and the work (busy, idle, occupancy,
    allocated, starved, unqueued) of whole GPUs and MIG instances, never of a MIG card too."""
    return replace(workers, **{name: getattr(cards, name) for name in _CARD_FIELDS})


def _gpu_row(label: str, info: GpuInfo | None, u: GpuUsage, gap: float, prices: Prices, billed: bool) -> UsageRow:
    calendar = (u.observed_s + gap) / _H
    energy = u.energy_j / _KWH if u.energy_known_s else None
    hour_cost = calendar * prices.per_gpu_hour if prices.per_gpu_hour is not None and billed else None
    return UsageRow(
        group=label,
        gpu_uuid=info.uuid if info else None,
        gpu_index=info.index if info else None,
        mig_instance=info.mig_instance if info else None,
        gpu_name=info.name if info else None,
        job_id=None,
        job_name=None,
        attempts=None,
        kind=None,
        user=None,
        tag=None,
        calendar_gpu_hours=calendar,
        observed_gpu_hours=u.observed_s / _H,
        gap_gpu_hours=gap / _H,
        allocated_gpu_hours=u.allocated_s / _H,
        busy_gpu_hours=u.busy_s / _H if u.busy_known_s else None,
        busy_source=busy_source_name(u.busy_source),
        idle_allocated_gpu_hours=u.idle_allocated_s / _H if u.busy_known_s else None,
        starved_gpu_hours=u.starved_s / _H if u.loader_known_s else None,
        loader_wait_known_gpu_hours=u.loader_known_s / _H,
        unqueued_gpu_hours=u.unqueued_s / _H,
        mean_sm_occupancy=100.0 * u.occupancy_s / u.occupancy_known_s if u.occupancy_known_s else None,
        energy_kwh=energy,
        energy_estimated_kwh=u.energy_estimated_j / _KWH if u.energy_known_s else None,
        pcie_tx_bytes=round(u.pcie_tx_bytes) if u.pcie_known_s else None,
        pcie_rx_bytes=round(u.pcie_rx_bytes) if u.pcie_known_s else None,
        peak_gpu_mem_bytes=None,
        **_costs(hour_cost, energy, prices),
    )


def _costs(hour_cost: float | None, energy_kwh: float | None, prices: Prices) -> dict[str, float | None]:
    """The cost parts and their sum; the sum is null when no price is set or a priced part is unknown."""
    energy_cost = energy_kwh * prices.per_kwh if energy_kwh is not None and prices.per_kwh is not None else None
    parts: list[float | None] = []
    if prices.per_gpu_hour is not None:
        parts.append(hour_cost)
    if prices.per_kwh is not None:
        parts.append(energy_cost)
    known = [p for p in parts if p is not None]
    cost = sum(known) if parts and len(known) == len(parts) else None
    return {"gpu_hour_cost": hour_cost, "energy_cost": energy_cost, "cost": cost}


def _by_attempts(
    attempts: list[AttemptTotals],
    by: str,
    tag_key: str | None,
    unqueued: Mapping[str | None, UnqueuedUsage],
    prices: Prices,
) -> tuple[tuple[UsageRow, ...], UsageRow]:
    groups: dict[str, list[AttemptTotals]] = {}
    identity: dict[str, dict[str, object]] = {}
    for a in sorted(attempts, key=lambda a: (a.job_id, a.attempt)):
        for key, ident in _keys(a, by, tag_key):
            groups.setdefault(key, []).append(a)
            identity[key] = ident  # the latest attempt names a job
    if by == "user":
        for user in unqueued:
            key = user if user is not None else "(unknown)"
            groups.setdefault(key, [])
            identity.setdefault(key, {"user": user})
    rows = [
        _attempt_row(key, identity[key], members, _unqueued_for(by, identity[key], unqueued), prices)
        for key, members in groups.items()
    ]
    if by == "job":
        rows.sort(key=lambda r: r.job_id or 0)
    else:
        rows.sort(key=lambda r: (-r.allocated_gpu_hours, r.group))
    total_unqueued = _sum_unqueued(unqueued.values()) if by == "user" else None
    total = _attempt_row("total", {}, attempts, total_unqueued, prices)
    return tuple(rows), total


def _keys(a: AttemptTotals, by: str, tag_key: str | None) -> list[tuple[str, dict[str, object]]]:
    if by == "job":
        return [(str(a.job_id), {"job_id": a.job_id, "job_name": a.name, "kind": a.kind, "user": a.user})]
    if by == "kind":
        return [(a.kind, {"kind": a.kind})]
    if by == "user":
        return [(a.user if a.user is not None else "(unknown)", {"user": a.user})]
    if tag_key is not None:
        value = a.tags.get(tag_key)
        if value is None:  # no "=" in its name: no tag's value can take that row (team=(none) could)
            return [(f"(no {tag_key} tag)", {"tag": None})]
        return [(f"{tag_key}={value}", {"tag": f"{tag_key}={value}"})]
    # an attempt with no tags has a row of its own, so the rows account for every attempt
    return [(f"{k}={v}", {"tag": f"{k}={v}"}) for k, v in sorted(a.tags.items())] or [("(untagged)", {"tag": None})]


def _unqueued_for(
    by: str, ident: Mapping[str, object], unqueued: Mapping[str | None, UnqueuedUsage]
) -> UnqueuedUsage | None:
    if by != "user":
        return None
    user = ident.get("user")
    return unqueued.get(user if isinstance(user, str) else None, UnqueuedUsage())


def _sum_unqueued(items: Iterable[UnqueuedUsage]) -> UnqueuedUsage:
    total = UnqueuedUsage()
    for u in items:
        total = total.plus(u)
    return total


def _attempt_row(
    key: str,
    ident: Mapping[str, object],
    members: Iterable[AttemptTotals],
    unqueued: UnqueuedUsage | None,
    prices: Prices,
) -> UsageRow:
    members = list(members)
    u = AttemptUsage()
    for a in members:
        u = u.plus(a.usage)
    peaks = [a.peak_gpu_mem_bytes for a in members if a.peak_gpu_mem_bytes is not None]
    allocated = u.allocated_s / _H
    energy = u.energy_j / _KWH if u.energy_known_s else None
    hour_cost = allocated * prices.per_gpu_hour if prices.per_gpu_hour is not None else None
    job_id = ident.get("job_id")
    return UsageRow(
        group=key,
        gpu_uuid=None,
        gpu_index=None,
        mig_instance=None,
        gpu_name=None,
        job_id=job_id if isinstance(job_id, int) else None,
        job_name=_text(ident.get("job_name")),
        attempts=len(members),
        kind=_text(ident.get("kind")),
        user=_text(ident.get("user")),
        tag=_text(ident.get("tag")),
        calendar_gpu_hours=None,
        observed_gpu_hours=None,
        gap_gpu_hours=None,
        allocated_gpu_hours=allocated,
        busy_gpu_hours=u.busy_s / _H if u.busy_known_s else None,
        busy_source=busy_source_name(u.busy_source),
        idle_allocated_gpu_hours=u.idle_allocated_s / _H if u.busy_known_s else None,
        starved_gpu_hours=u.starved_s / _H if u.loader_known_s else None,
        loader_wait_known_gpu_hours=u.loader_known_s / _H,
        unqueued_gpu_hours=unqueued.gpu_s / _H if unqueued is not None else None,
        mean_sm_occupancy=None,
        energy_kwh=energy,
        energy_estimated_kwh=u.energy_estimated_j / _KWH if u.energy_known_s else None,
        pcie_tx_bytes=None,
        pcie_rx_bytes=None,
        peak_gpu_mem_bytes=max(peaks) if peaks else None,
        **_costs(hour_cost, energy, prices),
    )


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _gpu_order(info: GpuInfo | None) -> tuple[int, int, str]:
    if info is None:
        return (1 << 30, 0, "")
    return (
        info.index if info.index is not None else 1 << 29,
        -1 if info.mig_instance is None else info.mig_instance,
        info.uuid,
    )
