#!/bin/bash
# attnlab on a SLURM cluster: one torchrun agent per node (srun), one process per GPU (torchrun),
# meeting through a c10d rendezvous on the first node. Submit with: sbatch examples/slurm.sh
#SBATCH --job-name=attnlab
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1          # one torchrun agent per node
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=04:00:00
#SBATCH --requeue                    # a preempted job starts again and resumes from last/
set -euo pipefail

head_node=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export OMP_NUM_THREADS=$((SLURM_CPUS_PER_TASK / SLURM_GPUS_PER_NODE))
OUT=${OUT:-runs/big}
# --resume when the run folder already holds a checkpoint (a requeued job); a fresh run otherwise
RESUME=$([ -f "$OUT/last/config.json" ] && echo --resume || true)

srun torchrun \
    --nnodes="$SLURM_NNODES" \
    --nproc_per_node="$SLURM_GPUS_PER_NODE" \
    --rdzv-backend=c10d \
    --rdzv-endpoint="$head_node:29500" \
    --rdzv-id="$SLURM_JOB_ID" \
    --max-restarts=3 \
    -m attnlab train gpt --preset gpt2 --data corpus/ --fsdp --out "$OUT" $RESUME
