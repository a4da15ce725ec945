"""The doctor's thresholds are settings: from the config file or the environment, checked, and
used by the checks."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpubox.config import load_config
from gpubox.doctor.thresholds import DEFAULTS, HELP, Thresholds, thresholds_from
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.paths import resolve_paths
from tests.helpers import run_gpubox


def _env(tmp_path: Path) -> dict[str, str]:
    return {"HOME": str(tmp_path), "GPUBOX_SYSTEM_CONFIG": str(tmp_path / "system.toml")}


def test_every_threshold_is_a_setting_with_its_default_and_help() -> None:
    assert thresholds_from(load_config({}, {}).values) == Thresholds()
    assert set(DEFAULTS) == set(HELP) and all(text.endswith(".") for text in HELP.values())
    assert DEFAULTS["doctor.loader_wait_fraction"] == 0.1 and DEFAULTS["doctor.loader_rate_ratio"] == 1.1


def test_the_config_file_and_the_environment_set_them(tmp_path: Path) -> None:
    env = _env(tmp_path)
    paths = resolve_paths(env, uid=1000)
    paths.user_config_file.parent.mkdir(parents=True)
    paths.user_config_file.write_text("[doctor]\nshm_fail_mib = 32\ntransfer_warn_fraction = 0.8\n")
    env["GPUBOX_DOCTOR_CPUS_PER_GPU_WARN"] = "2"
    t = thresholds_from(load_config({}, env, paths).values)
    assert (t.shm_fail_mib, t.transfer_warn_fraction, t.cpus_per_gpu_warn) == (32.0, 0.8, 2.0)


@pytest.mark.parametrize("text", ["[doctor]\nshm_fail_mib = -1\n", "[doctor]\nshm_fail_mib = true\n"])
def test_a_bad_threshold_is_a_usage_error(tmp_path: Path, text: str) -> None:
    env = _env(tmp_path)
    paths = resolve_paths(env, uid=1000)
    paths.user_config_file.parent.mkdir(parents=True)
    paths.user_config_file.write_text(text)
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE and "doctor.shm_fail_mib" in err.value.message


def test_the_doctor_reads_them(tmp_path: Path) -> None:
    # A /dev/shm of any size fails when the threshold is above every real size.
    res = run_gpubox("doctor", "--json", "--only", "host", env={"GPUBOX_DOCTOR_SHM_FAIL_MIB": "1e9"})
    shm = next(c for c in json.loads(res.stdout)["data"]["checks"] if c["id"] == "host.shm_size")
    assert shm["status"] == "fail" and res.returncode == 5
    res = run_gpubox("doctor", "--only", "host", env={"GPUBOX_DOCTOR_SHM_FAIL_MIB": "lots"})
    assert res.returncode == 2 and "GPUBOX_DOCTOR_SHM_FAIL_MIB" in res.stderr
