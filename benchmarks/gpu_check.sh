#!/usr/bin/env bash
# The CUDA checks of the robustness work, as one short script for a GPU machine (about 4 minutes):
# --dtype auto on CUDA, a diverging run stopped with its checkpoint kept, resume, and the bench rows.
#   bash benchmarks/gpu_check.sh [OUT_DIR]
set -uo pipefail
OUT=${1:-/tmp/attnlab-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'bf16', torch.cuda.is_bf16_supported())"
R="$OUT/run"; rm -rf "$R"
echo "== train gpt (shakespeare shape 6/6/384, embedded corpus), --dtype auto on CUDA"
$PY -m attnlab train gpt --preset shakespeare --max-iters 300 --eval-interval 150 --eval-iters 10 --batch-size 32 \
    --out "$R" --no-progress --sample-chars 0 2>&1 | grep -v "^step" ; echo "exit $?"
tail -n 1 "$R/metrics.jsonl"
echo "== diverging resume (--lr 1e9): must stop with the checkpoint untouched"
sha_before=$(sha256sum "$R/last/model.safetensors" | cut -c1-16)
$PY -m attnlab train gpt --out "$R" --resume --max-iters 400 --lr 1e9 --grad-clip 0 --no-progress --sample-chars 0 2>&1 | tail -n 1
echo "exit ${PIPESTATUS[0]}; checkpoint unchanged: $([ "$sha_before" = "$(sha256sum "$R/last/model.safetensors" | cut -c1-16)" ] && echo yes || echo NO)"
echo "== resume normally, then sample and eval on CUDA"
$PY -m attnlab train gpt --out "$R" --resume --max-iters 330 --no-progress --sample-chars 0 2>&1 | tail -n 1
$PY -m attnlab sample --ckpt "$R" --prompt "The " --max-new-tokens 60 --seed 1
$PY -m attnlab eval --ckpt "$R" --json
echo "== bench (CUDA rows)"
$PY -m attnlab bench --quick --only attention gpt --json "$OUT/bench.json" 2>&1 | tail -n 20
