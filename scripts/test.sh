#!/usr/bin/env bash
# Run gpubox's test suite in a virtual environment that has everything the tests need.
#
#   bash scripts/test.sh              # the whole suite
#   bash scripts/test.sh -x -k top    # arguments go to pytest
#
# GPUBOX_VENV names the environment to create or reuse (default: .venv in the repository).
# Into it go gpubox with its dev extra and torch 2.13.0 (the dataloader tests run a real
# DataLoader on the CPU). The tests build a fake libnvidia-ml.so.1 with the C compiler `cc`,
# and run gpubox once in a real terminal with tmux.
set -euo pipefail
cd "$(dirname "$0")/.."

venv="${GPUBOX_VENV:-.venv}"
if [ ! -x "$venv/bin/python" ]; then
    echo "scripts/test.sh: creating $venv"
    python3 -m venv "$venv"
fi
"$venv/bin/python" -m pip install --quiet -e ".[dev]" "torch==2.13.0"
command -v cc >/dev/null || echo "scripts/test.sh: no C compiler (cc): the fake NVML tests cannot run" >&2
command -v tmux >/dev/null || echo "scripts/test.sh: no tmux: the real-terminal test cannot run" >&2

rc=0
"$venv/bin/python" -m pytest "$@" || rc=$?
if [ "$rc" = 5 ]; then
    echo "scripts/test.sh: pytest collected no tests" >&2
fi
exit "$rc"
