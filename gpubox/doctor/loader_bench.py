"""Measure a training job's DataLoader in the job's own interpreter, which may not have gpubox:
this file is run as a script and needs only the standard library and torch.

    PYTHON loader_bench.py MODULE:FACTORY --budget SECONDS --device auto|cpu|cuda:N
                           [--full] [--max-workers N] [--path DIR]

FACTORY() returns a DataLoader, a (loader, step) pair or {"loader": ..., "step": ...}; step(batch)
takes a batch already on the device. For the factory's own loader, then for loaders rebuilt with
other num_workers, pin_memory, prefetch_factor and persistent_workers, it measures batches per
second of the loader alone, with the copy to the device, and of the whole pipeline with the time
blocked in next(); and the step's rate alone. It prints one JSON object on stdout: the raw
measurements, or {"ok": false, "error": {...}} with one sentence. What the user's code prints goes
to stderr.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import FrameType
from typing import IO, Any

VERSION = 1
MIN_SHARE_S = 0.8  # a setting measured for less than this is noise
MAX_SHARE_S = {"quick": 4.0, "full": 12.0}
MAX_BATCHES = {"quick": 1000, "full": 5000}  # per phase: a fast loader need not fill its time
MAX_STEP_CALLS = 20_000
CLOSE_RESERVE_S = 0.5  # kept back at the end for shutting workers down
GPU_PHASES = {"loader": 0.3, "copy": 0.25, "pipeline": 0.45}  # shares of a setting's time
CPU_PHASES = {"loader": 0.4, "copy": 0.0, "pipeline": 0.6}
USAGE_KINDS = ("spec", "not_found", "not_callable", "device", "torch_missing")


class BenchError(Exception):
    """The run cannot go on: `message` is one sentence, `exception` the cause in one line."""

    def __init__(self, kind: str, message: str, exc: BaseException | None = None) -> None:
        super().__init__(message)
        self.kind, self.message = kind, message
        self.exception = error_line(exc) if exc is not None else None


class OutOfTime(BaseException):
    """Raised by the alarm. Not an Exception: the user's `except Exception` must not swallow it."""

    def __init__(self, what: str) -> None:
        super().__init__(what)
        self.what = what  # "setting" or "budget"


def error_line(exc: BaseException) -> str:
    """One line for an exception: its type and the first line of its message, as in
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB ...". torch's CUDA errors
    go on for lines of advice after the words that matter, so the message's last line is the wrong one."""
    kind = type(exc)
    name = (
        kind.__qualname__ if kind.__module__ in ("builtins", "__main__") else f"{kind.__module__}.{kind.__qualname__}"
    )
    try:
        text = str(exc)
    except Exception:  # an exception whose own message fails: its type is what is left
        text = ""
    # a DataLoader worker's error carries the worker's traceback: its own exception line names the cause
    cause = raised_in(text)
    if cause is not None:
        return cause
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    return f"{name}: {first}" if first else name


def raised_in(text: str) -> str | None:
    """The exception line of the last traceback in `text` ("ValueError: bad sample"), or None when
    it holds no traceback: the first line after the traceback's frames, which are all indented."""
    lines = text.splitlines()
    heads = [i for i, line in enumerate(lines) if line.rstrip().endswith("Traceback (most recent call last):")]
    if not heads:
        return None
    for line in lines[heads[-1] + 1 :]:
        if line.strip() and not line[0].isspace():
            return line.strip()
    return None


class Clock:
    """The run's budget, and an alarm that interrupts a setting (or the run) that overstays."""

    def __init__(self, budget_s: float) -> None:
        self.start = time.perf_counter()
        self.end = self.start + budget_s
        self.hard_end = self.end + min(5.0, max(1.0, 0.1 * budget_s))
        self.what = "budget"
        signal.signal(signal.SIGALRM, self._ring)

    def _ring(self, signum: int, frame: FrameType | None) -> None:
        raise OutOfTime(self.what)

    def left(self) -> float:
        return self.end - time.perf_counter()

    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def limit(self, until: float | None = None) -> None:
        """Ring at `until` (a setting's hard end) or at the run's hard end, whichever is first."""
        at = self.hard_end if until is None else min(until, self.hard_end)
        self.what = "budget" if at >= self.hard_end else "setting"
        signal.setitimer(signal.ITIMER_REAL, max(at - time.perf_counter(), 0.001))

    def stop(self) -> None:
        signal.setitimer(signal.ITIMER_REAL, 0)


@dataclass(frozen=True)
class Setting:
    num_workers: int
    pin_memory: bool
    prefetch_factor: int | None  # None without workers
    persistent_workers: bool

    def as_json(self) -> dict[str, Any]:
        return {
            "num_workers": self.num_workers,
            "pin_memory": self.pin_memory,
            "prefetch_factor": self.prefetch_factor,
            "persistent_workers": self.persistent_workers,
        }


def swept(workers: int, gpu: bool, prefetch: int = 2) -> Setting:
    return Setting(workers, gpu, prefetch if workers else None, workers > 0)


def own_setting(loader: Any) -> Setting:
    workers = int(loader.num_workers)
    prefetch = loader.prefetch_factor if workers else None
    return Setting(workers, bool(loader.pin_memory), prefetch, bool(loader.persistent_workers) and workers > 0)


def worker_counts(max_workers: int, full: bool) -> list[int]:
    """0, then powers of two up to the limit, and the limit itself; --full adds 3, 6, 12, ..."""
    counts = {0, max_workers}
    n = 1
    while n < max_workers:
        counts.add(n)
        if full and n >= 2 and n * 3 // 2 < max_workers:
            counts.add(n * 3 // 2)
        n *= 2
    if not full and max_workers >= 4:
        counts.discard(1)
    return sorted(counts)


def second_round(best: Setting, gpu: bool, full: bool) -> list[Setting]:
    """Variations around the best setting of the first round."""
    if best.num_workers == 0:
        return []
    out = [replace(best, prefetch_factor=4)]
    if full:
        out += [replace(best, prefetch_factor=8), replace(best, persistent_workers=False)]
        if gpu:
            out.append(replace(best, pin_memory=False))
    return out


# ---------------------------------------------------------------- loading the user's factory


def load_factory(spec: str, path: str) -> Callable[[], Any]:
    module_name, sep, attr = spec.rpartition(":")
    if not sep or not module_name or not attr:
        raise BenchError("spec", f"expected MODULE:FACTORY (such as train.py:make or my.module:make), got {spec!r}")
    sys.path.insert(0, os.path.abspath(path))
    if module_name.endswith(".py") or os.sep in module_name:
        module = _import_file(module_name)
    else:
        module = _import_module(module_name)
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise BenchError("not_found", f"{module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise BenchError("not_callable", f"{spec} is not callable (it is a {type(target).__name__})")
    factory: Callable[[], Any] = target
    return factory


def _import_module(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise BenchError("not_found", f"no module named {name!r} on the Python path", exc) from None
        raise BenchError("import_raised", f"importing {name} raised an exception", exc) from None
    except Exception as exc:
        raise BenchError("import_raised", f"importing {name} raised an exception", exc) from None


def _import_file(file: str) -> Any:
    full = os.path.abspath(file)
    if not os.path.isfile(full):
        raise BenchError("not_found", f"there is no file {file}")
    directory, base = os.path.split(full)
    name = base[: -len(".py")]  # (str.removesuffix is 3.9+; training environments may be older)
    loaded = sys.modules.get(name)
    if loaded is not None and getattr(loaded, "__file__", None) != full:
        name = f"_gpubox_factory_{name}"  # do not shadow a module of the same name
    # its directory on the path: its own imports, and workers that re-import it by name
    sys.path.insert(0, directory)
    spec = importlib.util.spec_from_file_location(name, full)
    if spec is None or spec.loader is None:
        raise BenchError("not_found", f"{file} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise BenchError("import_raised", f"importing {file} raised an exception", exc) from None
    return module


def call_factory(factory: Callable[[], Any], spec: str, data_loader: type) -> tuple[Any, Callable[[Any], Any] | None]:
    try:
        result = factory()
    except (Exception, SystemExit) as exc:  # SystemExit: a factory that parses the command line
        raise BenchError("factory_raised", f"the factory {spec} raised an exception", exc) from None
    loader: Any = result
    step: Any = None
    if isinstance(result, Mapping) and "loader" in result:
        loader, step = result["loader"], result.get("step")
    elif isinstance(result, (tuple, list)) and len(result) == 2:
        loader, step = result
    if not isinstance(loader, data_loader) or (step is not None and not callable(step)):
        raise BenchError(
            "bad_return",
            f"the factory {spec} returned a {type(result).__name__}, not a DataLoader, "
            "a (loader, step) pair or a mapping with 'loader' and 'step'",
        )
    return loader, step


def rebuild_kwargs(loader: Any) -> dict[str, Any]:
    """What a DataLoader is made of besides the settings the sweep changes."""
    from torch.utils.data import IterableDataset

    kw: dict[str, Any] = {
        "dataset": loader.dataset,
        "collate_fn": loader.collate_fn,
        "timeout": loader.timeout,
        "worker_init_fn": loader.worker_init_fn,
        "generator": loader.generator,
    }
    if hasattr(loader, "in_order"):
        kw["in_order"] = loader.in_order
    if isinstance(loader.dataset, IterableDataset):
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last)
    elif loader.batch_size is not None:  # the sampler carries shuffle and its generator
        kw.update(batch_size=loader.batch_size, drop_last=loader.drop_last, sampler=loader.sampler)
    elif loader.batch_sampler is not None:  # its own batch sampler: batch_size must stay at its default
        kw.update(batch_sampler=loader.batch_sampler)
    else:
        kw.update(batch_size=None, sampler=loader.sampler)
    return kw


def build(kw: Mapping[str, Any], s: Setting, context: Any) -> Any:
    from torch.utils.data import DataLoader

    extra: dict[str, Any] = {}
    if s.num_workers:  # these options are errors without workers
        extra = {"prefetch_factor": s.prefetch_factor, "persistent_workers": s.persistent_workers}
        if context is not None:
            extra["multiprocessing_context"] = context
    return DataLoader(**kw, num_workers=s.num_workers, pin_memory=s.pin_memory, **extra)


# ---------------------------------------------------------------- measuring


class Feed:
    """A loader's batches across epochs: a new iterator when one ends, as training does."""

    def __init__(self, loader: Any) -> None:
        self.loader, self.epochs = loader, 0
        self.it: Any = None

    def next(self) -> Any:
        for _ in range(2):
            if self.it is None:
                self.it, self.epochs = iter(self.loader), self.epochs + 1
                fresh = True
            else:
                fresh = False
            try:
                return next(self.it)
            except StopIteration:
                self.it = None
                if fresh:
                    break
        raise BenchError("empty", "the loader yields no batches (is the dataset empty, or smaller than a batch?)")

    def close(self) -> None:
        it, self.it = self.it, None
        shutdown = getattr(it, "_shutdown_workers", None)
        if callable(shutdown):
            shutdown()
        if getattr(self.loader, "_iterator", None) is not None:  # a persistent loader keeps its iterator
            self.loader._iterator = None


class Fence:
    """Keeps the host at most one step ahead of the GPU, as a loop reading each step's loss does."""

    def __init__(self, torch: Any, device: Any) -> None:
        self.torch, self.device = torch, device
        self.cuda = device.type == "cuda"
        self.previous: Any = None

    def mark(self) -> None:
        if self.cuda:
            event = self.torch.cuda.Event()
            event.record()
            if self.previous is not None:
                self.previous.synchronize()
            self.previous = event

    def drain(self) -> None:
        if self.cuda:
            self.torch.cuda.synchronize(self.device)
            self.previous = None


def mover(torch: Any, device: Any, non_blocking: bool) -> Callable[[Any], Any]:
    """A function that puts a batch (tensors in lists, tuples, dicts, or anything with .to) on the device."""
    if device.type == "cpu":
        return lambda batch: batch

    def move(batch: Any) -> Any:
        if isinstance(batch, torch.Tensor):
            return batch.to(device, non_blocking=non_blocking)
        if isinstance(batch, Mapping):
            moved = {k: move(v) for k, v in batch.items()}
            kind: Any = type(batch)
            try:
                return kind(moved)
            except Exception:
                return moved
        if isinstance(batch, tuple) and hasattr(batch, "_fields"):
            return type(batch)(*(move(v) for v in batch))
        if isinstance(batch, (list, tuple)):
            items = [move(v) for v in batch]
            try:
                return type(batch)(items)
            except Exception:
                return items
        to = getattr(batch, "to", None)
        if callable(to) and not isinstance(batch, (str, bytes)):
            try:
                return to(device)
            except Exception:
                return batch
        return batch

    return move


def phase(
    feed: Feed, consume: Callable[[Any], Any], fence: Fence, seconds: float, max_batches: int, settle: int
) -> dict[str, Any]:
    """Batches through `consume` for `seconds` (at least one); the first `settle` are not counted."""
    begun = time.perf_counter()
    for _ in range(settle):  # reach a steady state: workers out of step, a full queue drained
        consume(feed.next())
        fence.mark()
        if time.perf_counter() - begun > 0.4 * seconds:
            break
    fence.drain()
    start = time.perf_counter()
    waited, batches = 0.0, 0
    while True:
        before = time.perf_counter()
        batch = feed.next()
        after = time.perf_counter()
        waited += after - before
        consume(batch)
        fence.mark()
        batches += 1
        if batches >= max_batches or after - begun >= seconds:
            break
    fence.drain()
    took = time.perf_counter() - start
    return {
        "batches": batches,
        "seconds": round(took, 6),
        "rate": round(batches / took, 6) if took > 0 else None,
        "wait_s": round(waited, 6),
        "wait_fraction": round(min(waited / took, 1.0), 6) if took > 0 else None,
    }


@dataclass
class Bench:
    """Everything one run needs, and the report it fills in as it goes."""

    torch: Any
    device: Any
    clock: Clock
    mode: str
    step: Callable[[Any], Any] | None
    report: dict[str, Any]
    kept: Any = None  # one batch, on the device, for timing the step alone

    @property
    def gpu(self) -> bool:
        return bool(self.device.type == "cuda")

    def measure(self, loader: Any, s: Setting, share: float, warm_step: bool) -> tuple[dict[str, Any], bool]:
        """One setting's record, and whether the run's time is up."""
        record: dict[str, Any] = {**s.as_json(), "own": warm_step, "share_s": round(share, 3)}
        record.update(startup_s=None, epochs=0, loader=None, copy=None, pipeline=None, complete=False, error=None)
        fractions = GPU_PHASES if self.gpu else CPU_PHASES
        move = mover(self.torch, self.device, non_blocking=s.pin_memory and self.gpu)
        fence = Fence(self.torch, self.device)
        feed = Feed(loader)
        started = time.perf_counter()
        out_of_time = False
        doing = "waiting for the first batch"
        self.clock.limit(started + 2 * share + 2.0)
        try:
            first = feed.next()
            record["startup_s"] = round(time.perf_counter() - started, 6)
            # the rest of the workers' first round arrives at once: not a rate
            settle = max(0, s.num_workers - 1)
            if warm_step:
                self.kept = move(first)
                if self.step is not None:
                    doing = "calling the step for the first time"
                    self.clock.limit()  # compiling or autotuning may take long: only the budget bounds it
                    self._warm_step()
                    self.clock.limit(time.perf_counter() + 2 * share + 2.0)
                    settle += s.num_workers * (s.prefetch_factor or 0) + 1  # the queue filled meanwhile
            cap = MAX_BATCHES[self.mode]
            doing = "measuring the loader alone"
            record["loader"] = phase(feed, _drop, fence, share * fractions["loader"], cap, settle)
            if self.gpu:
                doing = "measuring the copy to the GPU"
                record["copy"] = phase(feed, move, fence, share * fractions["copy"], cap, 0)
            doing = "measuring the pipeline"
            consume = move if self.step is None else _then(move, self.step)
            record["pipeline"] = phase(feed, consume, fence, share * fractions["pipeline"], cap, s.num_workers)
            record["complete"] = True
        except OutOfTime as exc:
            out_of_time = exc.what == "budget"
            limit = "the time budget" if out_of_time else "twice its share of time"
            record["error"] = f"ran out of {limit} while {doing}"
        except _StepFailed as exc:
            cause = exc.__cause__ or exc
            if warm_step:  # the factory's own step fails: nothing else is worth measuring
                raise BenchError("step_raised", "the step raised an exception", cause) from None
            record["error"] = f"the step raised: {error_line(cause)}"
        except BenchError:
            raise
        except Exception as exc:
            if warm_step:
                raise BenchError("loader_raised", "the factory's loader raised an exception", exc) from None
            record["error"] = error_line(exc)
        finally:
            record["epochs"] = feed.epochs
            self.clock.limit()
            feed.close()
        return record, out_of_time

    def _warm_step(self) -> None:
        """The step's first call (compilation, autotuning), timed apart from its rate."""
        if self.step is None:
            return
        fence = Fence(self.torch, self.device)
        t = time.perf_counter()
        _call_step(self.step, self.kept)
        fence.drain()
        self.report["step"]["first_call_s"] = round(time.perf_counter() - t, 6)

    def time_step(self, seconds: float) -> None:
        """The step's rate alone, on a batch already on the device, with no loader running."""
        if self.step is None or self.kept is None:
            return
        fence = Fence(self.torch, self.device)
        cap = MAX_STEP_CALLS
        self.clock.limit(time.perf_counter() + 2 * seconds + 2.0)
        start = time.perf_counter()
        calls = 0
        try:
            while calls < cap and (calls == 0 or time.perf_counter() - start < seconds):
                _call_step(self.step, self.kept)
                fence.mark()
                calls += 1
            fence.drain()
        except _StepFailed as exc:
            raise BenchError("step_raised", "the step raised", exc.__cause__ or exc) from None
        except OutOfTime as exc:
            if exc.what == "budget":
                raise
        finally:
            self.clock.limit()
        took = time.perf_counter() - start
        self.report["step"].update(calls=calls, seconds=round(took, 6), rate=round(calls / took, 6) if calls else None)


class _StepFailed(Exception):
    pass


def _call_step(step: Callable[[Any], Any], batch: Any) -> None:
    try:
        step(batch)
    except Exception as exc:
        raise _StepFailed() from exc


def _drop(batch: Any) -> None:
    return None


def _then(move: Callable[[Any], Any], step: Callable[[Any], Any]) -> Callable[[Any], Any]:
    return lambda batch: _call_step(step, move(batch))


# ---------------------------------------------------------------- the run


def choose_device(torch: Any, asked: str) -> tuple[Any, dict[str, Any]]:
    visible = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        no_gpu = "this torch is built without CUDA"
    else:
        no_gpu = "torch.cuda.is_available() is False: no GPU is visible to this torch"
    if asked == "auto":
        asked_cuda = visible > 0
        index, reason = 0, (f"auto: {visible} GPU(s) visible to torch, using the first" if visible else no_gpu)
    elif asked == "cpu":
        asked_cuda, index, reason = False, 0, "--device cpu was asked for"
    else:
        kind, _, number = asked.partition(":")
        if kind != "cuda" or not ((number or "0").isascii() and (number or "0").isdigit()):
            raise BenchError("device", f"--device expects auto, cpu or cuda:N, got {asked!r}")
        asked_cuda, index, reason = True, int(number or "0"), f"--device {asked} was asked for"
        if not visible:
            raise BenchError("device", f"--device {asked}: {no_gpu}")
        if index >= visible:
            raise BenchError("device", f"--device {asked}: torch sees {visible} GPU(s), numbered from 0")
    if asked_cuda:
        torch.cuda.set_device(index)  # so that the factory's .cuda() lands on the same GPU
        device = torch.device("cuda", index)
        name = torch.cuda.get_device_name(index)
    else:
        device, name = torch.device("cpu"), None
    return device, {"name": str(device), "kind": device.type, "asked": asked, "gpu_name": name, "reason": reason}


def usable_cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def _length(thing: Any) -> int | None:
    try:
        return len(thing)
    except Exception:
        return None


def describe(loader: Any, own: Setting, data_loader: type, iterable: bool) -> dict[str, Any]:
    return {
        "loader_class": type(loader).__name__,
        "dataset_class": type(loader.dataset).__name__,
        "dataset_len": None if iterable else _length(loader.dataset),
        "batches_per_epoch": None if iterable else _length(loader),
        "batch_size": loader.batch_size,
        "iterable_dataset": iterable,
        "own": own.as_json(),
    }


def step_seconds(budget: float, full: bool) -> float:
    return min(max((0.06 if full else 0.08) * budget, 0.3), 5.0 if full else 2.0)


def first_round(own: Setting, max_workers: int, gpu: bool, full: bool) -> list[Setting]:
    """The factory's own setting, no workers, then from the most workers down: when time runs
    short the last ones, the fewest workers, are the ones left out."""
    counts = worker_counts(max_workers, full)
    order = [own, swept(0, gpu)] + [swept(w, gpu) for w in reversed(counts) if w]
    return [s for i, s in enumerate(order) if s not in order[:i]]


def sweep(bench: Bench, loader: Any, own: Setting, max_workers: int, full: bool) -> None:
    report, clock = bench.report, bench.clock
    try:
        kw: dict[str, Any] | None = rebuild_kwargs(loader)
        context = loader.multiprocessing_context
        queue = first_round(own, max_workers, bench.gpu, full)
    except Exception as exc:
        kw, context, queue = None, None, [own]
        report["notes"].append(
            f"the loader could not be rebuilt ({error_line(exc)}): only its own setting was measured"
        )
    tried: set[Setting] = set()
    second_planned = kw is None
    step_s = step_seconds(float(report["budget_s"]), full)
    while queue:
        first = not tried
        left = clock.left() - CLOSE_RESERVE_S - (step_s if first and bench.step else 0.0)
        if not first and left < MIN_SHARE_S:
            report["not_tried"] += [{**s.as_json(), "reason": "budget"} for s in queue]
            break
        pending = len(queue) + (0 if second_planned else (4 if full else 1))
        share = min(max(left / pending, MIN_SHARE_S), MAX_SHARE_S[bench.mode])
        s = queue.pop(0)
        tried.add(s)
        try:
            candidate = loader if first else build(kw or {}, s, context)
        except Exception as exc:
            report["settings"].append({**s.as_json(), "own": False, "error": f"cannot build: {error_line(exc)}"})
            continue
        record, out_of_time = bench.measure(candidate, s, share, warm_step=first)
        del candidate  # a rebuilt loader's workers go with it
        report["settings"].append(record)
        if first and not out_of_time:
            report["stage"] = "timing the step"
            bench.time_step(step_s)
            report["stage"] = "sweeping settings"
        if out_of_time:
            report["truncated"] = True
            report["not_tried"] += [{**q.as_json(), "reason": "budget"} for q in queue]
            break
        if not queue and not second_planned:
            second_planned = True
            best = best_so_far(report["settings"])
            queue = [v for v in second_round(best, bench.gpu, full) if v not in tried] if best else []


def best_so_far(records: list[dict[str, Any]]) -> Setting | None:
    done = [r for r in records if r.get("pipeline") and r["pipeline"]["rate"]]
    if not done:
        return None
    best = max(done, key=lambda r: r["pipeline"]["rate"])
    return Setting(best["num_workers"], best["pin_memory"], best["prefetch_factor"], best["persistent_workers"])


def run(args: argparse.Namespace, clock: Clock, report: dict[str, Any]) -> None:
    report["stage"] = "importing torch"
    try:
        import torch
        from torch.utils.data import DataLoader, IterableDataset
    except Exception as exc:
        if isinstance(exc, ModuleNotFoundError) and exc.name == "torch":
            raise BenchError("torch_missing", f"torch is not installed in {sys.executable}", exc) from None
        # anything else comes from inside torch (a missing libcudart, a broken dependency)
        message = f"torch is installed in {sys.executable} but cannot be imported"
        raise BenchError("torch_broken", message, exc) from None
    report["torch"] = torch.__version__
    device, report["device"] = choose_device(torch, args.device)
    report["stage"] = f"importing {args.target}"
    module_part = args.target.rpartition(":")[0]
    sys.argv = [module_part or args.target]  # a factory that parses the command line sees none
    factory = load_factory(args.target, args.path)
    report["stage"] = f"calling {args.target}"
    loader, step = call_factory(factory, args.target, DataLoader)
    iterable = isinstance(loader.dataset, IterableDataset)
    own = own_setting(loader)
    report["factory"].update(describe(loader, own, DataLoader, iterable))
    report["step"] = {"given": step is not None, "first_call_s": None, "calls": 0, "seconds": None, "rate": None}
    if type(loader) is not DataLoader:
        report["notes"].append(
            f"the loader is a {type(loader).__name__}: the other settings ran on a plain DataLoader "
            "rebuilt from its dataset, sampler and collate_fn"
        )
    if iterable:
        report["notes"].append(
            "the dataset is an IterableDataset: with workers, each yields the whole dataset unless it "
            "shards itself with torch.utils.data.get_worker_info()"
        )
    report["stage"] = "measuring the factory's own loader"
    bench = Bench(torch=torch, device=device, clock=clock, mode=report["mode"], step=step, report=report)
    sweep(bench, loader, own, report["cpus"]["max_workers"], args.full)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Measure a DataLoader and sweep its settings; prints JSON.")
    parser.add_argument("target", metavar="MODULE:FACTORY")
    parser.add_argument("--budget", type=float, default=20.0, help="seconds for the whole run")
    parser.add_argument("--device", default="auto", help="auto, cpu or cuda:N")
    parser.add_argument("--full", action="store_true", help="more settings, longer")
    parser.add_argument("--max-workers", type=int, default=None, help="try num_workers up to this")
    parser.add_argument("--path", default=".", help="a directory to put first on sys.path")
    return parser.parse_args(argv)


def private_stdout() -> IO[str]:
    """A private copy of stdout for the JSON; fd 1 itself (also in workers) now goes to stderr."""
    sys.stdout.flush()
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    return out


def abandon_workers() -> None:
    """Out of time: kill the workers of a loader that never got shut down, then leave."""
    try:
        for child in multiprocessing.active_children():
            child.kill()
    except BaseException:  # torch's SIGCHLD handler may complain about the workers it lost
        pass


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = private_stdout()
    clock = Clock(max(args.budget, 1.0))
    max_workers = args.max_workers if args.max_workers is not None else usable_cpus()
    report: dict[str, Any] = {
        "ok": True,
        "version": VERSION,
        "mode": "full" if args.full else "quick",
        "budget_s": args.budget,
        "python": sys.version.split()[0],
        "executable": sys.executable,
        "torch": None,
        "device": None,
        "cpus": {"usable": usable_cpus(), "max_workers": max(0, max_workers)},
        "factory": {"spec": args.target},
        "step": {"given": False},
        "settings": [],
        "not_tried": [],
        "notes": [],
        "truncated": False,
        "stage": "starting",
    }
    abandoned = False
    try:
        try:
            clock.limit()
            run(args, clock, report)
        finally:
            clock.stop()
    except BenchError as exc:
        report = failure(report, exc.kind, exc.message, exc.exception)
    except OutOfTime:
        abandoned = True
        if any(r.get("pipeline") for r in report["settings"]):
            report["truncated"] = True
            report["notes"].append("the time budget ran out before every setting was measured")
        else:
            message = f"the time budget of {args.budget:g} s ran out while {report['stage']}"
            report = failure(report, "budget", message, None)
    except Exception as exc:  # a fault of this script: still one JSON object, not a traceback
        report = failure(report, "internal", "the loader benchmark failed", exc)
    report["elapsed_s"] = round(clock.elapsed(), 3)
    if report["ok"]:
        report.pop("stage", None)
    out.write(json.dumps(report) + "\n")
    out.flush()
    if abandoned:
        abandon_workers()
        os._exit(0)
    return 0 if report["ok"] else 1


def failure(report: dict[str, Any], kind: str, message: str, exception: str | BaseException | None) -> dict[str, Any]:
    cause = error_line(exception) if isinstance(exception, BaseException) else exception
    keep = {k: report.get(k) for k in ("version", "mode", "budget_s", "python", "executable", "torch", "device")}
    error = {"kind": kind, "message": message, "exception": cause}
    broken = cause if kind == "torch_broken" else None
    return {"ok": False, **keep, "torch_missing": kind == "torch_missing", "torch_error": broken, "error": error}


if __name__ == "__main__":
    # the script's own folder holds gpubox's modules (model.py, loader.py, ...): keep them from
    # shadowing the user's modules of the same name
    here = os.path.dirname(os.path.realpath(__file__))
    if sys.path and os.path.realpath(sys.path[0] or os.curdir) == here:
        del sys.path[0]
    sys.exit(main())
