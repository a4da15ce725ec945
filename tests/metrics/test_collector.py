"""The collector against the simulated box and scripted snapshots: every sample is the snapshot's
figure in the metric's unit, and a figure the snapshot lacks has no sample."""

from __future__ import annotations

import pytest
from prometheus_client import generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as openmetrics_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families as openmetrics_families

from gpubox.ledger.store import LedgerError
from gpubox.metrics.catalog import ALL_METRICS
from gpubox.metrics.exposition import BoxCollector, dump, exposition_text, registry_of
from gpubox.metrics.ledger_hook import GpuSeconds
from gpubox.telemetry.model import GpuSnapshot, ProcessSnapshot
from gpubox.telemetry.simulated import SimulatedBackend
from tests.metrics.figures import (
    GPU_FIGURES,
    GPU_UUID,
    MIG_UUID,
    PROCESS_FIGURES,
    assert_gpus_match,
    assert_processes_match,
    gpu_labels,
    process_labels,
)
from tests.metrics.support import RecordingBackend, ScriptedBackend, box, family_types, key, names, of, samples


def test_the_table_above_covers_every_gpu_and_process_metric() -> None:
    level = {s.name for s in ALL_METRICS if s.name.startswith(("gpubox_gpu_", "gpubox_process_"))}
    ledger = {"gpubox_gpu_allocated_seconds_total", "gpubox_gpu_busy_seconds_total", "gpubox_gpu_starved_seconds_total"}
    assert level - ledger == set(GPU_FIGURES) | set(PROCESS_FIGURES)


def test_simulated_box_every_figure_as_its_snapshot_has_it() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=4, processes=12))
    collector = BoxCollector(backend)
    for _ in range(3):  # the first scrape warms the rates up; each later one is its own snapshot
        found = samples(exposition_text(collector))
        snap = backend.snapshots[-1]
        assert_gpus_match(found, snap.gpus)
        assert_processes_match(found, snap.processes, {g.uuid: g.label for g in snap.gpus})
    assert len(backend.snapshots) == 3
    assert len(of(found, "gpubox_gpu_busy_ratio")) == 4
    assert len(of(found, "gpubox_process_gpu_memory_bytes")) == 12


def test_first_scrape_leaves_rates_out_and_the_next_has_them() -> None:
    collector = BoxCollector(SimulatedBackend(gpus=2, processes=0))
    first = names(exposition_text(collector))
    assert "gpubox_gpu_busy_ratio" in first and "gpubox_gpu_memory_used_bytes" in first
    assert not first & {"gpubox_gpu_pcie_rx_bytes_per_second", "gpubox_gpu_sm_active_ratio"}
    second = names(exposition_text(collector))
    assert {"gpubox_gpu_pcie_rx_bytes_per_second", "gpubox_gpu_sm_active_ratio"} <= second


def test_dump_takes_two_samples_a_window_apart() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=2, processes=2))
    waited: list[float] = []
    text = dump(BoxCollector(backend), 0.25, sleep=waited.append)
    assert waited == [0.25] and len(backend.snapshots) == 2
    assert "gpubox_gpu_pcie_rx_bytes_per_second" in names(text)


def test_a_gpu_without_gpm_has_no_sm_occupancy_sample() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=4, processes=0))  # GPU 3 is an RTX 4090: no GPM
    collector = BoxCollector(backend)
    collector.warm_up()
    found = samples(exposition_text(collector))
    gpus = backend.snapshots[-1].gpus
    assert gpus[3].sm_occupancy is None and gpus[0].sm_occupancy is not None
    for name in ("gpubox_gpu_sm_occupancy_ratio", "gpubox_gpu_sm_active_ratio"):
        assert {dict(labels)["gpu"] for labels in of(found, name)} == {"0", "1", "2"}
    assert key("gpubox_gpu_busy_ratio", gpu_labels(gpus[3])) in found


def test_processes_carry_their_job_and_kind() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=4, processes=6))
    found = samples(exposition_text(BoxCollector(backend)))
    memory = {dict(labels)["pid"]: dict(labels) for labels in of(found, "gpubox_process_gpu_memory_bytes")}
    for p in backend.snapshots[-1].processes:
        labels = memory[str(p.pid)]
        if p.job_id is None:
            assert labels["job"] == "" and labels["kind"] == ""
        else:
            assert labels["job"] == str(p.job_id) and labels["kind"] == p.job_kind
        assert labels["user"] == p.user
    kinds = {labels["kind"] for labels in memory.values()}
    assert {"train", "quantize", "batch", ""} <= kinds


def test_what_a_gpu_does_not_give_is_left_out_never_zero() -> None:
    full = GpuSnapshot(0, GPU_UUID, "NVIDIA H100", None, gpu_busy=50.0, energy_mj=123_456_789, power_w=310.5)
    bare = GpuSnapshot(1, "GPU-bare", "NVIDIA Tesla T4", None, gpu_busy=7.0)
    lost = GpuSnapshot(2, "GPU-lost", "NVIDIA A100", None, lost=True)
    text = exposition_text(BoxCollector(ScriptedBackend([box([full, bare, lost])])))
    found = samples(text)
    assert found[key("gpubox_gpu_energy_joules_total", gpu_labels(full))] == pytest.approx(123_456.789)
    assert found[key("gpubox_gpu_power_watts", gpu_labels(full))] == 310.5
    assert of(found, "gpubox_gpu_energy_joules_total").keys() == {frozenset(gpu_labels(full).items())}
    assert {n for n, labels in found if dict(labels)["uuid"] == "GPU-lost"} == {"gpubox_gpu_lost"}
    assert found[key("gpubox_gpu_lost", gpu_labels(lost))] == 1
    assert found[key("gpubox_gpu_lost", gpu_labels(bare))] == 0
    # A metric no GPU gave this scrape is left out whole, not listed empty.
    assert "gpubox_gpu_sm_occupancy_ratio" not in text and "gpubox_process_" not in text
    types = family_types(text)
    assert types["gpubox_gpu_energy_joules"] == "counter" and types["gpubox_gpu_busy_ratio"] == "gauge"


def test_mig_instances_and_their_processes_are_labelled_by_instance() -> None:
    parent = GpuSnapshot(0, GPU_UUID, "NVIDIA H100", None, power_w=300.0)
    instance = GpuSnapshot(0, MIG_UUID, "NVIDIA H100 1g.10gb", None, mig_instance=3, mem_used_bytes=2**30)
    proc = ProcessSnapshot(4242, 0, MIG_UUID, "compute", gpu_mem_bytes=2**29, job_id=7, job_kind="infer")
    stranger = ProcessSnapshot(5151, 0, GPU_UUID, "compute", user=None, gpu_mem_bytes=2**20, loader_wait=0.25)
    found = samples(exposition_text(BoxCollector(ScriptedBackend([box([parent, instance], [proc, stranger])]))))
    assert found[key("gpubox_gpu_memory_used_bytes", {"gpu": "0/3", "uuid": MIG_UUID, "name": instance.name})] == 2**30
    assert found[key("gpubox_process_gpu_memory_bytes", process_labels(proc, "0/3"))] == 2**29
    assert process_labels(proc, "0/3")["job"] == "7"
    assert found[key("gpubox_process_loader_wait_ratio", process_labels(stranger, "0"))] == 0.25
    assert process_labels(stranger, "0")["user"] == ""
    assert list(of(found, "gpubox_process_loader_wait_ratio")) == [frozenset(process_labels(stranger, "0").items())]


def test_ledger_totals_become_counters_by_gpu() -> None:
    here = GpuSnapshot(0, GPU_UUID, "NVIDIA H100", None, gpu_busy=10.0)
    totals = {
        GPU_UUID: GpuSeconds(allocated_s=3600.0, busy_s=1800.5, starved_s=600.0),
        # GPUs no longer in the box: with the index and name the ledger last saw, and without
        "GPU-gone": GpuSeconds(allocated_s=60.0, busy_s=None, starved_s=None, label="1", name="NVIDIA A100"),
        "GPU-unnamed": GpuSeconds(allocated_s=30.0),
    }
    text = exposition_text(BoxCollector(ScriptedBackend([box([here])]), ledger=lambda: totals))
    found = samples(text)
    labels = gpu_labels(here)
    assert found[key("gpubox_gpu_allocated_seconds_total", labels)] == 3600.0
    assert found[key("gpubox_gpu_busy_seconds_total", labels)] == 1800.5
    assert found[key("gpubox_gpu_starved_seconds_total", labels)] == 600.0
    gone = {"gpu": "1", "uuid": "GPU-gone", "name": "NVIDIA A100"}
    assert found[key("gpubox_gpu_allocated_seconds_total", gone)] == 60.0
    assert key("gpubox_gpu_busy_seconds_total", gone) not in found
    unnamed = {"gpu": "", "uuid": "GPU-unnamed", "name": ""}
    assert found[key("gpubox_gpu_allocated_seconds_total", unnamed)] == 30.0
    assert family_types(text)["gpubox_gpu_starved_seconds"] == "counter"


def test_without_a_ledger_there_are_no_ledger_counters() -> None:
    text = exposition_text(BoxCollector(SimulatedBackend(gpus=1, processes=0)))
    assert "_seconds_total" not in text


def test_a_broken_ledger_costs_the_scrape_its_counters_only() -> None:
    def broken() -> dict[str, GpuSeconds]:
        raise OSError("disk I/O error")

    collector = BoxCollector(
        ScriptedBackend([box([GpuSnapshot(0, GPU_UUID, "H100", None, gpu_busy=1.0)])]), ledger=broken
    )
    found = samples(exposition_text(collector))
    assert "gpubox_gpu_busy_ratio" in {n for n, _ in found}
    assert not {n for n, _ in found if n.endswith("_seconds_total")}
    assert collector.errors == ("the ledger cannot be read (disk I/O error); its counters are left out",)


def test_an_error_is_told_once_when_it_starts_not_at_every_scrape() -> None:
    state = {"broken": True}

    def ledger() -> dict[str, GpuSeconds]:
        if state["broken"]:
            raise LedgerError("the ledger /x/ledger.db is corrupt or not a gpubox ledger (file is not a database)")
        return {}

    told: list[str] = []
    collector = BoxCollector(SimulatedBackend(gpus=1, processes=0), ledger=ledger)
    collector.on_new_error = told.append
    for _ in range(3):
        exposition_text(collector)
    state["broken"] = False
    exposition_text(collector)
    state["broken"] = True
    exposition_text(collector)
    message = (
        "the ledger /x/ledger.db is corrupt or not a gpubox ledger (file is not a database); its counters are left out"
    )
    assert told == [message, message]  # when it began, and when it came back


def test_snapshot_errors_are_kept_for_the_caller() -> None:
    collector = BoxCollector(ScriptedBackend([box([], errors=["GPU 1 cannot be opened: Unknown Error"])]))
    exposition_text(collector)
    assert collector.errors == ("GPU 1 cannot be opened: Unknown Error",)


def test_close_closes_the_backend() -> None:
    backend = RecordingBackend(SimulatedBackend(gpus=1, processes=0))
    BoxCollector(backend).close()
    assert backend.closed


def test_openmetrics_exposition_parses_too() -> None:
    """Prometheus asks for OpenMetrics first; prometheus_client answers in it from the same families."""
    collector = BoxCollector(
        SimulatedBackend(gpus=2, processes=2), ledger=lambda: {"GPU-x": GpuSeconds(allocated_s=1.0)}
    )
    collector.warm_up()
    text = openmetrics_latest(registry_of(collector)).decode()
    assert text.endswith("# EOF\n")
    families = {f.name: f for f in openmetrics_families(text)}
    assert families["gpubox_gpu_allocated_seconds"].type == "counter"
    assert families["gpubox_gpu_pcie_rx_bytes_per_second"].type == "gauge"


def test_a_scrape_restricted_by_name_has_those_metrics() -> None:
    """Prometheus's `params: {name[]: [...]}` asks for some metrics only: they come, the rest do not."""
    collector = BoxCollector(
        SimulatedBackend(gpus=2, processes=2), ledger=lambda: {"GPU-x": GpuSeconds(allocated_s=1.0)}
    )
    wanted = ["gpubox_gpu_busy_ratio", "gpubox_gpu_energy_joules_total", "gpubox_gpu_allocated_seconds_total"]
    text = generate_latest(registry_of(collector).restricted_registry(wanted)).decode()
    found = names(text)
    assert found == set(wanted), text
    assert len(of(samples(text), "gpubox_gpu_busy_ratio")) == 2


def test_a_figure_that_is_not_a_number_is_left_out() -> None:
    """A NaN or infinite reading (GPM's doubles can be) is no figure: left out, as one the GPU lacks."""
    odd = GpuSnapshot(
        0, GPU_UUID, "NVIDIA H100", None, gpu_busy=float("nan"), sm_active=float("inf"), power_w=-float("inf")
    )
    proc = ProcessSnapshot(7, 0, GPU_UUID, "compute", gpu_mem_bytes=2**20, loader_wait=float("nan"))
    ledger = {GPU_UUID: GpuSeconds(allocated_s=float("nan"), busy_s=5.0)}
    found = samples(exposition_text(BoxCollector(ScriptedBackend([box([odd], [proc])]), ledger=lambda: ledger)))
    assert {name for name, _ in found} == {
        "gpubox_gpu_lost",
        "gpubox_process_gpu_memory_bytes",
        "gpubox_gpu_busy_seconds_total",
    }
