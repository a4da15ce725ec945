import os
from pathlib import Path

import pytest

from gpubox.paths import ensure_private_dir, resolve_paths


def test_xdg_variables_are_used(tmp_path: Path) -> None:
    env = {
        "HOME": str(tmp_path),
        "XDG_CONFIG_HOME": str(tmp_path / "cfg"),
        "XDG_STATE_HOME": str(tmp_path / "state"),
        "XDG_RUNTIME_DIR": str(tmp_path / "run"),
    }
    p = resolve_paths(env, uid=1234)
    assert p.config_dir == tmp_path / "cfg" / "gpubox"
    assert p.user_config_file == tmp_path / "cfg" / "gpubox" / "config.toml"
    assert p.state_dir == tmp_path / "state" / "gpubox"
    assert p.runtime_dir == tmp_path / "run" / "gpubox"


def test_defaults_under_home_and_relative_xdg_ignored(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "XDG_STATE_HOME": "relative/state"}
    p = resolve_paths(env, uid=1234)
    assert p.config_dir == tmp_path / ".config" / "gpubox"
    assert p.state_dir == tmp_path / ".local" / "state" / "gpubox"


def test_runtime_fallback_is_the_same_with_and_without_a_login_environment(tmp_path: Path) -> None:
    """cron has no XDG_RUNTIME_DIR; it must still find the directory a login session uses."""
    uid = os.getuid()
    cron = resolve_paths({"HOME": str(tmp_path)}, uid=uid)
    run_user = Path(f"/run/user/{uid}")
    if run_user.is_dir():
        login = resolve_paths({"HOME": str(tmp_path), "XDG_RUNTIME_DIR": str(run_user)}, uid=uid)
        assert cron.runtime_dir == login.runtime_dir
    else:
        assert cron.runtime_dir == Path(f"/tmp/gpubox-{uid}")
    # A uid with no /run/user entry falls back to a private /tmp folder, never to a shared one.
    assert resolve_paths({"HOME": str(tmp_path)}, uid=4_000_000).runtime_dir == Path("/tmp/gpubox-4000000")


def test_overrides(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "GPUBOX_STATE_DIR": str(tmp_path / "s"), "GPUBOX_RUNTIME_DIR": str(tmp_path / "r")}
    p = resolve_paths(env, uid=1)
    assert (p.state_dir, p.runtime_dir) == (tmp_path / "s", tmp_path / "r")


def test_private_dir_is_0700_and_refuses_someone_elses(tmp_path: Path) -> None:
    d = ensure_private_dir(tmp_path / "a" / "b")
    assert d.stat().st_mode & 0o777 == 0o700
    if os.getuid() == 0:
        other = tmp_path / "other"
        other.mkdir()
        os.chown(other, 12345, 12345)
        with pytest.raises(PermissionError):
            ensure_private_dir(other)


@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775, 0o757])
def test_a_folder_others_may_write_to_is_refused_and_left_as_it_is(tmp_path: Path, mode: int) -> None:
    loose = tmp_path / "state"
    loose.mkdir()
    loose.chmod(mode)
    with pytest.raises(PermissionError, match=rf"writable by other users \(mode {mode:04o}\).*chmod go-w"):
        ensure_private_dir(loose)
    assert loose.stat().st_mode & 0o7777 == mode


@pytest.mark.parametrize("mode", [0o700, 0o755, 0o750, 0o711])
def test_a_folder_others_may_only_read_is_kept(tmp_path: Path, mode: int) -> None:
    """A $HOME or a runtime folder made by hand with a usual umask: the files in it are 0600."""
    kept = tmp_path / "state"
    kept.mkdir()
    kept.chmod(mode)
    assert ensure_private_dir(kept) == kept
    assert kept.stat().st_mode & 0o777 == mode


@pytest.mark.parametrize("under", ["", "sub/deeper"])
def test_a_file_where_a_folder_should_be_is_named(tmp_path: Path, under: str) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("")
    with pytest.raises(NotADirectoryError, match=rf"^\[Errno 20\] {blocker} is not a folder$"):
        ensure_private_dir(blocker / under if under else blocker)


@pytest.mark.parametrize("command", [["queue", "add", "--", "true"], ["queue", "ls"], ["daemon", "start"]])
def test_a_state_dir_that_is_a_file_is_one_line_naming_it(tmp_path: Path, command: list[str]) -> None:
    """GPUBOX_STATE_DIR=/dev/null (or any file) said only "File exists"."""
    from tests.helpers import run_gpubox

    for state in ("/dev/null", str(tmp_path / "a-file")):
        Path(tmp_path / "a-file").write_text("")
        out = run_gpubox(*command, env={"GPUBOX_STATE_DIR": state, "GPUBOX_RUNTIME_DIR": str(tmp_path / "run")})
        assert out.returncode == 1, out.stderr
        assert out.stderr.splitlines() == [out.stderr.strip()], out.stderr
        assert f"{state} is not a folder" in out.stderr, out.stderr
