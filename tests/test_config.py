import errno
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from gpubox.config import load_config
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.paths import resolve_paths


def _paths(tmp_path: Path):
    env = {"HOME": str(tmp_path), "GPUBOX_SYSTEM_CONFIG": str(tmp_path / "system.toml")}
    return env, resolve_paths(env, uid=1000)


def test_defaults_when_nothing_is_set(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    cfg = load_config({}, env, paths)
    assert cfg.get("top.interval") == 1.0
    assert cfg.get("color") is True
    assert cfg.sources["top.interval"] == "default"


def test_precedence_flag_env_user_system(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    paths.system_config_file.write_text("[top]\ninterval = 5\n")
    assert load_config({}, env, paths).get("top.interval") == 5.0
    paths.user_config_file.parent.mkdir(parents=True)
    paths.user_config_file.write_text("[top]\ninterval = 4\n")
    assert load_config({}, env, paths).get("top.interval") == 4.0
    env["GPUBOX_TOP_INTERVAL"] = "3"
    cfg = load_config({}, env, paths)
    assert cfg.get("top.interval") == 3.0
    assert cfg.sources["top.interval"] == "environment variable GPUBOX_TOP_INTERVAL"
    cfg = load_config({"top.interval": 2.0}, env, paths)
    assert cfg.get("top.interval") == 2.0
    assert cfg.sources["top.interval"] == "command line"


def test_no_color_env_beats_files_but_not_gpubox_color(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    paths.user_config_file.parent.mkdir(parents=True)
    paths.user_config_file.write_text("color = true\n")
    env["NO_COLOR"] = "1"
    assert load_config({}, env, paths).get("color") is False
    env["GPUBOX_COLOR"] = "yes"
    assert load_config({}, env, paths).get("color") is True
    assert load_config({"color": False}, env, paths).get("color") is False


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("[top]\ninterval = 0\n", "top.interval"),
        ("[top]\nintervall = 1\n", "unknown setting 'top.intervall'"),
        ("[top\n", "config file"),
        ("color = 'maybe'\n", "color"),
    ],
)
def test_bad_user_config_is_a_usage_error_naming_the_file(tmp_path: Path, text: str, needle: str) -> None:
    env, paths = _paths(tmp_path)
    paths.user_config_file.parent.mkdir(parents=True)
    paths.user_config_file.write_text(text)
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    assert needle in err.value.message
    assert str(paths.user_config_file) in err.value.message or "config file" in err.value.message


def test_bad_env_value_names_the_variable(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    env["GPUBOX_TOP_INTERVAL"] = "fast"
    with pytest.raises(GpuboxError, match="GPUBOX_TOP_INTERVAL"):
        load_config({}, env, paths)


# Root reads a file whatever its permissions say, unless it runs without these capabilities.
AS_ROOT = os.geteuid() == 0
NO_DAC = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", "--inh-caps=-dac_override,-dac_read_search"]
BROKEN = ["dangling link", "link loop", "directory", "unreadable"]


def _break(path: Path, how: str) -> str:
    """Put at `path` a config file that is there but cannot be read; what gpubox should say of it."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if how == "dangling link":
        path.symlink_to(path.parent / "gone" / "config.toml")
        return f"a link to {os.path.realpath(path.parent / 'gone' / 'config.toml')}, which does not exist"
    if how == "link loop":
        path.symlink_to(path.name)
        return "cannot be read (a loop of symbolic links)"
    if how == "directory":
        path.mkdir()
        return "not a regular file (a directory)"
    path.write_text("color = false\n")
    path.chmod(0)
    return "cannot be read (Permission denied)"


@pytest.mark.parametrize("how", BROKEN)
@pytest.mark.parametrize("which", ["user", "system"])
def test_a_config_file_that_is_there_but_cannot_be_read_is_an_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str, how: str
) -> None:
    env, paths = _paths(tmp_path)
    path = paths.user_config_file if which == "user" else paths.system_config_file
    why = _break(path, how)
    if how == "unreadable" and AS_ROOT:
        _deny_reading(monkeypatch, path)
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    assert err.value.message == f"config file {path}: {why}"


def _deny_reading(monkeypatch: pytest.MonkeyPatch, path: Path) -> None:
    """As the kernel refuses a file without read permission to anyone but root."""
    real_open = Path.open

    def refusing_open(self: Path, *args: object, **kwargs: object) -> object:
        if self == path:
            raise PermissionError(errno.EACCES, "Permission denied", str(self))
        return real_open(self, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(Path, "open", refusing_open)


def test_only_nothing_at_the_path_means_the_defaults(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    assert not paths.user_config_file.parent.exists()  # no folder, no file: the defaults
    assert load_config({}, env, paths).sources["color"] == "default"
    (tmp_path / "etc").write_text("a file, where a folder would be")
    paths = paths.__class__(paths.config_dir, paths.state_dir, paths.runtime_dir, tmp_path / "etc" / "config.toml")
    assert load_config({}, env, paths).sources["color"] == "default"


def test_a_config_folder_this_user_may_not_enter_means_the_defaults(tmp_path: Path) -> None:
    """HOME=/root in a container run as another user, /etc/gpubox 0750: whether a file is there
    cannot be known, and none there could be this user's to read. The defaults, as before."""
    if AS_ROOT and not shutil.which("setpriv"):
        pytest.skip("root enters any folder, and there is no setpriv to drop that power")
    closed = tmp_path / "home" / ".config" / "gpubox"
    closed.mkdir(parents=True)
    (closed / "config.toml").write_text("color = maybe\n")  # it would be refused if it were read
    closed.chmod(0)
    try:
        result = _gpubox(tmp_path, "top", "--once", "--demo", unprivileged=True)
    finally:
        closed.chmod(0o700)
    assert (result.returncode, result.stderr) == (0, ""), result.stderr


def _gpubox(tmp_path: Path, *args: str, unprivileged: bool = False) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUBOX_", "XDG_"))}
    env.update(
        HOME=str(tmp_path / "home"),
        GPUBOX_STATE_DIR=str(tmp_path / "state"),
        GPUBOX_RUNTIME_DIR=str(tmp_path / "run"),
        GPUBOX_SYSTEM_CONFIG=str(tmp_path / "system.toml"),
    )
    prefix = NO_DAC if unprivileged and AS_ROOT else []
    return subprocess.run(
        [*prefix, sys.executable, "-m", "gpubox", *args],
        env=env,
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        timeout=60,
    )


def _refused(result: subprocess.CompletedProcess[str], path: Path, why: str) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode == ExitCode.USAGE, (result.returncode, result.stderr)
    assert result.stderr == f"gpubox: config file {path}: {why}\n"


@pytest.mark.parametrize("how", BROKEN)
@pytest.mark.parametrize("which", ["user", "system"])
def test_the_cli_refuses_a_config_file_it_cannot_read(tmp_path: Path, which: str, how: str) -> None:
    path = tmp_path / ("home/.config/gpubox/config.toml" if which == "user" else "system.toml")
    if how == "unreadable" and AS_ROOT and not shutil.which("setpriv"):
        pytest.skip("root reads files without permission, and there is no setpriv to drop that power")
    why = _break(path, how)
    _refused(_gpubox(tmp_path, "top", "--once", "--demo", unprivileged=how == "unreadable"), path, why)


@pytest.mark.parametrize(
    "args",
    [("queue", "add", "--", "true"), ("daemon",), ("report",), ("metrics", "dump", "--demo"), ("doctor",)],
    ids=" ".join,
)
def test_every_command_that_loads_settings_refuses_an_unreadable_config(tmp_path: Path, args: tuple[str, ...]) -> None:
    """`queue add` and `daemon` alone run without Typer; a queue command checks the settings before
    it starts a daemon that would only die on them, and stores nothing."""
    path = tmp_path / "system.toml"
    why = _break(path, "dangling link")
    try:
        _refused(_gpubox(tmp_path, *args), path, why)
        assert not (tmp_path / "state" / "daemon.log").exists()  # no daemon was started
    finally:
        _gpubox(tmp_path, "daemon", "stop")  # a daemon started by mistake must not outlive the test
    path.unlink()
    listed = _gpubox(tmp_path, "queue", "ls", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout)["data"]["jobs"] == []


@pytest.mark.parametrize("raw", ["", " "])
@pytest.mark.parametrize("key", ["color", "queue.preempt", "top.loader_sampling"])
def test_an_empty_true_or_false_setting_is_refused_not_read_as_false(tmp_path: Path, key: str, raw: str) -> None:
    """As an empty number is: `GPUBOX_QUEUE_BACKFILL=` is a value left out, not a choice."""
    env, paths = _paths(tmp_path)
    env[f"GPUBOX_{key.upper().replace('.', '_')}"] = raw
    with pytest.raises(GpuboxError, match=f"{key}: expected true or false") as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    del env[f"GPUBOX_{key.upper().replace('.', '_')}"]
    paths.user_config_file.parent.mkdir(parents=True)
    section, _, name = key.rpartition(".")
    paths.user_config_file.write_text((f"[{section}]\n" if section else "") + f'{name} = "{raw}"\n')
    with pytest.raises(GpuboxError, match=f"{key}: expected true or false"):
        load_config({}, env, paths)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("[" + ".".join(["a"] * 5000) + "]\nx = 1\n", "unknown setting 'a.a'"),  # tables in tables
        ("x = " + "{a = " * 3000 + "1" + "}" * 3000 + "\n", "config file {path}: values nested too deeply"),
        ("x = " + "[" * 3000 + "]" * 3000 + "\n", "config file {path}: values nested too deeply"),
    ],
    ids=["tables", "inline tables", "arrays"],
)
def test_a_deeply_nested_config_is_one_line_not_a_traceback(tmp_path: Path, text: str, why: str) -> None:
    path = tmp_path / "home/.config/gpubox/config.toml"
    path.parent.mkdir(parents=True)
    path.write_text(text)
    result = _gpubox(tmp_path, "top", "--once", "--demo")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr.count("\n") == 1 and why.format(path=path) in result.stderr, result.stderr


def test_a_config_file_far_too_large_to_be_one_is_refused_unread(tmp_path: Path) -> None:
    """A log or a dump named as the config by mistake: refused, not read whole into memory."""
    env, paths = _paths(tmp_path)
    with paths.system_config_file.open("w") as fh:
        fh.write("color = false\n" + "#" * (2 << 20) + "\n")
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    why = "larger than 1 MiB, too large to be a config file"
    assert err.value.message == f"config file {paths.system_config_file}: {why}"
    paths.system_config_file.write_text("color = false\n" + "#" * 1000 + "\n")  # a long comment is fine
    assert load_config({}, env, paths).get("color") is False


@pytest.mark.parametrize(
    ("text", "suggestion"),
    [
        ("[top]\nintervl = 1\n", "unknown setting 'top.intervl' (did you mean 'top.interval'?)"),
        ("[doctor]\ndata_warn_mbps = 1\n", "(did you mean 'doctor.data_warn_MBps'?)"),
        ("[queue]\nzzz = 1\n", "unknown setting 'queue.zzz'"),
    ],
)
def test_an_unknown_setting_names_the_one_it_is_close_to(tmp_path: Path, text: str, suggestion: str) -> None:
    env, paths = _paths(tmp_path)
    paths.system_config_file.write_text(text)
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert suggestion in err.value.message
    if "did you mean" not in suggestion:
        assert "did you mean" not in err.value.message


@pytest.mark.parametrize("key", ["doctor.transfer_warn_fraction", "doctor.mem_available_warn_fraction"])
def test_a_doctor_share_is_a_fraction_not_a_percentage(tmp_path: Path, key: str) -> None:
    """70 meant as 70% would make every copy warn; top.loader_wait_threshold refuses it too."""
    env, paths = _paths(tmp_path)
    env[f"GPUBOX_{key.upper().replace('.', '_')}"] = "70"
    with pytest.raises(GpuboxError, match=f"{key}: must be a fraction from 0 to 1") as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    env[f"GPUBOX_{key.upper().replace('.', '_')}"] = "0.35"
    assert load_config({}, env, paths).get(key) == 0.35


def test_settings_that_contradict_each_other_are_refused_naming_both(tmp_path: Path) -> None:
    env, paths = _paths(tmp_path)
    paths.system_config_file.write_text("[ledger]\nretention_days = 30\n")
    env["GPUBOX_LEDGER_MINUTE_RETENTION_DAYS"] = "60"
    with pytest.raises(GpuboxError) as err:
        load_config({}, env, paths)
    assert err.value.code == ExitCode.USAGE
    assert err.value.message == (
        "environment variable GPUBOX_LEDGER_MINUTE_RETENTION_DAYS: ledger.minute_retention_days (60) is above"
        f" ledger.retention_days (30, from {paths.system_config_file})"
    )
    del env["GPUBOX_LEDGER_MINUTE_RETENTION_DAYS"]
    env["GPUBOX_DOCTOR_TRANSFER_FAIL_FRACTION"] = "0.8"  # a copy at 75% would fail and never warn
    with pytest.raises(GpuboxError, match=r"transfer_fail_fraction \(0.8\) is above .*\(0.7, the default\)"):
        load_config({}, env, paths)


def test_a_default_gives_way_to_the_setting_it_would_contradict(tmp_path: Path) -> None:
    """Hours kept 30 days: minutes (35 by default) are kept as long, and the config says so."""
    env, paths = _paths(tmp_path)
    env["GPUBOX_LEDGER_RETENTION_DAYS"] = "30"
    env["GPUBOX_DOCTOR_TRANSFER_WARN_FRACTION"] = "0.3"
    cfg = load_config({}, env, paths)
    assert cfg.get("ledger.minute_retention_days") == 30
    assert cfg.sources["ledger.minute_retention_days"] == "environment variable GPUBOX_LEDGER_RETENTION_DAYS"
    assert cfg.get("doctor.transfer_fail_fraction") == 0.3
