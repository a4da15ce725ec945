"""`gpubox doctor`: check the box, measure the paths data takes to the GPU, say what to change.
Thin: parse, call gpubox.doctor, render (rich) or print the JSON envelope."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Annotated

import typer
from typer.models import TyperPath

from gpubox.cli.output import console, print_json, print_json_failure
from gpubox.exit_codes import ExitCode, GpuboxError

if TYPE_CHECKING:
    from gpubox.doctor.findings import DoctorReport
    from gpubox.doctor.thresholds import Thresholds

app = typer.Typer(
    invoke_without_command=True,
    rich_markup_mode=None,
)

JSON = Annotated[bool, typer.Option("--json", help="Print one JSON document (schema 1) instead of text.")]
FULL = Annotated[
    bool, typer.Option("--full/--quick", help="--quick (default): a short run; --full: more repetitions and settings.")
]
PYTHON = Annotated[
    str | None,
    typer.Option("--python", metavar="PATH", help="Benchmark with this interpreter (your training environment's)."),
]
NO_COLOR = Annotated[bool, typer.Option("--no-color", help="No colour, even on a terminal.")]
# Path-typed for the shell completions, but kept as typed: a Path would make '' the current directory
_DATASET = TyperPath()


@app.callback()
def doctor(
    ctx: typer.Context,
    full: FULL = False,
    as_json: JSON = False,
    python: PYTHON = None,
    data: Annotated[
        str | None,
        typer.Option(
            "--data", metavar="PATH", click_type=_DATASET, help="Also measure reads of this dataset (a file or folder)."
        ),
    ] = None,
    only: Annotated[
        str | None,
        typer.Option(
            "--only",
            metavar="GROUPS",
            help="Only these groups: driver, gpu, pcie, host, data, transfer (comma-separated).",
        ),
    ] = None,
    gpu: Annotated[
        str | None,
        typer.Option(
            "--gpu", "-g", metavar="GPUS", help="Benchmark these GPUs, as 0,2 (default: --quick the first, --full all)."
        ),
    ] = None,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="List the checks that passed too (a run of over 40 checks lists only the others without it).",
        ),
    ] = False,
    no_color: NO_COLOR = False,
) -> None:
    """Check the box and its data pipeline; say what to change first.

    Checks the driver, the GPUs, the PCIe links and the host, benchmarks copies to the GPU, and
    turns what was measured into findings ranked by impact, each with its evidence and its fix.

    Checks: the driver and torch's CUDA build; persistence, ECC, row remapping, clock throttling
    under load, power limit and temperature of each GPU; each PCIe link under load against its
    maximum, and whether the slot or the GPU limits it; /dev/shm, usable CPUs, NUMA placement,
    CPU governor, memlock, memory and environment variables of the host; with --data, cold and
    warm reads of a dataset and its filesystem. Benchmarks (torch, in the interpreter --python
    names): host-to-device and device-to-host copies, pinned and pageable, against the link's
    theoretical bandwidth, and copies within GPU memory; with --full also a matmul, on every GPU.

    Thresholds are doctor.* settings in the config file (docs/doctor.md). Exit codes: 0 nothing
    failed, 5 a check failed, 3 no GPU found when GPU groups were asked for with --only, 2 bad
    input.
    """
    if ctx.invoked_subcommand is not None:
        return
    from gpubox.doctor.examine import DoctorOptions, examine

    try:
        options = DoctorOptions.parse(mode="full" if full else "quick", python=python, data=data, only=only, gpus=gpu)
        report, code = examine(options, _thresholds())
    except GpuboxError as exc:
        if as_json:
            print_json_failure("doctor", exc.code, [exc.message])
        raise
    _emit(report, code, as_json, no_color, verbose)


@app.command("loader")
def loader(
    target: Annotated[
        str,
        typer.Argument(
            metavar="MODULE:FACTORY",
            help="A function that returns a DataLoader, or (loader, step): module.name:make or path/file.py:make.",
            show_default=False,
        ),
    ],
    full: FULL = False,
    as_json: JSON = False,
    python: PYTHON = None,
    device: Annotated[
        str, typer.Option("--device", metavar="DEVICE", help="auto (a GPU when there is one), cpu, or cuda:N.")
    ] = "auto",
    max_workers: Annotated[
        int | None,
        typer.Option(
            "--max-workers", metavar="N", help="Try num_workers up to N (default: usable CPUs; at most 4 a CPU, or 16)."
        ),
    ] = None,
    budget: Annotated[
        float | None,
        typer.Option("--budget", metavar="SECONDS", help="Time for the whole sweep (default: 20 --quick, 90 --full)."),
    ] = None,
    no_color: NO_COLOR = False,
) -> None:
    """Measure a DataLoader: its batches per second alone, with the copy to the GPU, against the
    step's rate; sweep num_workers, pin_memory, prefetch_factor and persistent_workers within a
    time budget; say whether the job is input-bound, the best setting found, and the most that
    fixing the input can speed it up (1/(1-f), f the share of time the step waits for data).

    FACTORY() returns a DataLoader, a (loader, step) pair, or {"loader": ..., "step": ...};
    step(batch) gets a batch already on the device. Without a GPU it runs on the CPU and says so.
    """
    from gpubox.doctor.loader import LoaderOptions, examine_loader

    try:
        options = LoaderOptions.parse(
            target,
            mode="full" if full else "quick",
            python=python,
            device=device,
            max_workers=max_workers,
            budget_s=budget,
        )
        report, code = examine_loader(options, _thresholds())
    except GpuboxError as exc:
        if as_json:
            print_json_failure("doctor loader", exc.code, [exc.message])
        raise
    _emit(report, code, as_json, no_color, verbose=True)


def _thresholds() -> Thresholds:
    from gpubox.cli.settings import load_settings
    from gpubox.doctor.thresholds import thresholds_from

    return thresholds_from(load_settings().values)


def _emit(report: DoctorReport, code: ExitCode, as_json: bool, no_color: bool, verbose: bool) -> None:
    # Exit 3 is an error: say why on stderr (the envelope's errors), as every command does.
    from gpubox.doctor.findings import NO_GPU_NOTE

    errors = [n for n in report.notes if n.startswith(NO_GPU_NOTE)] if code == ExitCode.NO_GPU else []
    if as_json:
        print_json(report.command, report, code, errors or None)
    else:
        from gpubox.cli.doctor_view import render
        from gpubox.cli.settings import load_settings

        color = False if no_color else bool(load_settings().get("color"))
        render(report, console(color), verbose)
        if errors:
            from gpubox.format import one_line

            sys.stdout.flush()
            sys.stderr.write(f"gpubox: {one_line(errors[0])}\n")
    raise typer.Exit(int(code))
