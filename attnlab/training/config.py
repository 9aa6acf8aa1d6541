"""The trainer's options: one dataclass, every field an ``attnlab train`` flag (``--max-iters``) and a
keyword of :func:`attnlab.train`, its type, bound, default and help declared once, in its annotation."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from ..config import Config
from ..options import (
    Arg,
    device_name,
    nonneg_float,
    nonneg_int,
    positive_float,
    positive_int,
    probability,
    seed_value,
    unit_interval,
)


@dataclass
class TrainConfig(Config):
    max_iters: Annotated[int, Arg("optimizer steps to train for", positive_int)] = 2000
    batch_size: Annotated[int, Arg("examples (sequences, images, sentence pairs) per micro-batch", positive_int)] = 12
    grad_accum: Annotated[
        int, Arg("micro-batches whose gradients are summed into one optimizer step", positive_int)
    ] = 1
    lr: Annotated[float, Arg("peak learning rate (AdamW's; Muon has its own, --muon-lr)", positive_float)] = 1e-3
    min_lr: Annotated[float | None, Arg("learning rate at the end of the decay (unset: lr / 10)", nonneg_float)] = (
        None  # (at most lr: checked below)
    )
    warmup_iters: Annotated[int, Arg("steps of linear warm-up from 0 to lr", nonneg_int)] = 100
    lr_decay_iters: Annotated[
        int | None, Arg("the step where the decay reaches min_lr (unset: --max-iters)", positive_int)
    ] = None
    schedule: Annotated[
        Literal["cosine", "trapezoid"],
        Arg(
            "learning-rate schedule after the warmup: cosine (nanoGPT's) or trapezoid (constant, then a straight "
            "line down over the last --cooldown of the run; the speedrun's)"
        ),
    ] = "cosine"
    cooldown: Annotated[float, Arg("--schedule trapezoid: the fraction of the run spent decaying", probability)] = 0.4
    optimizer: Annotated[
        Literal["adamw", "muon"],
        Arg(
            "adamw, or muon: Muon (momentum orthogonalised by Newton-Schulz) for the transformer blocks' matrices at "
            "--muon-lr, AdamW for embeddings, heads, norms and biases"
        ),
    ] = "adamw"
    muon_lr: Annotated[float, Arg("--optimizer muon: Muon's learning rate", positive_float)] = 0.02
    muon_momentum: Annotated[float, Arg("--optimizer muon: Muon's momentum", unit_interval)] = 0.95
    weight_decay: Annotated[float, Arg("AdamW's decoupled weight decay, on matrices only", nonneg_float)] = 0.1
    beta1: Annotated[float, Arg("AdamW's β1 (momentum of the gradient's mean)", unit_interval)] = 0.9
    beta2: Annotated[float, Arg("AdamW's β2 (momentum of the gradient's square)", unit_interval)] = 0.99
    grad_clip: Annotated[float, Arg("clip the gradients' global norm at this (0: no clipping)", nonneg_float)] = 1.0
    ema: Annotated[
        float,
        Arg(
            "keep an exponential moving average of the weights, avg = d*avg + (1-d)*w after every step (Polyak "
            "averaging; timm's ModelEma): evaluation, best/ and model.safetensors use the average; 0.999 averages "
            "over about the last 1,000 steps (0: off)",
            unit_interval,
        ),
    ] = 0.0
    eval_interval: Annotated[
        int, Arg("steps between evaluations (each writes last/ and, when better, best/)", positive_int)
    ] = 250
    eval_iters: Annotated[int, Arg("validation batches per evaluation", positive_int)] = 20
    log_interval: Annotated[int, Arg("steps between progress updates", positive_int)] = 10
    device: Annotated[str, Arg("where to train: auto (a GPU when there is one), cpu, cuda or cuda:N", device_name)] = (
        "auto"
    )
    dtype: Annotated[
        Literal["auto", "fp32", "bf16"],
        Arg("auto (bf16 on GPUs and on CPUs with fast bf16, else fp32), fp32 or bf16 (mixed precision)"),
    ] = "auto"
    # None ("auto"): compile when the first steps' timing says the rest of the run pays it back
    # (training/compiling.py)
    compile: Annotated[
        bool | None,
        Arg(
            "torch.compile the model (default: auto, on when the timed first steps show the run is long enough to "
            "pay back compiling)"
        ),
    ] = None
    threads: Annotated[
        int | None,
        Arg(
            "CPU threads to compute with (default: auto, the cores other processes leave free, re-checked every 2 s, "
            "so that two runs side by side do not slow each other down)",
            positive_int,
        ),
    ] = None
    seed: Annotated[int, Arg("random seed: the same seed, options and machine give the same run", seed_value)] = 1337
    progress: Annotated[bool, Arg("a progress bar with ETA (plain lines when the output is not a terminal)")] = True
    verbose: Annotated[
        bool,
        Arg(
            "say the hardware choices (dtype, CPU threads, compile) and their reasons as the run makes them; they are always written to the run folder's hardware.log"
        ),
    ] = False
    checkpoint_activations: Annotated[
        bool, Arg("recompute each block's activations in the backward pass: less memory, about a third slower")
    ] = False
    fsdp: Annotated[
        bool,
        Arg(
            "under torchrun: FSDP2 (fully_shard: parameters, gradients and optimizer state sharded; sharded "
            "checkpoints) instead of DDP; CPU (gloo) or CUDA (NCCL)"
        ),
    ] = False
    target: Annotated[
        float | None,
        Arg(
            "stop early once the validation measure reaches this (accuracy or exact match, a fraction; language models: the validation loss, reached at or below)",
            nonneg_float,
        ),
    ] = None
    tensorboard: Annotated[
        bool,
        Arg(
            "also log to TensorBoard: scalars, the attention of one validation example at each evaluation and the "
            "config as hparams, in RUN/tensorboard/ (pip install 'attnlab[tensorboard]')"
        ),
    ] = False

    def __post_init__(self) -> None:
        super().__post_init__()  # (each field's own bounds, as declared above)
        if self.min_lr is not None and self.min_lr > self.lr:
            raise ValueError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        if self.optimizer == "muon" and self.fsdp:
            raise ValueError(
                "--optimizer muon needs each matrix whole on one process, which --fsdp shards; use DDP (drop --fsdp) "
                "or --optimizer adamw"
            )
        if self.ema and self.fsdp:
            raise ValueError("--ema keeps a whole copy of the weights on each process, which --fsdp shards; drop one")
