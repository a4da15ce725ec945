"""`gpubox top --once` through the real CLI, as a script or cron job would run it."""

import json

from tests.helpers import run_gpubox


def test_json_envelope_on_the_simulated_box() -> None:
    res = run_gpubox("top", "--once", "--json", "--demo", "--interval", "0.05")
    assert res.returncode == 0, res.stderr
    doc = json.loads(res.stdout)
    assert (doc["schema"], doc["command"], doc["ok"], doc["exit_code"]) == (1, "top", True, 0)
    data = doc["data"]
    assert data["backend"] == "simulated"
    assert [g["index"] for g in data["gpus"]] == [0, 1, 2, 3]
    hopper, geforce = data["gpus"][0], data["gpus"][3]
    # A GPU with GPM reports occupancy; one without reports null and says why, never 0.
    assert hopper["sm_occupancy"] is not None and hopper["sm_occupancy"] > 0
    assert geforce["sm_occupancy"] is None and geforce["reasons"]["sm_occupancy"] == "not_supported"
    # The second sample of --once has rates.
    assert hopper["pcie_rx_Bps"] > 0 and "pcie_rx_Bps" not in hopper["reasons"]
    assert len(data["processes"]) == 12
    proc = data["processes"][0]
    for key in ("pid", "user", "command", "sm_util", "gpu_mem_bytes", "cpu_percent", "rss_bytes", "start_time"):
        assert proc[key] is not None, key
    # The demo's trainers run the probe; processes nothing measures say so: null, never 0.
    by_source = {p["loader_wait_source"]: p for p in data["processes"]}
    probed, unknown = by_source["probe"], by_source[None]
    assert 0 < probed["loader_wait"] <= 1 and probed["batches_per_s"] > 0 and "loader_wait" not in probed["reasons"]
    assert unknown["loader_wait"] is None and unknown["reasons"]["loader_wait"] == "not_measured"
    assert by_source["sampled"]["loader_wait_samples"] > 0
    # Some of the demo's processes were started by the gpubox queue; the others by hand.
    by_pid = {p["pid"]: p for p in data["processes"]}
    trainer, quantizer, server = by_pid[10_000], by_pid[10_034], by_pid[10_017]
    assert (trainer["job_id"], trainer["job_kind"]) == (12, "train")
    assert (quantizer["job_id"], quantizer["job_kind"]) == (14, "quantize")
    assert (server["job_id"], server["job_kind"]) == (None, None) and "job_id" not in server["reasons"]


def test_json_implies_once_and_gpu_filter_keeps_only_those_gpus() -> None:
    res = run_gpubox("top", "--json", "--demo", "--gpu", "1,3", "--interval", "0.05")
    assert res.returncode == 0, res.stderr
    data = json.loads(res.stdout)["data"]
    assert [g["index"] for g in data["gpus"]] == [1, 3]
    assert {p["gpu_index"] for p in data["processes"]} == {1, 3}


def test_gpu_filter_by_uuid_prefix() -> None:
    res = run_gpubox("top", "--json", "--demo", "--gpu", "GPU-5e1a0002", "--interval", "0.05")
    assert res.returncode == 0, res.stderr
    assert [g["index"] for g in json.loads(res.stdout)["data"]["gpus"]] == [2]


def test_table_output_lists_gpus_and_processes() -> None:
    res = run_gpubox("top", "--once", "--demo", "--no-color", "--interval", "0.05")
    assert res.returncode == 0, res.stderr
    assert "NVIDIA H100 80GB HBM3" in res.stdout
    assert "python train.py --model llama-8b --bs 16" in res.stdout
    (trainer,) = [line for line in res.stdout.splitlines() if line.startswith("10000 ")]
    assert "  12 train  " in trainer and "Job" in res.stdout
    assert "\x1b[" not in res.stdout  # no escape codes in a pipe


def test_no_driver_is_one_line_and_exit_3(tmp_path) -> None:
    # An empty library path: libnvidia-ml.so.1 cannot be found.
    res = run_gpubox("top", "--once", env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert res.returncode == 3
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and "no NVIDIA driver" in lines[0] and "--demo" in lines[0]
    assert "Traceback" not in res.stderr


def test_no_driver_with_json_still_prints_an_envelope(tmp_path) -> None:
    res = run_gpubox("top", "--json", env={"LD_LIBRARY_PATH": str(tmp_path)})
    assert res.returncode == 3
    doc = json.loads(res.stdout)
    assert doc["ok"] is False and doc["exit_code"] == 3 and doc["errors"]


def test_bad_input_is_one_line_and_exit_2() -> None:
    cases = [
        ("top", "--once", "--demo", "--gpu", "9"),
        ("top", "--once", "--demo", "--gpu", "GPU-nope"),
        ("top", "--once", "--demo", "--interval", "0"),
        ("top", "--once", "--demo", "--interval", "soon"),
        ("top", "--frobnicate"),
        ("topp",),
    ]
    for args in cases:
        res = run_gpubox(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert len(res.stderr.strip().splitlines()) == 1, (args, res.stderr)
        assert res.stderr.startswith("gpubox: "), (args, res.stderr)
        assert res.stdout == "", args


def test_bad_config_file_is_exit_2(isolated_env) -> None:
    cfg = isolated_env / ".config" / "gpubox"
    cfg.mkdir(parents=True)
    (cfg / "config.toml").write_text("[top]\ninterval = -1\n")
    res = run_gpubox("top", "--once", "--demo")
    assert res.returncode == 2
    assert "config.toml" in res.stderr and "top.interval" in res.stderr


def test_version() -> None:
    res = run_gpubox("--version")
    assert res.returncode == 0 and res.stdout.startswith("gpubox ")


def test_typo_suggestions_never_name_hidden_options() -> None:
    res = run_gpubox("top", "--demo-gpu", "3")
    assert res.returncode == 2
    assert "--demo-gpus" not in res.stderr and "--demo" in res.stderr


def test_a_bad_gpu_names_the_gpus_there_are() -> None:
    res = run_gpubox("top", "--demo", "--gpu", "9")
    assert res.returncode == 2
    assert res.stderr == "gpubox: no GPU 9 on this box (GPUs: 0, 1, 2, 3)\n"


def test_without_a_terminal_top_prints_one_snapshot() -> None:
    res = run_gpubox("top", "--demo", "--no-color", "--interval", "0.05")
    assert res.returncode == 0, res.stderr
    assert "NVIDIA H100 80GB HBM3" in res.stdout and "\x1b[" not in res.stdout
