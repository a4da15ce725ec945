"""`gpubox doctor loader`: real torch DataLoaders measured on the CPU (a sleep-bound dataset found
input-bound and helped by workers, a fast one found fed), the errors a factory can make, and the
verdict's arithmetic on injected measurements.

No test asserts a speed: sleeping items and steps make the ratios large and the same on any box.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest
import torch

from gpubox.doctor import loader as loader_module
from gpubox.doctor import loader_bench, torch_bench
from gpubox.doctor.host_view import HostView, UsableCpus
from gpubox.doctor.loader import (
    LoaderOptions,
    LoaderRunError,
    LoaderUsageError,
    examine_loader,
    parse_bench,
    run_bench,
)
from gpubox.doctor.loader_checks import decide, loader_checks, worker_limit
from gpubox.doctor.thresholds import Thresholds
from gpubox.exit_codes import ExitCode, GpuboxError
from tests.doctor.loader_targets import ASSERT_MESSAGE, OOM_MESSAGE
from tests.helpers import REPO, run_gpubox

TARGETS = "tests.doctor.loader_targets"
TARGETS_FILE = str(REPO / "tests/doctor/loader_targets.py")
T = Thresholds()


def options(target: str, budget_s: float = 4.0, max_workers: int | None = 2) -> LoaderOptions:
    return LoaderOptions.parse(target, device="cpu", max_workers=max_workers, path=str(REPO), budget_s=budget_s)


# ---------------------------------------------------------------- real loaders


def test_slow_loader_is_input_bound_and_more_workers_help() -> None:
    report, code = examine_loader(options(f"{TARGETS}:slow", budget_s=8.0, max_workers=4), T)
    by_id = {c.id: c for c in report.checks}
    verdict = report.facts["verdict"]
    assert verdict.input_bound is True
    assert verdict.own.setting.num_workers == 0
    assert verdict.best.setting.num_workers > 0
    # 4 sleeping workers load about 4x as fast as one process; 1.5x leaves room for a busy box
    assert verdict.best.pipeline_rate > 1.5 * verdict.own.pipeline_rate
    assert by_id["loader.input_bound"].status == "fail" and code == ExitCode.CHECK_FAILED
    fix = by_id["loader.input_bound"].fix or ""
    assert fix.startswith(f"DataLoader(..., num_workers={verdict.best.setting.num_workers}")
    assert by_id["loader.best_setting"].status == "ok"
    assert by_id["loader.device"].status == "ok" and "CPU" in by_id["loader.device"].detail
    assert report.findings[0].id == "loader.input_bound"
    assert report.took_s <= 8.0 + 5.0  # the budget, and the alarm's grace past it


def test_fast_loader_is_not_input_bound() -> None:
    report, code = examine_loader(options(f"{TARGETS_FILE}:fast", budget_s=4.0), T)
    verdict = report.facts["verdict"]
    assert verdict.input_bound is False, verdict
    assert verdict.wait_fraction < T.loader_wait_fraction and verdict.rate_ratio > T.loader_rate_ratio
    assert {c.id: c.status for c in report.checks}["loader.input_bound"] == "ok"
    assert code == ExitCode.OK
    rows = report.benchmarks["loader"]
    assert rows[0]["setting"] == "own" and len(rows) >= 2


def test_without_a_step_only_input_rates_are_measured() -> None:
    bench = parse_bench(run_bench(options(f"{TARGETS}:loader_only", budget_s=3.0, max_workers=0)))
    assert bench.step is None
    assert bench.runs[0].own and bench.runs[0].loader is not None and bench.runs[0].loader.rate
    check = loader_checks(bench, T)[0]
    assert check.status == "skip" and "no step to compare against" in check.detail


# ---------------------------------------------------------------- what a factory can get wrong


@pytest.mark.parametrize(
    ("target", "error", "words"),
    [
        (f"{TARGETS}:raises", LoaderRunError, "raised an exception: ValueError: the dataset path is not set"),
        (f"{TARGETS}:wrong_type", LoaderRunError, "returned a list, not a DataLoader"),
        (f"{TARGETS}:NOT_CALLABLE", LoaderUsageError, "is not callable (it is a int)"),
        (f"{TARGETS}:no_such_factory", LoaderUsageError, "has no attribute 'no_such_factory'"),
        ("tests.doctor.no_such_module:make", LoaderUsageError, "no module named 'tests.doctor.no_such_module'"),
        (f"{TARGETS}:empty", LoaderRunError, "the loader yields no batches"),
        (f"{TARGETS}:failing_step", LoaderRunError, "the step raised an exception: RuntimeError: CUDA out of memory"),
        (
            f"{TARGETS}:oom_step",
            LoaderRunError,
            "the step raised an exception: torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
        ),
        (
            f"{TARGETS}:failing_worker",
            LoaderRunError,
            "loader raised an exception: RuntimeError: CUDA error: device-side assert triggered",
        ),
    ],
)
def test_a_broken_factory_is_one_clear_sentence(target: str, error: type[GpuboxError], words: str) -> None:
    with pytest.raises(error) as caught:
        run_bench(options(target))
    message = caught.value.message
    assert words in message and "\n" not in message and "Traceback" not in message
    assert caught.value.code == (ExitCode.USAGE if error is LoaderUsageError else ExitCode.FAILED)


WORKER_ERROR = (  # as torch re-raises an error of a DataLoader worker
    "Caught RuntimeError in DataLoader worker process 0.\nOriginal Traceback (most recent call last):\n"
    '  File "train.py", line 12, in __getitem__\n    raise RuntimeError(msg)\n'
    "RuntimeError: " + ASSERT_MESSAGE
)


@pytest.mark.parametrize(
    ("exc", "line"),
    [
        (ValueError("the dataset path is not set"), "ValueError: the dataset path is not set"),
        (
            torch.OutOfMemoryError(OOM_MESSAGE),
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
            "of 79.15 GiB of which 1.02 GiB is free.",
        ),
        (RuntimeError(ASSERT_MESSAGE), "RuntimeError: CUDA error: device-side assert triggered"),
        (RuntimeError(WORKER_ERROR), "RuntimeError: CUDA error: device-side assert triggered"),
        (
            RuntimeError("\n\n  CUDA error: unspecified launch failure  \nmore\n"),
            "RuntimeError: CUDA error: unspecified launch failure",
        ),
        (
            SyntaxError("invalid syntax", ("train.py", 3, 5, "def (", 3, 6)),
            "SyntaxError: invalid syntax (train.py, line 3)",
        ),
        (KeyError(), "KeyError"),
    ],
)
def test_an_error_is_one_line_with_its_type_and_first_words(exc: BaseException, line: str) -> None:
    # each script has its own copy: both must say the same
    assert loader_bench.error_line(exc) == line
    assert torch_bench._reason(exc) == line


def test_a_factory_that_never_returns_is_stopped_at_the_budget() -> None:
    with pytest.raises(LoaderRunError, match=r"time budget of 2 s ran out while calling .*:hangs"):
        run_bench(options(f"{TARGETS}:hangs", budget_s=2.0))


@pytest.mark.parametrize(
    ("target", "words"),
    [
        ("train_loader", "expected MODULE:FACTORY"),
        ("train.py:", "expected MODULE:FACTORY"),
        ("no/such/file.py:make", "there is no file no/such/file.py"),
        ("my.module:1make", "is not a Python name"),
        ("my module:make", "neither a module name nor a .py file"),
    ],
)
def test_a_bad_target_is_a_usage_error(target: str, words: str) -> None:
    with pytest.raises(LoaderUsageError, match=words) as caught:
        LoaderOptions.parse(target)
    assert caught.value.code == ExitCode.USAGE


def test_bad_options_are_usage_errors() -> None:
    target = f"{TARGETS}:slow"
    bad = ({"device": "gpu0"}, {"device": "cuda:\u0661"}, {"max_workers": -1}, {"python": "/no/such/python"})
    for kwargs in bad:  # (cuda: and an Arabic-Indic 1, which \d and int() take)
        with pytest.raises(GpuboxError) as caught:
            LoaderOptions.parse(target, **kwargs)
        assert caught.value.code == ExitCode.USAGE, kwargs


@pytest.mark.parametrize("budget", [float("nan"), float("inf"), 1e300, 0.0, 86400.5])
def test_a_budget_out_of_range_is_a_usage_error(budget: float) -> None:
    with pytest.raises(LoaderUsageError, match=r"^--budget: ") as caught:
        LoaderOptions.parse(f"{TARGETS}:slow", budget_s=budget)
    assert caught.value.code == ExitCode.USAGE


@pytest.mark.parametrize("budget", ["nan", "inf", "1e300"])
def test_a_budget_out_of_range_is_one_line_through_the_cli(budget: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(REPO)
    out = run_gpubox("doctor", "loader", "tests/doctor/loader_targets.py:fast", "--budget", budget)
    assert out.returncode == ExitCode.USAGE, out.stderr
    lines = out.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpubox: ") and "--budget" in lines[0], out.stderr
    assert "Traceback" not in out.stderr


# ---------------------------------------------------------------- the environment the script runs in


def quota(count: float | None) -> Any:
    """usable_cpus as a container with a CPU quota on a 128-CPU host would answer."""

    def usable(view: HostView) -> UsableCpus:
        return UsableCpus(count, "cgroup v2 cpu.max", frozenset(range(128)))

    return usable


def test_the_sweep_keeps_to_the_cgroup_cpu_quota(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loader_module, "usable_cpus", quota(1.5))
    data = run_bench(options(f"{TARGETS}:loader_only", budget_s=3.0, max_workers=None))
    assert data["cpus"] == {"usable": 1.5, "limited_by": "cgroup v2 cpu.max", "max_workers": 1}
    assert data["settings"] and all(r["num_workers"] <= 1 for r in data["settings"])
    bench = parse_bench(data)
    assert bench.usable_cpus == 1.5 and bench.max_workers == 1


@pytest.mark.parametrize(
    ("count", "asked", "passed"), [(4.0, None, "4"), (0.5, None, "1"), (None, None, None), (2.5, 8, "8")]
)
def test_max_workers_comes_from_the_usable_cpus_unless_given(
    count: float | None, asked: int | None, passed: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    from gpubox.doctor import interpreter

    seen: list[list[str]] = []

    def fake_run(script: str, args: list[str], **_: Any) -> interpreter.ScriptRun:
        seen.append(list(args))
        return interpreter.ScriptRun(sys.executable, (script, *args), doc([run(0, 10.0, 0.5, own=True)]), None, 0, 1.0)

    monkeypatch.setattr(loader_module, "usable_cpus", quota(count))
    monkeypatch.setattr(interpreter, "run_script", fake_run)
    data = run_bench(options(f"{TARGETS}:slow", max_workers=asked))
    args = seen[0]
    assert (args[args.index("--max-workers") + 1] if "--max-workers" in args else None) == passed
    assert data["cpus"]["usable"] == (16 if count is None else count)  # unknown: the script's own count


@pytest.mark.parametrize(("count", "asked"), [(2.0, 17), (2.0, 100_000), (8.0, 33), (None, 100_000)])
def test_max_workers_far_above_the_usable_cpus_is_a_usage_error(
    count: float | None, asked: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A typo (100000 for 10) must not start that many worker processes on a shared box."""
    from gpubox.doctor import interpreter

    ran: list[str] = []
    monkeypatch.setattr(loader_module, "usable_cpus", quota(count))
    monkeypatch.setattr(loader_module.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(interpreter, "run_script", lambda script, *_, **__: ran.append(script))
    with pytest.raises(LoaderUsageError, match=r"^--max-workers: at most (16|32) ") as caught:
        run_bench(options(f"{TARGETS}:slow", max_workers=asked))
    assert caught.value.code == ExitCode.USAGE
    assert ran == []


def test_max_workers_up_to_the_limit_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    from gpubox.doctor import interpreter

    seen: list[list[str]] = []

    def fake_run(script: str, args: list[str], **_: Any) -> interpreter.ScriptRun:
        seen.append(list(args))
        return interpreter.ScriptRun(sys.executable, (script, *args), doc([run(0, 10.0, 0.5, own=True)]), None, 0, 1.0)

    monkeypatch.setattr(loader_module, "usable_cpus", quota(8.0))
    monkeypatch.setattr(interpreter, "run_script", fake_run)
    run_bench(options(f"{TARGETS}:slow", max_workers=32))
    assert seen[0][seen[0].index("--max-workers") + 1] == "32"


def test_a_users_module_is_not_hidden_by_gpuboxs_own(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """gpubox/doctor holds a model.py too: the user's, on PYTHONPATH, must be the one imported."""
    (tmp_path / "model.py").write_text("USER_ONLY = 7\n")
    (tmp_path / "usertrain.py").write_text(
        "import model\nimport torch\nfrom torch.utils.data import DataLoader\n\n"
        "def make():\n    return DataLoader(torch.zeros(64, model.USER_ONLY), batch_size=8)\n"
    )
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    bench = parse_bench(run_bench(options("usertrain:make", budget_s=2.0, max_workers=0)))
    assert bench.runs[0].own and bench.runs[0].loader is not None


@pytest.mark.parametrize(
    ("body", "cause"),
    [
        ('raise ImportError("libcudart.so.12: cannot open shared object file")', "ImportError: libcudart.so.12: "),
        ("import torch._C", "ModuleNotFoundError: No module named 'torch._C'"),
    ],
)
def test_a_broken_torch_is_not_a_missing_one(
    body: str, cause: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(body + "\n")
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))
    with pytest.raises(LoaderRunError) as caught:
        run_bench(options(f"{TARGETS_FILE}:fast"))
    assert caught.value.message.startswith(f"torch is installed in {sys.executable} but cannot be imported: {cause}")
    assert "not installed" not in caught.value.message and "\n" not in caught.value.message


def bench_child(parent: int) -> int | None:
    """The loader_bench.py process that PARENT started, found through /proc."""
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with suppress(OSError):
            stat = (entry / "stat").read_bytes()
            ppid = int(stat[stat.rfind(b")") + 2 :].split()[1])
            if ppid == parent and b"loader_bench.py" in (entry / "cmdline").read_bytes():
                return int(entry.name)
    return None


def running(pid: int) -> bool:
    """Still the benchmark and not a zombie (nobody may reap an orphan in a container)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_bytes()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2 :].split()[0] != b"Z" and b"loader_bench.py" in cmdline


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the child dies with gpubox through Linux's prctl")
def test_the_benchmark_ends_when_gpubox_is_terminated() -> None:
    argv = [sys.executable, "-m", "gpubox", "doctor", "loader", f"{TARGETS_FILE}:hangs", "--budget", "30"]
    gpubox = subprocess.Popen(
        [*argv, "--device", "cpu"],
        cwd=REPO,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    child = None
    try:
        deadline = time.monotonic() + 60
        while child is None and time.monotonic() < deadline and gpubox.poll() is None:
            child = bench_child(gpubox.pid)
            time.sleep(0.05)
        assert child is not None, "the benchmark never started"
        gpubox.send_signal(signal.SIGTERM)
        gpubox.wait(timeout=30)
        deadline = time.monotonic() + 10
        while running(child) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not running(child), "the benchmark outlived gpubox"
    finally:
        if gpubox.poll() is None:
            gpubox.kill()
            gpubox.wait()
        if child is not None and running(child):
            with suppress(OSError):
                os.killpg(child, signal.SIGKILL)


def test_importing_the_script_does_nothing() -> None:
    code = "import sys, gpubox.doctor.loader_bench; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.strip() == "False"


def test_the_example_factory_gives_a_loader_and_a_step() -> None:
    path = REPO / "examples/doctor/slow_loader.py"
    assert "gpubox doctor loader examples/doctor/slow_loader.py:make" in path.read_text()
    spec = importlib.util.spec_from_file_location("slow_loader_example", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    loader, step = module.make()
    assert loader.num_workers == 0
    step(next(iter(loader)))


# ---------------------------------------------------------------- the verdict, on injected figures


def phase(rate: float, wait: float = 1.0, batches: int = 100) -> dict[str, Any]:
    return {"batches": batches, "seconds": batches / rate, "rate": rate, "wait_s": 0.0, "wait_fraction": wait}


def run(workers: int, pipeline: float, wait: float, own: bool = False, **more: Any) -> dict[str, Any]:
    record = {
        "num_workers": workers,
        "pin_memory": more.pop("pin", workers > 0),
        "prefetch_factor": more.pop("prefetch", 2 if workers else None),
        "persistent_workers": workers > 0,
        "own": own,
        "startup_s": 0.1,
        "loader": phase(more.pop("loader", 2 * pipeline)),
        "copy": phase(more.pop("copy")) if "copy" in more else None,
        "pipeline": phase(pipeline, wait),
        "complete": True,
        "error": None,
    }
    return record


def doc(runs: list[dict[str, Any]], step_rate: float | None = 100.0, kind: str = "cpu", **more: Any) -> dict[str, Any]:
    own = runs[0]
    return {
        "ok": True,
        "version": 1,
        "mode": "quick",
        "budget_s": 20.0,
        "elapsed_s": 19.0,
        "python": "3.11.7",
        "executable": "/usr/bin/python3",
        "torch": "2.5.0",
        "device": {
            "name": "cuda:0" if kind == "cuda" else "cpu",
            "kind": kind,
            "asked": more.pop("asked", "auto"),
            "gpu_name": "NVIDIA H200" if kind == "cuda" else None,
            "reason": "torch.cuda.is_available() is False: no GPU is visible to this torch",
        },
        "cpus": {"usable": 16, "max_workers": more.pop("max_workers", 16)},
        "factory": {
            "spec": "train.py:make",
            "own": {k: own[k] for k in ("num_workers", "pin_memory", "prefetch_factor", "persistent_workers")},
        },
        "step": {"given": step_rate is not None, "first_call_s": 0.5, "calls": 50, "seconds": 0.5, "rate": step_rate},
        "settings": runs,
        "not_tried": [],
        "notes": [],
        "truncated": False,
    }


def checks_of(d: Mapping[str, Any]) -> dict[str, Any]:
    return {c.id: c for c in loader_checks(parse_bench(d), T)}


def test_verdict_arithmetic() -> None:
    bench = parse_bench(
        doc([run(0, 40.0, 0.6, own=True, loader=50.0), run(4, 96.0, 0.02), run(2, 70.0, 0.1)], step_rate=100.0)
    )
    v = decide(bench, T)
    assert v.feed_rate == 50.0 and v.step_rate == 100.0
    assert v.rate_ratio == pytest.approx(0.5)
    assert v.wait_fraction == pytest.approx(0.6)
    assert v.max_speedup == pytest.approx(1 / (1 - 0.6))  # 2.5x: all of the waiting gone
    assert v.speedup == pytest.approx(96.0 / 40.0)
    assert v.input_bound is True and v.best is not None and v.best.setting.num_workers == 4
    check = loader_checks(bench, T)[0]
    assert check.status == "fail" and check.value == 60.0 and check.impact == pytest.approx(0.6)
    assert check.fix == "DataLoader(..., num_workers=4, pin_memory=True, prefetch_factor=2, persistent_workers=True)"
    assert "up to 2.5x faster" in check.meaning and "2.40x" in check.meaning


@pytest.mark.parametrize(
    ("feed", "wait", "bound", "status"),
    [
        (105.0, 0.05, True, "warn"),  # the loader only 1.05x the step: no margin
        (110.0, 0.05, False, "ok"),  # exactly 1.1x is enough
        (200.0, 0.10, False, "ok"),  # waiting exactly 10% is not more than 10%
        (200.0, 0.15, True, "warn"),
        (200.0, 0.25, True, "fail"),  # more than twice the wait threshold
        (90.0, 0.05, True, "fail"),  # the loader is slower than the step
    ],
)
def test_input_bound_thresholds(feed: float, wait: float, bound: bool, status: str) -> None:
    d = doc([run(0, 50.0, wait, own=True, loader=feed)], step_rate=100.0)
    v = decide(parse_bench(d), T)
    assert v.input_bound is bound
    assert checks_of(d)["loader.input_bound"].status == status


def test_on_a_gpu_the_feed_rate_includes_the_copy() -> None:
    d = doc([run(8, 80.0, 0.3, own=True, loader=500.0, copy=90.0)], step_rate=100.0, kind="cuda")
    v = decide(parse_bench(d), T)
    assert v.feed_rate == 90.0 and v.rate_ratio == pytest.approx(0.9)
    checks = checks_of(d)
    assert "with the copy to the GPU" in checks["loader.input_bound"].detail
    assert checks["loader.device"].status == "ok" and "NVIDIA H200" in checks["loader.device"].detail


@pytest.mark.parametrize(
    ("pins", "words", "not_words"),
    [
        ((True, True), "every setting measured had pin_memory=True", "pageable"),
        ((False, False), "blocking copies from pageable memory", "non_blocking=True"),
        ((False, True), "for those with pin_memory=False", None),
    ],
)
def test_the_device_check_says_how_the_copies_were_made(
    pins: tuple[bool, bool], words: str, not_words: str | None
) -> None:
    runs = [run(4, 80.0, 0.3, own=True, pin=pins[0], copy=90.0), run(8, 90.0, 0.2, pin=pins[1], copy=95.0)]
    detail = checks_of(doc(runs, kind="cuda"))["loader.device"].detail
    assert words in detail, detail
    assert not_words is None or not_words not in detail, detail


def test_the_best_setting_within_noise_is_the_cheaper_one() -> None:
    d = doc([run(0, 40.0, 0.6, own=True), run(16, 100.0, 0.01), run(8, 98.0, 0.01), run(4, 90.0, 0.05)])
    v = decide(parse_bench(d), T)
    assert v.best is not None and v.best.setting.num_workers == 8  # 98 is 100 within 3%; 90 is not


def test_when_the_own_setting_is_best_the_fix_says_what_else_to_do() -> None:
    d = doc([run(4, 50.0, 0.5, own=True), run(0, 20.0, 0.9), run(8, 49.0, 0.5)], max_workers=8)
    checks = checks_of(d)
    assert checks["loader.input_bound"].status == "fail"
    assert checks["loader.input_bound"].fix.startswith("no setting tried loads faster")
    assert checks["loader.best_setting"].status == "ok"
    assert "the factory's own setting" in checks["loader.best_setting"].detail


def test_the_most_workers_tried_being_best_suggests_more() -> None:
    d = doc([run(0, 10.0, 0.9, own=True), run(2, 20.0, 0.8), run(4, 40.0, 0.6)], max_workers=4)
    fix = checks_of(d)["loader.input_bound"].fix
    assert fix.startswith("DataLoader(..., num_workers=4,") and "--max-workers 8" in fix


def test_without_a_step_a_faster_loader_is_a_warning() -> None:
    d = doc([run(0, 100.0, 1.0, own=True), run(4, 300.0, 1.0)], step_rate=None)
    v = decide(parse_bench(d), T)
    assert v.input_bound is None and v.wait_fraction is None and v.max_speedup is None
    checks = checks_of(d)
    assert checks["loader.input_bound"].status == "skip"
    best = checks["loader.best_setting"]
    assert best.status == "warn" and best.fix is not None and "num_workers=4" in best.fix
    assert best.impact == pytest.approx(1 - 100.0 / 300.0)


def test_an_own_setting_cut_short_is_a_skip_not_a_verdict() -> None:
    cut = run(0, 1.0, 1.0, own=True) | {"loader": None, "pipeline": None, "complete": False, "startup_s": 9.5}
    d = doc([cut, run(2, 4.0, 0.5)])
    v = decide(parse_bench(d), T)
    assert v.own is None and v.input_bound is None and v.speedup is None
    checks = checks_of(d)
    assert checks["loader.input_bound"].status == "skip" and "9.5 s" in checks["loader.input_bound"].detail
    assert checks["loader.best_setting"].status == "ok"


def test_the_device_check_says_why_it_ran_on_the_cpu() -> None:
    no_gpu = checks_of(doc([run(0, 10.0, 0.5, own=True)]))["loader.device"]
    assert no_gpu.status == "skip" and "no GPU found" in no_gpu.detail
    asked = checks_of(doc([run(0, 10.0, 0.5, own=True)], asked="cpu"))["loader.device"]
    assert asked.status == "ok"


def test_malformed_results_are_one_sentence() -> None:
    with pytest.raises(LoaderRunError, match="cannot be read"):
        parse_bench({"ok": True, "settings": []})


def test_an_exception_whose_message_fails_is_named_by_its_type() -> None:
    class Unprintable(Exception):
        def __str__(self) -> str:
            raise RuntimeError("no message")

    assert loader_bench.error_line(Unprintable()).endswith("Unprintable")


@pytest.mark.parametrize(
    ("usable", "max_workers", "advice"),
    [
        (16, 16, "try more with --max-workers 32"),  # 16 usable CPUs: up to 64 may be asked for
        (16, 40, "try more with --max-workers 64"),  # never past that: it would be refused
        (16, 64, "the most --max-workers takes here (64): more would only take turns on the 16 usable CPUs"),
        (2, 16, "the most --max-workers takes here (16): more would only take turns on the 2 usable CPUs"),
    ],
)
def test_the_advice_to_try_more_workers_stays_within_what_max_workers_takes(
    usable: int, max_workers: int, advice: str
) -> None:
    runs = [run(0, 40.0, 0.6, own=True, loader=50.0), run(max_workers, 96.0, 0.02)]
    d = doc(runs, max_workers=max_workers)
    d["cpus"]["usable"] = usable
    fix = checks_of(d)["loader.input_bound"].fix or ""
    assert advice in fix and fix.endswith(("--max-workers 32", "--max-workers 64", "give the job more CPUs")), fix
    assert (worker_limit(16), worker_limit(2)) == (64, 16)
