"""The doctor's thresholds, with their defaults; each one is a `doctor.*` setting in the config
file (docs/doctor.md gives the source of every default)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Thresholds:
    # Host
    shm_fail_mib: float = 256.0  # /dev/shm below this fails (a container's default is 64 MiB)
    shm_warn_mib_per_gpu: float = 1024.0  # below this per GPU (at least 1 GiB in all) warns
    cpus_per_gpu_warn: float = 4.0  # usable CPUs per GPU below this warns (loader workers starve)
    memlock_warn_mib: float = 64.0  # a finite memlock limit below this warns (RDMA, NCCL over IB)
    mem_available_warn_fraction: float = 0.1  # available memory below this share of the total warns
    # GPU health
    temperature_margin_c: float = 5.0  # within this of the slowdown temperature warns
    power_limit_warn_fraction: float = 0.9  # an enforced power limit below this share of the default warns
    ecc_corrected_warn: float = 1000.0  # corrected ECC errors since the driver loaded, above this warns
    pcie_replay_warn: float = 10.0  # PCIe replays during the benchmarks above this warns
    # Transfers, against the link's theoretical bandwidth
    transfer_warn_fraction: float = 0.7  # pinned copies below this share of the link warn
    transfer_fail_fraction: float = 0.4  # and below this share fail
    pageable_warn_ratio: float = 0.5  # pageable copies below this share of pinned warn
    d2d_warn_fraction: float = 0.5  # copies within GPU memory below this share of its bandwidth warn
    matmul_warn_fraction: float = 0.4  # a bf16 matmul below this share of the GPU's peak warns
    # Data and loader
    data_warn_MBps: float = 200.0  # cold reads of the dataset below this (MB/s) warn
    loader_rate_ratio: float = 1.1  # the loader is input-bound below this times the step rate
    loader_wait_fraction: float = 0.1  # or when the step waits for data more than this share of the time


# config key (doctor.<field>) -> field; every field is a setting
CONFIG_KEYS: dict[str, str] = {f"doctor.{f.name}": f.name for f in dataclasses.fields(Thresholds)}
DEFAULTS: dict[str, float] = {key: getattr(Thresholds(), name) for key, name in CONFIG_KEYS.items()}


def thresholds_from(values: Mapping[str, Any]) -> Thresholds:
    """Thresholds from loaded settings (keys `doctor.*`); keys it does not know are ignored."""
    return Thresholds(**{name: float(values[key]) for key, name in CONFIG_KEYS.items() if key in values})
