#!/usr/bin/env bash
# Every GPU row (issues 35 and 51) as one script for a lent GPU machine, run from the repository
# root with the machine's own CUDA PyTorch:
#     PYTHONPATH=. bash benchmarks/gpu_check.sh [--smoke] [OUT_DIR [RUNS_DIR]]
# Each part has its own time limit (they sum to at most 480 s: a 600 s call keeps room to spare, and
# one part that overruns leaves the others their turn); each prints its rows ("row: ...") the moment
# they are measured, into the screen and OUT_DIR/<part>.log, so a part stopped at its limit keeps
# what it measured. At the end every row is printed again, together. The runs go to RUNS_DIR
# (default: OUT_DIR).
#   generate  benchmarks/gpu_speed.py: greedy generation eager / compile=True / HuggingFace at batch
#             1 and 8 (GPT-2 small, bf16), with the compiled step's graph, recompile and cudagraph
#             skip counts;
#   serve     continuous batching of 64 requests on 8 rows against one request at a time (the row
#             names the workload's ceiling);
#   trainer   Trainer.fit at GPT-2 small on a real 50,257-token vocabulary against nanoGPT's
#             train.py loop, both timed over 10 steps per synchronisation, with and without the
#             chunked loss;
#   speedrun  benchmarks/speedrun_gpu.py: the speedrun preset's time to 1.47 on Tiny Shakespeare
#             against nanoGPT's 143 s, from an empty compile cache (more seeds: --seeds 3 there);
#   sample    `sample --compile` of that run under TORCH_LOGS=recompiles (it prints its graph counts).
# The data (tinyshakespeare/input.txt) is found in ATTNLAB_DATA, else in ../shared/data or
# ./shared/data beside the repository. --smoke: every part at toy sizes on the CPU, to check that
# each prints its rows (a check of the script, not a measurement).
set -uo pipefail
SMOKE=()
if [ "${1:-}" = "--smoke" ]; then
    SMOKE=(--smoke)
    shift
fi
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${1:-/tmp/attnlab-gpu}
RUNS=${2:-$OUT}
mkdir -p "$OUT" "$RUNS"
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$ROOT} PYTHONWARNINGS=ignore
PY=${PYTHON:-python3}
if [ ! -f "${ATTNLAB_DATA:-/nonexistent}/tinyshakespeare/input.txt" ]; then
    for d in "$ROOT/../shared/data" "$ROOT/shared/data"; do
        if [ -f "$d/tinyshakespeare/input.txt" ]; then
            ATTNLAB_DATA=$(cd "$d" && pwd)
            export ATTNLAB_DATA
            break
        fi
    done
fi
# the parts and their limits in seconds, in the order they run
PARTS=(generate serve trainer speedrun sample)
declare -A LIMIT=([generate]=130 [serve]=60 [trainer]=170 [speedrun]=90 [sample]=30)
total=0
for p in "${PARTS[@]}"; do total=$((total + LIMIT[$p])); done
echo "parts: ${PARTS[*]}; their limits sum to ${total} s; data: ${ATTNLAB_DATA:-none found}"
part() { # part NAME COMMAND...: run within NAME's limit, output to the screen and OUT/NAME.log
    local name=$1 limit=${LIMIT[$1]}
    shift
    echo "== $name (at most ${limit} s)"
    local t0=$SECONDS
    timeout -k 5 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
    echo "-- $name: exit ${PIPESTATUS[0]} after $((SECONDS - t0)) s"
}
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
fi
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, \
torch.cuda.get_device_name() if torch.cuda.is_available() else 'no GPU')"
part generate $PY benchmarks/gpu_speed.py "${SMOKE[@]}" --only generate
part serve $PY benchmarks/gpu_speed.py "${SMOKE[@]}" --only serve
part trainer $PY benchmarks/gpu_speed.py "${SMOKE[@]}" --only trainer
if [ -n "${ATTNLAB_DATA:-}" ]; then
    part speedrun $PY benchmarks/speedrun_gpu.py "${SMOKE[@]}" --out "$RUNS/speedrun"
    part sample env TORCH_LOGS=recompiles $PY -m attnlab sample --ckpt "$RUNS/speedrun/timed" --prompt "ROMEO:" \
        --max-new-tokens 64 --temperature 0 --compile
    echo "recompiles logged: $(grep -i 'recompil' "$OUT/sample.log" | grep -v -c 'compiled decode step')"
else
    echo "== speedrun, sample: skipped (no tinyshakespeare/input.txt in ATTNLAB_DATA, ../shared/data or ./shared/data)"
fi
echo "== every row"
for p in "${PARTS[@]}"; do
    [ -f "$OUT/$p.log" ] && grep -h -E '^row: |^compiled decode step' "$OUT/$p.log" | sed "s/^/$p: /"
done
exit 0
