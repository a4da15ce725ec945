#!/usr/bin/env bash
# Append one JSON snapshot of every GPU and GPU process to a daily log, for later questions
# like "who held GPU 3 at 2 a.m.?". Exit codes: 0 ok, 3 no driver (logged, not retried).
#
# crontab -e:
#   */5 * * * * /path/to/gpubox/examples/cron/gpu-snapshot.sh
set -euo pipefail
log_dir="${GPUBOX_SNAPSHOT_DIR:-${XDG_STATE_HOME:-$HOME/.local/state}/gpubox/snapshots}"
mkdir -p "$log_dir"
# cron's PATH is short: find gpubox where pip --user or a venv put it.
gpubox="${GPUBOX:-$(command -v gpubox || echo "$HOME/.local/bin/gpubox")}"
# One line per snapshot (jq -c), so the log is easy to grep and to load with jq -s.
"$gpubox" top --once --json --interval 1 | jq -c . >> "$log_dir/$(date +%F).jsonl"
