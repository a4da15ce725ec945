"""Metric families from one snapshot, the queue's depth and the ledger's totals.

Every figure the source has becomes a sample; a figure it lacks (None, or NaN) becomes none.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from gpubox.metrics.catalog import GPU_LOST, GPU_METRICS, LEDGER_METRICS, PROCESS_METRICS, QUEUE_JOBS, MetricSpec
from gpubox.metrics.ledger_hook import GpuSeconds
from gpubox.telemetry.model import BoxSnapshot, GpuSnapshot, ProcessSnapshot

Rows = Sequence[tuple[Sequence[str], object]]  # (label values, the object the figures are read from)
Family = GaugeMetricFamily | CounterMetricFamily


def new_family(spec: MetricSpec) -> Family:
    if spec.counter:
        return CounterMetricFamily(spec.name, spec.help, labels=spec.labels)
    return GaugeMetricFamily(spec.name, spec.help, labels=spec.labels)


def _filled(spec: MetricSpec, rows: Rows) -> Family:
    family = new_family(spec)
    assert spec.field is not None
    for labels, source in rows:
        value = getattr(source, spec.field)
        # NaN or infinity is no reading either: Prometheus would store it, and every sum over it breaks.
        if value is not None and math.isfinite(value):
            # Rounded so that 95.4 % reads 0.954, not 0.9540000000000001; 12 places keep every real digit.
            family.add_metric(labels, float(value) if spec.scale == 1 else round(value / spec.scale, 12))
    return family


def gpu_labels(gpu: GpuSnapshot) -> tuple[str, str, str]:
    return (gpu.label, gpu.uuid, gpu.name)


def process_labels(proc: ProcessSnapshot, gpu_label: str) -> tuple[str, ...]:
    job = "" if proc.job_id is None else str(proc.job_id)
    kind = (proc.job_kind or "") if job else ""
    return (gpu_label, proc.gpu_uuid, str(proc.pid), proc.user or "", job, kind)


def gpu_families(snap: BoxSnapshot) -> list[Metric]:
    rows = [(gpu_labels(g), g) for g in snap.gpus]
    return [_filled(spec, rows) for spec in (*GPU_METRICS, GPU_LOST)]


def process_families(snap: BoxSnapshot) -> list[Metric]:
    # A MIG instance's processes name its UUID: label them with the instance ("0/3"), as its GPU rows are.
    label_of = {g.uuid: g.label for g in snap.gpus}
    rows = [(process_labels(p, label_of.get(p.gpu_uuid, str(p.gpu_index))), p) for p in snap.processes]
    return [_filled(spec, rows) for spec in PROCESS_METRICS]


def queue_families(depth: Mapping[tuple[str, str], int]) -> list[Metric]:
    family = new_family(QUEUE_JOBS)
    for (kind, state), count in sorted(depth.items()):
        family.add_metric([kind, state], float(count))
    return [family]


def ledger_families(totals: Mapping[str, GpuSeconds], snap: BoxSnapshot) -> list[Metric]:
    """The ledger knows GPUs by UUID; one that left the box since keeps the index and name the
    ledger last saw: with other labels its counters would become a new series."""
    by_uuid = {g.uuid: g for g in snap.gpus}
    rows: list[tuple[Sequence[str], object]] = []
    for uuid, seconds in sorted(totals.items()):
        gpu = by_uuid.get(uuid)
        rows.append(((gpu.label, uuid, gpu.name) if gpu else (seconds.label, uuid, seconds.name), seconds))
    return [_filled(spec, rows) for spec in LEDGER_METRICS]


def with_samples(families: Iterable[Metric]) -> list[Metric]:
    """Families that have a sample: one nobody could measure this scrape is left out whole."""
    return [f for f in families if f.samples]
