"""Attaching the probe: `gpubox run` with no code change, or one line in the script; and a
program that never uses torch runs exactly as it would without gpubox."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.probe.support import (
    GPUBOX_RUN,
    Running,
    only_record,
    probe_files,
    python_cmd,
    requires_torch,
    run,
    write_program,
)


def _bare_python(cwd: Path) -> str:
    """The interpreter this environment was made from: no torch, no typer, no gpubox."""
    path = Path(sys.base_prefix) / "bin" / f"python{sys.version_info.major}.{sys.version_info.minor}"
    if not path.exists():
        pytest.skip("no base interpreter")
    check = "import importlib.util as u; print(any(u.find_spec(m) for m in ('torch', 'typer', 'gpubox')))"
    found = subprocess.run([str(path), "-c", check], capture_output=True, text=True, timeout=60, cwd=cwd)
    if found.stdout.strip() != "False":
        pytest.skip("the base interpreter has torch, typer or gpubox installed")
    return str(path)


@requires_torch
def test_gpubox_run_attaches_with_no_code_change_and_passes_the_exit_code(tmp_path: Path, runtime: Path) -> None:
    program = write_program(
        tmp_path,
        """
        from torch.utils.data import DataLoader

        for batch in DataLoader(sleepy(5, 0.01)):
            pass
        pause("LOOPED")
        sys.exit(7)
        """,
    )
    job = Running(python_cmd(program, via_run=True))
    try:
        job.wait_for("LOOPED")
        record = only_record(runtime, job.proc.pid)  # exec: the program has gpubox run's pid
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert record.batches == 5 and record.wait_ns >= 5 * 0.01e9
    assert code == 7, err
    assert probe_files(runtime) == []


ARGV = "import json, sys; print(json.dumps(sys.argv[1:]))"


@pytest.mark.parametrize("dashes", [[], ["--"]])
def test_gpubox_run_leaves_the_commands_options_to_it(tmp_path: Path, dashes: list[str]) -> None:
    result = run([*GPUBOX_RUN, *dashes, sys.executable, "-c", ARGV, "--lr", "3", "-h", "--"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == ["--lr", "3", "-h", "--"]


def test_gpubox_run_says_when_there_is_no_command_to_run() -> None:
    missing = run([*GPUBOX_RUN, "no-such-command-gpubox", "x"])
    assert missing.returncode == 127
    assert missing.stderr == "gpubox: no-such-command-gpubox: command not found\n"
    none = run(GPUBOX_RUN)
    assert none.returncode == 2 and len(none.stderr.splitlines()) == 1, none.stderr
    helped = run([*GPUBOX_RUN, "--help"])
    assert helped.returncode == 0 and "gpubox run [OPTIONS] [--]" in helped.stdout


SHOW = """
import json, os, sys
print(json.dumps({
    "probe": "_gpubox_probe.probe.hook" in sys.modules,
    "sitecustomize": getattr(sys.modules.get("sitecustomize"), "__file__", None),
    "user_ran": getattr(sys.modules.get("sitecustomize"), "RAN", False),
}))
"""


def test_gpubox_run_also_runs_the_users_own_sitecustomize(tmp_path: Path) -> None:
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("RAN = True\n")
    result = run([*GPUBOX_RUN, sys.executable, "-c", SHOW], env={"PYTHONPATH": str(user)})
    assert result.returncode == 0 and result.stderr == "", result.stderr
    shown = json.loads(result.stdout)
    assert shown == {"probe": True, "sitecustomize": str(user / "sitecustomize.py"), "user_ran": True}


def test_a_failing_user_sitecustomize_is_reported_as_python_reports_it(tmp_path: Path) -> None:
    user = tmp_path / "user-site"
    user.mkdir()
    (user / "sitecustomize.py").write_text("raise RuntimeError('broken site')\n")
    env = {"PYTHONPATH": str(user)}
    plain = run([sys.executable, "-c", "print('ran')"], env=env)
    probed = run([*GPUBOX_RUN, sys.executable, "-c", "print('ran')"], env=env)
    assert "broken site" in plain.stderr
    assert (probed.returncode, probed.stdout, probed.stderr) == (plain.returncode, plain.stdout, plain.stderr)


def test_gpubox_run_makes_nothing_importable(tmp_path: Path, runtime: Path) -> None:
    bare = _bare_python(tmp_path)
    program = """
import importlib.util, json, sys
print(json.dumps({
    "probe": "_gpubox_probe.probe.hook" in sys.modules,
    "gpubox": importlib.util.find_spec("gpubox") is not None,
    "typer": importlib.util.find_spec("typer") is not None,
    "torch": importlib.util.find_spec("torch") is not None,
}))
"""
    result = run([*GPUBOX_RUN, bare, "-c", program], cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout) == {"probe": True, "gpubox": False, "typer": False, "torch": False}


def test_a_program_without_torch_runs_unchanged(tmp_path: Path, runtime: Path) -> None:
    bare = _bare_python(tmp_path)
    program = tmp_path / "plain.py"
    program.write_text("import sys\nprint('hello', sys.argv[1:])\nprint('to stderr', file=sys.stderr)\nsys.exit(3)\n")
    plain = run([bare, str(program), "a b"], cwd=tmp_path)
    probed = run([*GPUBOX_RUN, bare, str(program), "a b"], cwd=tmp_path)
    assert (probed.returncode, probed.stdout, probed.stderr) == (3, "hello ['a b']\n", "to stderr\n")
    assert (plain.returncode, plain.stdout, plain.stderr) == (probed.returncode, probed.stdout, probed.stderr)
    assert not runtime.exists()  # no probe file, not even a directory


def test_importing_and_installing_the_probe_loads_no_torch() -> None:
    program = """
import json, sys
before = set(sys.modules)
import gpubox.probe
gpubox.probe.install()
gpubox.probe.install()
print(json.dumps(sorted(set(sys.modules) - before)))
"""
    result = run([sys.executable, "-c", program])
    assert result.returncode == 0 and result.stderr == "", result.stderr
    assert json.loads(result.stdout) == ["gpubox", "gpubox.probe", "gpubox.probe.hook"]


@requires_torch
@pytest.mark.parametrize("where", ["before torch", "after torch"])
def test_one_line_install(tmp_path: Path, runtime: Path, where: str) -> None:
    install = "import gpubox.probe; gpubox.probe.install(); gpubox.probe.install()\n"
    program = write_program(
        tmp_path,
        (install if where == "before torch" else "")
        + "from torch.utils.data import DataLoader\n"
        + (install if where == "after torch" else "")
        + "print(len(list(DataLoader(sleepy(4, 0.0)))))\npause('DONE')\n",
    )
    job = Running(python_cmd(program))
    try:
        job.wait_for("DONE")
        record = only_record(runtime, job.proc.pid)
        job.go_on()
        code, _, err = job.finish()
    finally:
        job.kill()
    assert code == 0, err
    assert record.batches == 4  # installed twice, counted once
