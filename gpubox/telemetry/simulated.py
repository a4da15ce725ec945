"""A simulated box for `gpubox top --demo`, the TUI tests and benchmarks.

Figures are a pure function of (seed, refresh number), not of the wall clock, so a test that
takes N samples always sees the same values.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from gpubox.telemetry.model import BoxSnapshot, GpuId, GpuSnapshot, HostSnapshot, ProcessSnapshot, Reason

GIB = 1024**3

_COMMANDS = (
    ("alice", "python train.py --model llama-8b --bs 16"),
    ("bob", "python -m vllm.entrypoints.openai.api_server --model mistral-7b"),
    ("carol", "python quantize.py --bits 4 --model llama-70b"),
    ("dave", "torchrun --nproc-per-node 2 finetune.py"),
    ("erin", "python batch_infer.py --input s3://bucket/shard-0042"),
    ("frank", "python eval.py --suite mmlu"),
)


@dataclass(frozen=True)
class _SimGpu:
    name: str
    mem_total: int
    gpm: bool
    power_limit_w: float
    link_gen_max: int


_MODELS = (
    _SimGpu("NVIDIA H100 80GB HBM3", 80 * GIB, True, 700.0, 5),
    _SimGpu("NVIDIA A100-SXM4-80GB", 80 * GIB, False, 400.0, 4),
    _SimGpu("NVIDIA GeForce RTX 4090", 24 * GIB, False, 450.0, 4),
)


_STARVING = 0  # the process (by creation order) whose loader cannot keep its GPU fed
# The processes (by creation order) that the gpubox queue started, with their job's kind; the
# others, the inference server among them, were started by hand.
_JOBS = {0: "train", 2: "quantize", 3: "train", 4: "batch"}
_FIRST_JOB_ID = 12


def _loader_figures(n: int, tick: int) -> dict[str, Any]:
    """Trainers run the probe (the first one starves for data, the others barely wait), the
    evaluation jobs are stack-sampled, and nothing measures the rest."""
    swing = math.sin(tick / 3 + n)
    kind = n % len(_COMMANDS)
    if kind in (0, 3):  # train.py, finetune.py
        wait = 0.6 + 0.05 * swing if n == _STARVING else 0.04 + 0.02 * swing
        return {
            "loader_wait": round(wait, 3),
            "loader_wait_source": "probe",
            "batches_per_s": round(24 * (1 - wait), 1),
        }
    if kind == 5:  # eval.py
        return {
            "loader_wait": round(0.12 + 0.04 * swing, 3),
            "loader_wait_source": "sampled",
            "loader_wait_samples": 20,
        }
    return {"reasons": {"loader_wait": Reason.NOT_MEASURED.value}}


class SimulatedBackend:
    name = "simulated"

    def __init__(
        self,
        gpus: int = 4,
        processes: int = 12,
        seed: int = 7,
        clock: Callable[[], float] = time.time,
    ) -> None:
        if not 1 <= gpus <= 64:
            raise ValueError("a simulated box has 1 to 64 GPUs")
        self._rng = random.Random(seed)
        self._clock = clock
        self._tick = 0
        self._energy: list[int] = []  # per GPU, mJ
        self._energy_tick: dict[int, int] = {}
        self._gpus = [_MODELS[0] if i < max(1, gpus - 1) else _MODELS[1 + i % 2] for i in range(gpus)]
        self._phase = [self._rng.uniform(0, math.tau) for _ in range(gpus)]
        # (pid, GPU index, user, command, GPU memory, (job id, kind) or None)
        self._procs: list[tuple[int, int, str, str, float, tuple[int, str] | None]] = []
        self.signals: list[tuple[int, int]] = []  # what send_signal was asked to do, for tests
        for n in range(processes):
            user, cmd = _COMMANDS[n % len(_COMMANDS)]
            job = (_FIRST_JOB_ID + n, _JOBS[n]) if n in _JOBS else None
            self._procs.append((10_000 + 17 * n, n % gpus, user, cmd, self._rng.uniform(0.5, 12) * GIB, job))

    def gpus(self) -> tuple[GpuId, ...]:
        return tuple(GpuId(i, _uuid(i)) for i in range(len(self._gpus)))

    def sample(self) -> BoxSnapshot:
        tick = self._tick
        self._tick += 1
        now = self._clock()
        gpus = tuple(self._gpu(i, tick) for i in range(len(self._gpus)))
        procs = tuple(self._proc(n, tick, now) for n in range(len(self._procs)))
        host = HostSnapshot(
            hostname="demo-box",
            cpu_percent=round(35 + 30 * math.sin(tick / 9), 1),
            cpu_count=64,
            load_1m=round(20 + 10 * math.sin(tick / 13), 2),
            mem_total_bytes=512 * GIB,
            mem_used_bytes=int((200 + 40 * math.sin(tick / 17)) * GIB),
            driver_version="550.54.15",
            cuda_driver_version="12.4",
            nvml_version="12.550.54.15",
        )
        return BoxSnapshot(now, self.name, host, gpus, procs)

    def _energy_mj(self, i: int, tick: int, power_w: float) -> int:
        """The energy counter: each refresh counts as one second at its power, so the counter is a
        function of the refresh number like every other figure."""
        while len(self._energy) <= i:
            self._energy.append(5_000_000_000 + 1_000_000 * len(self._energy))
        if self._energy_tick.get(i) != tick:
            self._energy[i] += round(power_w * 1000)
            self._energy_tick[i] = tick
        return self._energy[i]

    def _wave(self, i: int, tick: int, period: float) -> float:
        return 0.5 + 0.5 * math.sin(tick / period + self._phase[i])

    def _gpu(self, i: int, tick: int) -> GpuSnapshot:
        model = self._gpus[i]
        busy = round(40 + 58 * self._wave(i, tick, 5), 1)
        if any(n == _STARVING and p[1] == i for n, p in enumerate(self._procs)):
            busy = round(18 + 20 * self._wave(i, tick, 5), 1)  # its trainer waits for data
        used = sum(p[4] for p in self._procs if p[1] == i)
        reasons: dict[str, str] = {}
        sm_active = sm_occ = None
        if model.gpm and tick > 0:
            sm_active = round(busy * 0.85, 1)
            sm_occ = round(sm_active * 0.45, 1)
        elif model.gpm:
            reasons["sm_active"] = reasons["sm_occupancy"] = Reason.WARMING_UP.value
        else:
            reasons["sm_active"] = reasons["sm_occupancy"] = Reason.NOT_SUPPORTED.value
        rx = tx = None
        if tick > 0:
            rx = round(2e9 + 20e9 * self._wave(i, tick, 3))
            tx = round(0.5e9 + 4e9 * self._wave(i, tick, 4))
        else:
            reasons["pcie_rx_Bps"] = reasons["pcie_tx_Bps"] = Reason.WARMING_UP.value
        throttled = ("sw_power_cap",) if busy > 90 else ()
        power = round(model.power_limit_w * (0.2 + 0.75 * busy / 100), 1)
        return GpuSnapshot(
            index=i,
            uuid=_uuid(i),
            name=model.name,
            pci_bus_id=f"00000000:{0x18 + 0x10 * i:02X}:00.0",
            gpu_busy=busy,
            mem_busy=round(busy * 0.6, 1),
            sm_active=sm_active,
            sm_occupancy=sm_occ,
            pcie_tx_Bps=tx,
            pcie_rx_Bps=rx,
            pcie_source="gpm" if model.gpm else "counters",
            pcie_link_gen=model.link_gen_max if busy > 5 else 1,  # as a real GPU: slowed only at rest
            pcie_link_gen_max=model.link_gen_max,
            pcie_link_width=16,
            pcie_link_width_max=16,
            mem_total_bytes=model.mem_total,
            mem_used_bytes=min(model.mem_total, int(used + 0.6 * GIB)),
            power_w=power,
            power_limit_w=model.power_limit_w,
            energy_mj=self._energy_mj(i, tick, power),
            temperature_c=round(35 + 40 * busy / 100),
            clock_sm_mhz=int(1980 * (0.5 + busy / 200)),
            clock_mem_mhz=2619,
            clock_event_reasons=throttled,
            reasons=reasons,
        )

    def _proc(self, n: int, tick: int, now: float) -> ProcessSnapshot:
        pid, gpu, user, cmd, mem, job = self._procs[n]
        wave = 0.5 + 0.5 * math.sin(tick / 4 + n)
        if n == _STARVING:
            wave *= 0.35
        return ProcessSnapshot(
            pid=pid,
            gpu_index=gpu,
            gpu_uuid=_uuid(gpu),
            kind="compute",
            user=user,
            command=cmd,
            sm_util=round(5 + 90 * wave, 1),
            gpu_mem_bytes=int(mem),
            cpu_percent=round(20 + 180 * (1 - wave), 1),
            rss_bytes=int(mem / 3),
            start_time=now - 3600 * (1 + n),
            job_id=None if job is None else job[0],
            job_kind=None if job is None else job[1],
            **_loader_figures(n, tick),
        )

    def send_signal(self, pid: int, sig: int, start_time: float | None) -> None:
        """A simulated process "exits" on any signal; no real process is ever signalled."""
        for n, proc in enumerate(self._procs):
            if proc[0] == pid:
                del self._procs[n]
                self.signals.append((pid, sig))
                return
        raise ProcessLookupError(f"pid {pid} has exited")

    def close(self) -> None:
        pass


def _uuid(gpu: int) -> str:
    return f"GPU-5e1a{gpu:04d}-0000-4000-8000-00000000{gpu:04d}"
