#!/usr/bin/env bash
# Queue tonight's evaluation: cron only submits, the queue runs it when a GPU is free, so a
# training run that holds the GPUs past midnight is not disturbed and the eval is not lost.
# It prints the job id (kept in the log) and exits 0 once queued; 2 on bad input.
# Settings: EVAL_PROJECT, EVAL_CMD, EVAL_PATH, EVAL_GPUS, EVAL_TIME_LIMIT, EVAL_TEAM, GPUBOX.
#
# crontab -e:
#   30 1 * * * /path/to/gpubox/examples/cron/nightly-eval.sh >> $HOME/nightly-eval.log 2>&1
set -euo pipefail
# cron's PATH is short: find gpubox where pip --user or a venv put it.
gpubox="${GPUBOX:-$(command -v gpubox || echo "$HOME/.local/bin/gpubox")}"
# The job runs with the environment it is queued with, cron's: put the folder of the Python
# (or tool) that runs the eval on its PATH, a venv's bin folder say.
export PATH="${EVAL_PATH:-$HOME/.local/bin}:$PATH"
project="${EVAL_PROJECT:-$HOME/project}"
eval_cmd="${EVAL_CMD:-python eval.py --checkpoint latest}"
# --shell: the command is one string, run by /bin/sh -c in $project with this environment.
# --time-limit: a stuck eval frees its GPU by morning; --tag: its GPU hours go to this team.
"$gpubox" queue add \
    --name "nightly-eval-$(date +%F)" \
    --kind infer \
    ${EVAL_GPUS:+--gpus "$EVAL_GPUS"} \
    --time-limit "${EVAL_TIME_LIMIT:-3h}" \
    --tag team="${EVAL_TEAM:-research}" \
    --cwd "$project" \
    --shell -- "$eval_cmd"
