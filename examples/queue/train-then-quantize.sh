#!/usr/bin/env bash
# Queue a training run and a quantization of its checkpoint that starts only if training
# succeeds; then wait for both. A failed training fails the quantize job (with the reason)
# instead of quantizing a bad checkpoint. Exit: the first failed job's own exit code, or 0.
#
#   examples/queue/train-then-quantize.sh            # with the defaults below
#   TRAIN_CMD="python train.py --epochs 3" QUANT_CMD="python quantize.py ckpt/" examples/queue/train-then-quantize.sh
set -euo pipefail
gpubox="${GPUBOX:-gpubox}"
train_cmd="${TRAIN_CMD:-python train.py}"
quant_cmd="${QUANT_CMD:-python quantize.py --bits 4 checkpoints/last}"

# TRAIN_GPUS and QUANT_GPU_MEM are optional: without them each job gets the box's default GPU.
train=$("$gpubox" queue add --name train --kind train ${TRAIN_GPUS:+--gpus "$TRAIN_GPUS"} \
    --retries 1 --tag team="${TEAM:-research}" --shell -- "$train_cmd")
quant=$("$gpubox" queue add --name quantize --kind quantize --after "$train" \
    ${QUANT_GPU_MEM:+--gpu-mem "$QUANT_GPU_MEM"} --tag team="${TEAM:-research}" --shell -- "$quant_cmd")
echo "queued: train $train, quantize $quant (after $train)"
"$gpubox" queue wait "$train" "$quant"
