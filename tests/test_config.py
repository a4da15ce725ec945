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
