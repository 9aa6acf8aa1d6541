#!/usr/bin/env bash
# Every GPU row, as one script for a lent GPU machine (about 7 minutes on one H100), run from the
# repository root with the machine's own CUDA PyTorch:  PYTHONPATH=. bash benchmarks/gpu_check.sh [OUT_DIR]
#   1. benchmarks/gpu_speed.py: the GPT-2-small training step (loss outside / inside the compiled
#      graph / a nanoGPT-shaped reference), greedy generation eager / compile=True / HuggingFace at
#      batch 1 and 8, continuous batching against one request at a time;
#   2. attnlab train gpt --preset gpt2 end to end (compiled by default on CUDA): tokens/s from its log;
#   3. the robustness checks: --dtype auto on CUDA, a diverging resume stopped with its checkpoint kept.
set -uo pipefail
OUT=${1:-/tmp/attnlab-gpu}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.}
PY=${PYTHON:-python3}
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), 'bf16', torch.cuda.is_bf16_supported())"
echo "== 1. training step, generation, serving (benchmarks/gpu_speed.py)"
(cd benchmarks && timeout 300 $PY gpu_speed.py 2>&1 | grep -v -i warn)
echo "== 2. attnlab train gpt --preset gpt2 (embedded corpus, char-level, batch 16 x 1024), 60 steps"
R="$OUT/gpt2"; rm -rf "$R"
timeout 150 $PY -m attnlab train gpt --preset gpt2 --batch-size 16 --max-iters 60 --eval-interval 60 --eval-iters 2 \
    --log-interval 20 --out "$R" --no-progress --sample-chars 0 2>&1 | grep -E "compile|dtype|tokens|note" | head -5
$PY -c "import json,sys; r=[json.loads(l) for l in open('$R/metrics.jsonl') if 'items_per_s' in l]; print('attnlab train gpt --preset gpt2: %.0f tokens/s (steps 21-60)' % r[-1]['items_per_s'])"
echo "== 3. robustness on CUDA: --dtype auto, a diverging resume keeps its checkpoint"
R="$OUT/run"; rm -rf "$R"
$PY -m attnlab train gpt --preset shakespeare --max-iters 100 --eval-interval 50 --eval-iters 5 --batch-size 32 \
    --out "$R" --no-progress --sample-chars 0 2>&1 | grep -E "dtype|compile" | head -3
sha_before=$(sha256sum "$R/last/model.safetensors" | cut -c1-16)
$PY -m attnlab train gpt --out "$R" --resume --max-iters 150 --lr 1e9 --grad-clip 0 --no-progress --sample-chars 0 2>&1 | tail -n 1
echo "exit ${PIPESTATUS[0]}; checkpoint unchanged: $([ "$sha_before" = "$(sha256sum "$R/last/model.safetensors" | cut -c1-16)" ] && echo yes || echo NO)"
$PY -m attnlab sample --ckpt "$R" --prompt "The " --max-new-tokens 60 --seed 1 --compile --temperature 0
