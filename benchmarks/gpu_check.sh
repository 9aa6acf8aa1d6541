#!/usr/bin/env bash
# Every GPU row of issue 35, as one script for a lent GPU machine (about 8 minutes on one H100, 9.7 at
# the parts' limits: each part has its own, so one that overruns leaves the others their turn), run
# from the repository root with the machine's own CUDA PyTorch:
#     ATTNLAB_DATA=DIR PYTHONPATH=. bash benchmarks/gpu_check.sh [OUT_DIR [RUNS_DIR]]
# (DIR holds tinyshakespeare/input.txt; without it part 4 is skipped). Each part's output is also
# kept in OUT_DIR/<part>.log; the runs it trains go to RUNS_DIR (default: OUT_DIR).
#   1. benchmarks/gpu_speed.py: greedy generation eager / compile=True / HuggingFace at batch 1 and
#      8, continuous batching against one request at a time (GPT-2 small, bf16);
#   2. benchmarks/gpu_speed.py: the GPT-2-small training step, loss compiled with the model against
#      a nanoGPT-shaped reference (loss in its forward);
#   3. attnlab train gpt --preset gpt2 end to end (vocabulary padded to nanoGPT's 50304): tokens/s;
#   4. benchmarks/speedrun_gpu.py: the speedrun preset's time to 1.47 on Tiny Shakespeare against
#      nanoGPT's 143 s (add --sweep there for the sweep that chose its recipe, about 2 minutes more);
#      then `sample --compile` of its run under TORCH_LOGS=recompiles.
set -uo pipefail
OUT=${1:-/tmp/attnlab-gpu}
RUNS=${2:-$OUT}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-.} PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}
part() { # part NAME SECONDS COMMAND...: run with a time limit, output to the screen and OUT/NAME.log
    local name=$1 limit=$2
    shift 2
    echo "== $name (at most ${limit} s)"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "-- $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
}
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, torch.cuda.get_device_name())"
part generate 240 $PY benchmarks/gpu_speed.py --only generate serve
part train 120 $PY benchmarks/gpu_speed.py --only train --no-before
R="$RUNS/gpt2"
part gpt2 75 $PY -m attnlab train gpt --preset gpt2 --vocab-multiple 50304 --batch-size 16 --max-iters 40 \
    --eval-interval 1000 --eval-iters 1 --log-interval 10 --compile --out "$R" --no-progress --sample-chars 0
$PY - "$R/metrics.jsonl" <<'EOF'
import json, sys
rows = [json.loads(line) for line in open(sys.argv[1]) if "items_per_s" in line]
for r in rows:
    print(f"attnlab train gpt --preset gpt2, step {r['step']}: {r['items_per_s']:,.0f} tokens/s")
EOF
if [ -f "${ATTNLAB_DATA:-/nonexistent}/tinyshakespeare/input.txt" ]; then
    part speedrun 100 $PY benchmarks/speedrun_gpu.py --out "$RUNS/speedrun"
    part sample 35 env TORCH_LOGS=recompiles $PY -m attnlab sample --ckpt "$RUNS/speedrun/timed" --prompt "ROMEO:" \
        --max-new-tokens 64 --temperature 0 --compile
    echo "recompiles logged: $(grep -c -i 'recompil' "$OUT/sample.log")"
else
    echo "== speedrun: skipped (no tinyshakespeare/input.txt under ATTNLAB_DATA)"
fi
