#!/usr/bin/env bash
# Checks that need a real NVIDIA GPU. Runs in under 8 minutes; prints a short report.
# Needs: an NVIDIA driver, torch with CUDA and nvidia-ml-py importable by $PYTHON (default python3).
# gpubox's other dependencies come from the index, or from ./wheels when that folder exists.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}

echo "== gpubox gpu-check $(date -u +%Y-%m-%dT%H:%M:%SZ)"
nvidia-smi --query-gpu=index,name,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv,noheader 2>/dev/null || echo "(no nvidia-smi)"

# Checked before anything is installed: on a machine without a GPU this says so and stops.
if ! "$PYTHON" -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)" 2>/dev/null; then
    echo "gpu-check: needs torch with CUDA and a GPU it can use, importable by $PYTHON (set PYTHON=...)" >&2
    exit 1
fi
"$PYTHON" -c "import torch; print('torch', torch.__version__, 'CUDA', torch.version.cuda)"

if ! "$PYTHON" -c "import gpubox, textual, typer" 2>/dev/null; then
    if [ -d wheels ]; then
        "$PYTHON" -m pip install -q --no-index --find-links wheels -e . 2>&1 | tail -2
    else
        "$PYTHON" -m pip install -q -e . 2>&1 | tail -2
    fi
fi

echo "== top --once (table)"
timeout 60 "$PYTHON" -m gpubox top --once --no-color
status=0
echo "== top --once --json under load"
timeout 240 "$PYTHON" scripts/gpu_check.py || status=1
echo "== loader_wait: a slow and a fast DataLoader feeding a CUDA training loop"
timeout 180 "$PYTHON" scripts/gpu_check_loader.py || status=1
echo "== queue: two 1-GPU jobs get their own GPU (or run in turn), a CPU-only job sees none"
timeout 300 "$PYTHON" scripts/gpu_check_queue.py || status=1
echo "== ledger: a busy queue job in the report and the exporter"
timeout 180 "$PYTHON" scripts/gpu_check_ledger.py || status=1
echo "== doctor: copy benchmarks against a plain CUDA-event loop; the loader benchmark on the GPU"
timeout 420 "$PYTHON" scripts/gpu_check_doctor.py || status=1
exit $status
