"""The doctor's thresholds, with their defaults; each one is a `doctor.*` setting in the config
file (docs/doctor.md gives the source of every default)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass

TYPE_CHECKING = False  # typing's import (4 ms) is not needed at run time
if TYPE_CHECKING:
    from typing import Any


def _setting(default: float, help: str) -> Any:
    """A threshold with its one-line help (the man page and docs/doctor.md say it)."""
    return dataclasses.field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Thresholds:
    # Host
    shm_fail_mib: float = _setting(
        256.0, "/dev/shm size or free space below this many MiB fails (a container's default is 64 MiB)."
    )
    shm_warn_mib_per_gpu: float = _setting(
        1024.0, "/dev/shm below this many MiB per GPU (at least 1 GiB in all) warns."
    )
    cpus_per_gpu_warn: float = _setting(4.0, "Usable CPUs per GPU below this warns (loader workers starve).")
    memlock_warn_mib: float = _setting(
        64.0, "A finite memlock limit below this many MiB warns where RDMA devices exist."
    )
    mem_available_warn_fraction: float = _setting(0.1, "Available memory below this share of the total warns.")
    # GPU health
    temperature_margin_c: float = _setting(5.0, "A GPU within this many degrees C of its slowdown temperature warns.")
    power_limit_warn_fraction: float = _setting(0.9, "An enforced power limit below this share of the default warns.")
    ecc_corrected_warn: float = _setting(1000.0, "Corrected ECC errors since the driver loaded, above this warns.")
    pcie_replay_warn: float = _setting(10.0, "PCIe replays during the benchmarks above this warns.")
    # Transfers, against the link's theoretical bandwidth
    transfer_warn_fraction: float = _setting(0.7, "Pinned copies below this share of the link warn.")
    transfer_fail_fraction: float = _setting(
        0.4, "Pinned copies below this share of the link fail (at most transfer_warn_fraction)."
    )
    d2d_warn_fraction: float = _setting(0.5, "Copies within GPU memory below this share of its bandwidth warn.")
    matmul_warn_fraction: float = _setting(0.4, "A bf16 matmul below this share of the GPU's peak warns.")
    # Data and loader
    data_warn_MBps: float = _setting(200.0, "Cold reads of the dataset below this (MB/s) warn.")
    loader_rate_ratio: float = _setting(1.1, "The loader is input-bound below this times the step rate.")
    loader_wait_fraction: float = _setting(
        0.1, "The loader is input-bound when the step waits for data more than this share of the time."
    )


# config key (doctor.<field>) -> field; every field is a setting
CONFIG_KEYS: dict[str, str] = {f"doctor.{f.name}": f.name for f in dataclasses.fields(Thresholds)}
DEFAULTS: dict[str, float] = {key: getattr(Thresholds(), name) for key, name in CONFIG_KEYS.items()}
HELP: dict[str, str] = {f"doctor.{f.name}": f.metadata["help"] for f in dataclasses.fields(Thresholds)}


def thresholds_from(values: Mapping[str, Any]) -> Thresholds:
    """Thresholds from loaded settings (keys `doctor.*`); keys it does not know are ignored."""
    return Thresholds(**{name: float(values[key]) for key, name in CONFIG_KEYS.items() if key in values})
