"""Settings, layered: flags, then GPUBOX_* environment variables, then the user's TOML, then
the system TOML, then defaults. Unknown keys and bad values are errors that name their source."""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpubox.doctor.thresholds import DEFAULTS as _DOCTOR_DEFAULTS
from gpubox.exit_codes import ExitCode, GpuboxError
from gpubox.paths import Paths, resolve_paths

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any


def _parse_bool(raw: object) -> bool:
    if isinstance(raw, bool):
        return raw
    text = str(raw).strip().lower()
    if text in {"1", "true", "yes", "on"}:
        return True
    if text in {"0", "false", "no", "off"}:
        return False
    # Empty is refused, as for numbers: `GPUBOX_QUEUE_PREEMPT=` is a value left out, not "false".
    raise ValueError(f"expected true or false, got {raw!r}")


def _number(raw: object, what: str) -> float:
    """A number from TOML or the environment; TOML's true/false is not one."""
    if isinstance(raw, bool):
        raise ValueError(f"expected {what}, got {raw!r}")
    try:
        return float(raw)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        raise ValueError(f"expected {what}, got {raw!r}") from None


def _parse_interval(raw: object) -> float:
    value = _number(raw, "seconds")
    if not 0.05 <= value <= 3600:
        raise ValueError(f"must be between 0.05 and 3600 seconds, got {raw!r}")
    return value


def _parse_loader_window(raw: object) -> int:
    value = _number(raw, "whole seconds")
    # The probe keeps per-second buckets for the last 16 seconds, so the window is whole seconds.
    if not value.is_integer() or not 1 <= value <= 15:
        raise ValueError(f"must be whole seconds from 1 to 15, got {raw!r}")
    return int(value)


def _parse_fraction(raw: object) -> float:
    value = _number(raw, "a fraction")
    if not 0 <= value <= 1:
        raise ValueError(f"must be a fraction from 0 to 1 (0.2 is 20%), got {raw!r}")
    return value


def _parse_count(raw: object) -> int:
    value = _number(raw, "a whole number")
    if not value.is_integer() or not 0 <= value <= 1024:
        raise ValueError(f"must be a whole number from 0 to 1024, got {raw!r}")
    return int(value)


def _parse_seconds(raw: object) -> float:
    value = _number(raw, "seconds")
    if not 0 < value <= 86400:
        raise ValueError(f"must be more than 0 and at most 86400 seconds, got {raw!r}")
    return value


def _parse_days(raw: object) -> int:
    value = _number(raw, "whole days")
    if not value.is_integer() or not 1 <= value <= 36500:
        raise ValueError(f"must be whole days from 1 to 36500, got {raw!r}")
    return int(value)


def _parse_threshold(raw: object) -> float:
    value = _number(raw, "a number")
    if not 0 <= value < float("inf"):  # NaN fails too
        raise ValueError(f"must be a number, 0 or more, got {raw!r}")
    return value


# A price above a billion per GPU-hour or kWh is a typo; past it, a year's costs overflow to infinity.
MAX_PRICE = 1e9


def _parse_price(raw: object) -> float:
    value = _number(raw, "a price")
    if not 0 <= value <= MAX_PRICE:  # NaN fails too
        raise ValueError(f"must be a price from 0 to 1000000000, got {raw!r}")
    return value


_KINDS = ("infer", "quantize", "train", "batch", "other")  # gpubox.queue.jobs.KINDS (a test checks they agree)


def _parse_kind_order(raw: object) -> tuple[str, ...]:
    items = raw if isinstance(raw, list) else str(raw).split(",")
    order = tuple(str(k).strip().lower() for k in items if str(k).strip())
    if sorted(order) != sorted(_KINDS):
        raise ValueError(f"must name each of {', '.join(_KINDS)} once, most urgent first, got {raw!r}")
    return order


# key -> (parser, default). A key "top.interval" is `[top] interval = ...` in TOML and GPUBOX_TOP_INTERVAL
# in the environment (env_name).
SCHEMA: dict[str, tuple[Callable[[object], Any], Any]] = {
    "top.interval": (_parse_interval, 1.0),
    "top.loader_window": (_parse_loader_window, 10),  # seconds of loader wait averaged
    "top.loader_wait_threshold": (_parse_fraction, 0.2),  # above it, the loader wait cell is coloured
    "top.loader_sampling": (_parse_bool, True),  # sample the stacks of GPU processes that run no probe
    "color": (_parse_bool, True),
    "queue.default_gpus": (_parse_count, 1),  # GPUs a job asks for when it does not say, on a box with GPUs
    "queue.max_cpu_jobs": (_parse_count, 1),  # CPU-only jobs (--gpus 0) running at once
    "queue.kind_order": (_parse_kind_order, _KINDS),  # between equal priorities, which kind goes first
    "queue.backfill": (_parse_bool, True),  # a short job may start ahead when it cannot delay a waiting one
    "queue.preempt": (_parse_bool, False),  # stop batch jobs to make room for waiting infer jobs
    "queue.kill_grace": (_parse_seconds, 10.0),  # seconds between SIGTERM and SIGKILL when a job is stopped
    "queue.poll_interval": (_parse_seconds, 2.0),  # how often the daemon looks again at GPUs and jobs
    "ledger.interval": (_parse_interval, 5.0),  # seconds between the daemon's samples of GPU use
    "ledger.retention_days": (_parse_days, 400),  # days of GPU use kept (per hour)
    "ledger.minute_retention_days": (_parse_days, 35),  # days of it kept per minute
    "report.gpu_hour_price": (_parse_price, None),  # price of one GPU-hour, for costs in reports
    "report.kwh_price": (_parse_price, None),  # price of one kWh, optional
    # The doctor's thresholds, from gpubox/doctor/thresholds.py (docs/doctor.md gives their sources).
    # A share is 0 to 1, as top.loader_wait_threshold: 70 meant as 70% would make every check warn.
    **{
        key: (_parse_fraction if key.endswith("_fraction") else _parse_threshold, default)
        for key, default in _DOCTOR_DEFAULTS.items()
    },
}


def env_name(key: str) -> str:
    return "GPUBOX_" + key.upper().replace(".", "_")


@dataclass(frozen=True)
class Config:
    values: Mapping[str, Any]
    sources: Mapping[str, str] = field(default_factory=dict)

    def get(self, key: str) -> Any:
        return self.values[key]


def _flatten(doc: Mapping[str, Any]) -> dict[str, Any]:
    """`[top] interval = 1` as {"top.interval": 1}. No setting is deeper than a table, so a deeper
    table stays whole, under its name, and is refused as an unknown setting (unbounded recursion
    into `[a.a.a.….a]` would fail with a traceback)."""
    flat: dict[str, Any] = {}
    for key, value in doc.items():
        if isinstance(value, dict):
            flat.update({f"{key}.{sub}": inner for sub, inner in value.items()})
        else:
            flat[key] = value
    return flat


# A config file is a few dozen lines; one far larger is not one (a log named by mistake, say),
# and reading it whole would cost memory many times its size.
MAX_CONFIG_BYTES = 1 << 20


def _read_toml(path: Path) -> dict[str, Any]:
    """The settings in a TOML file; none when nothing at all is at `path`. Anything else there
    that cannot be read is an error: its settings must not be dropped without a word."""
    try:
        st = path.stat()
    except FileNotFoundError:
        if path.is_symlink():
            target = os.path.realpath(path)
            raise GpuboxError(f"config file {path}: a link to {target}, which does not exist", ExitCode.USAGE) from None
        return {}
    except NotADirectoryError:
        return {}  # a parent is a file: nothing can be at the path
    except PermissionError:
        # A folder on the way that this user may not enter (HOME=/root in a container run as
        # another user, /etc/gpubox 0750): nothing there can be its, or be read by it.
        return {}
    except OSError as exc:
        raise GpuboxError(f"config file {path}: {_unreadable(exc)}", ExitCode.USAGE) from None
    if not stat.S_ISREG(st.st_mode):  # a directory, a FIFO or /dev/zero would fail or hang
        what = " (a directory)" if stat.S_ISDIR(st.st_mode) else ""
        raise GpuboxError(f"config file {path}: not a regular file{what}", ExitCode.USAGE)
    import tomllib  # here: most runs find no config file, and the first job of a cold queue waits for this import

    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_CONFIG_BYTES + 1)
        if len(data) > MAX_CONFIG_BYTES:
            raise GpuboxError(f"config file {path}: larger than 1 MiB, too large to be a config file", ExitCode.USAGE)
        return _flatten(tomllib.loads(data.decode()))
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise GpuboxError(f"config file {path}: {exc}", ExitCode.USAGE) from exc
    except RecursionError:  # tomllib parses nested arrays and inline tables by recursion
        raise GpuboxError(f"config file {path}: values nested too deeply", ExitCode.USAGE) from None
    except OSError as exc:
        raise GpuboxError(f"config file {path}: {_unreadable(exc)}", ExitCode.USAGE) from None


def _unreadable(exc: OSError) -> str:
    why = "a loop of symbolic links" if exc.errno == errno.ELOOP else exc.strerror or str(exc)
    return f"cannot be read ({why})"


def _apply(layer: Mapping[str, Any], source: str, values: dict[str, Any], sources: dict[str, str]) -> None:
    for key, raw in layer.items():
        if key not in SCHEMA:
            raise GpuboxError(f"{source}: unknown setting {key!r}{_did_you_mean(key)}", ExitCode.USAGE)
        parser = SCHEMA[key][0]
        try:
            values[key] = parser(raw)
        except (TypeError, ValueError) as exc:
            raise GpuboxError(f"{source}: {key}: {exc}", ExitCode.USAGE) from exc
        sources[key] = source


def _did_you_mean(key: str) -> str:
    """The known setting `key` is most likely a misspelling of, if any; case aside, as TOML keys
    are case-sensitive and `doctor.data_warn_MBps` is easy to write in lower case."""
    import difflib

    by_lower = {known.lower(): known for known in SCHEMA}
    close = difflib.get_close_matches(key.lower(), by_lower, n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close else ""


def load_config(
    flags: Mapping[str, Any] | None = None,
    env: Mapping[str, str] | None = None,
    paths: Paths | None = None,
) -> Config:
    env = os.environ if env is None else env
    paths = paths or resolve_paths(env)
    values = {key: default for key, (_, default) in SCHEMA.items()}
    sources = {key: "default" for key in SCHEMA}
    _apply(_read_toml(paths.system_config_file), str(paths.system_config_file), values, sources)
    _apply(_read_toml(paths.user_config_file), str(paths.user_config_file), values, sources)
    env_layer = {key: env[env_name(key)] for key in SCHEMA if env_name(key) in env}
    for key, raw in env_layer.items():
        _apply({key: raw}, f"environment variable {env_name(key)}", values, sources)
    # NO_COLOR (no-color.org) is an environment setting: it beats the TOML files, not GPUBOX_COLOR.
    if env.get("NO_COLOR") and env_name("color") not in env:
        values["color"], sources["color"] = False, "NO_COLOR"
    _apply({k: v for k, v in (flags or {}).items() if v is not None}, "command line", values, sources)
    _check_together(values, sources)
    return Config(values, sources)


# (lower, upper): settings set by the user that the other must not be below. A default that the
# user's other setting passes gives way instead (ledger.retention_days = 30 keeps minutes 30 days).
_ORDERED = (
    ("doctor.transfer_fail_fraction", "doctor.transfer_warn_fraction"),  # else a copy fails, never warns
    ("ledger.minute_retention_days", "ledger.retention_days"),  # minutes cannot outlive their hours
)


def _check_together(values: dict[str, Any], sources: dict[str, str]) -> None:
    """Refuse two settings that contradict each other, naming where each came from, rather than
    let one quietly override the other."""
    for low, high in _ORDERED:
        if values[low] <= values[high]:
            continue
        if sources[low] == "default":
            values[low], sources[low] = values[high], sources[high]
            continue
        where = "the default" if sources[high] == "default" else f"from {sources[high]}"
        raise GpuboxError(
            f"{sources[low]}: {low} ({values[low]:g}) is above {high} ({values[high]:g}, {where})", ExitCode.USAGE
        )
