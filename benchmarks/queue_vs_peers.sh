#!/usr/bin/env bash
# gpubox queue against task-spooler and nq, side by side in one run: 1,000 jobs running `true`
# (each tool submitting its fastest way, first submission to last job finished), the median
# latency of one `gpubox queue add`, and the daemon's CPU while idle with 1,000 finished and
# 100 queued jobs. Installs the Debian packages task-spooler and nq when they are missing.
#
#   bash benchmarks/queue_vs_peers.sh [--jobs 1000] [--python .venv/bin/python]
set -euo pipefail
cd "$(dirname "$0")/.."
python=.venv/bin/python
args=()
while [ $# -gt 0 ]; do
    case "$1" in
        --python) python="$2"; shift 2 ;;
        *) args+=("$1"); shift ;;
    esac
done
if ! command -v tsp >/dev/null || ! command -v nq >/dev/null; then
    if [ "$(id -u)" = 0 ]; then
        apt-get install -y -qq task-spooler nq >/dev/null 2>&1 ||
            { apt-get update -qq >/dev/null && apt-get install -y -qq task-spooler nq >/dev/null; }
    else
        sudo apt-get install -y -qq task-spooler nq >/dev/null
    fi
fi
exec "$python" benchmarks/queue_vs_peers.py "${args[@]}"
