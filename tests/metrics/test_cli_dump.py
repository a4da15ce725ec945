"""`gpubox metrics dump`: the exposition text once, for cron, parsed by prometheus_client's parser."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from gpubox.metrics.catalog import ALL_METRICS
from tests.metrics.support import family_types, of, run_metrics, samples


def test_dump_demo_is_the_exposition_of_a_simulated_box() -> None:
    res = run_metrics("dump", "--demo")
    assert res.returncode == 0, res.stderr
    assert res.stderr == ""
    families = list(text_string_to_metric_families(res.stdout))
    catalog = {s.name.removesuffix("_total"): s for s in ALL_METRICS}
    for family in families:
        spec = catalog[family.name]  # nothing outside the catalog
        assert family.type == ("counter" if spec.counter else "gauge")
        assert family.documentation == spec.help
        for s in family.samples:
            assert set(s.labels) == set(spec.labels), (s.name, s.labels)
    found = samples(res.stdout)
    assert len(of(found, "gpubox_gpu_busy_ratio")) == 4
    assert len(of(found, "gpubox_gpu_pcie_rx_bytes_per_second")) == 4  # two samples apart: rates exist
    assert len(of(found, "gpubox_gpu_sm_occupancy_ratio")) == 3  # the demo's RTX 4090 has no GPM
    assert len(of(found, "gpubox_process_gpu_memory_bytes")) == 12
    for name, value in ((n, v) for (n, _), v in found.items() if n.endswith("_ratio")):
        assert 0 <= value <= 1, f"{name} = {value}: a ratio, not a percent"
    assert family_types(res.stdout)["gpubox_gpu_busy_ratio"] == "gauge"


def test_no_driver_is_one_line_and_exit_3(tmp_path: Path) -> None:
    res = run_metrics("dump", env={"LD_LIBRARY_PATH": str(tmp_path)})  # libnvidia-ml.so.1 cannot be found
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: ") and "--demo" in lines[0], res.stderr
    assert res.stdout == ""


@pytest.mark.parametrize("interval", ["0", "-1", "nan", "inf", "61", "soon"])
def test_bad_interval_is_one_line_and_exit_2(interval: str) -> None:
    res = run_metrics("dump", "--demo", "--interval", interval)
    assert res.returncode == 2, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: ") and "Traceback" not in res.stderr
    assert res.stdout == ""
