"""The trainer's options: one dataclass, every field an ``attnlab train`` flag (``--max-iters``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from ..config import Config
from ..options import check_device_name


@dataclass
class TrainConfig(Config):
    CHOICES = {"schedule": ("cosine", "trapezoid"), "optimizer": ("adamw", "muon"), "dtype": ("auto", "fp32", "bf16")}

    max_iters: int = 2000
    batch_size: int = 12
    grad_accum: int = 1  # micro-batches per optimizer step
    lr: float = 1e-3
    min_lr: float | None = None  # default: lr / 10
    warmup_iters: int = 100
    lr_decay_iters: int | None = None  # default: max_iters
    schedule: str = field(
        default="cosine",
        metadata={
            "help": "learning-rate schedule after the warmup: cosine (nanoGPT's) or trapezoid (constant, then a "
            "straight line down over the last --cooldown of the run; the speedrun's)"
        },
    )
    cooldown: float = field(
        default=0.4, metadata={"help": "--schedule trapezoid: the fraction of the run spent decaying"}
    )
    optimizer: str = field(
        default="adamw",
        metadata={
            "help": "adamw, or muon: Muon (momentum orthogonalised by Newton-Schulz) for the transformer blocks' "
            "matrices at --muon-lr, AdamW for embeddings, heads, norms and biases"
        },
    )
    muon_lr: float = field(default=0.02, metadata={"help": "--optimizer muon: Muon's learning rate"})
    muon_momentum: float = field(default=0.95, metadata={"help": "--optimizer muon: Muon's momentum"})
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.99
    grad_clip: float = 1.0  # 0 disables clipping
    ema: float = field(
        default=0.0,
        metadata={
            "help": "keep an exponential moving average of the weights, avg = d*avg + (1-d)*w after every step "
            "(Polyak averaging; timm's ModelEma): evaluation, best/ and model.safetensors use the average; "
            "0.999 averages over about the last 1,000 steps (0: off)"
        },
    )
    eval_interval: int = 250
    eval_iters: int = 20
    log_interval: int = 10
    device: str = "auto"  # auto | cpu | cuda
    dtype: str = "auto"  # auto | fp32 | bf16
    # torch.compile the model: True/False as asked; None (the default, "auto") compiles when the
    # first steps' timing says the rest of the run is long enough to pay it back (train/compiling.py)
    compile: bool | None = field(
        default=None,
        metadata={
            "help": "torch.compile the model (default: auto, on when "
            "the timed first steps show the run is long enough to pay back compiling)"
        },
    )
    threads: int | None = field(
        default=None,
        metadata={
            "help": "CPU threads to compute with (default: auto, the cores other processes leave free, "
            "re-checked every 2 s, so that two runs side by side do not slow each other down)"
        },
    )
    seed: int = 1337
    progress: bool = True
    verbose: bool = False  # the hardware choices (dtype, threads, compile) on screen too, not only in hardware.log
    checkpoint_activations: bool = False  # recompute each block's activations in backward (saves memory)
    fsdp: bool = field(
        default=False,
        metadata={
            "help": "under torchrun: FSDP2 (fully_shard: parameters, gradients and optimizer state sharded; "
            "sharded checkpoints) instead of DDP; CPU (gloo) or CUDA (NCCL)"
        },
    )
    target: float | None = None  # stop once the task's validation metric (accuracy, exact match, loss) reaches this
    tensorboard: bool = field(
        default=False,
        metadata={
            "help": "also log to TensorBoard: scalars, the attention of one validation example at each "
            "evaluation and the config as hparams, in RUN/tensorboard/ (pip install 'attnlab[tensorboard]')"
        },
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        for name in ("max_iters", "batch_size", "grad_accum", "eval_interval", "eval_iters", "log_interval"):
            if getattr(self, name) < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if not 0 <= self.seed < 2**63:  # (torch's generators take a 64-bit seed)
            raise ValueError(f"--seed must be from 0 to 2**63 - 1, got {self.seed}")
        if not 0 < self.cooldown <= 1:
            raise ValueError(f"--cooldown must be a fraction of the run in (0, 1], got {self.cooldown}")
        if not (self.muon_lr > 0 and math.isfinite(self.muon_lr)):
            raise ValueError(f"--muon-lr must be a positive number, got {self.muon_lr}")
        if not 0 <= self.muon_momentum < 1:
            raise ValueError(f"--muon-momentum must be in [0, 1), got {self.muon_momentum}")
        if self.optimizer == "muon" and self.fsdp:
            raise ValueError(
                "--optimizer muon needs each matrix whole on one process, which --fsdp shards; use DDP (drop --fsdp) "
                "or --optimizer adamw"
            )
        if not 0 <= self.ema < 1:
            raise ValueError(f"--ema must be a decay in [0, 1) (0 = off; 0.999 is usual), got {self.ema}")
        if self.ema and self.fsdp:
            raise ValueError("--ema keeps a whole copy of the weights on each process, which --fsdp shards; drop one")
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"--threads must be at least 1, got {self.threads}")
        for name in ("warmup_iters", "weight_decay", "grad_clip"):
            if getattr(self, name) < 0:
                raise ValueError(f"--{name.replace('_', '-')} must be 0 or more, got {getattr(self, name)}")
        if not (self.lr > 0 and math.isfinite(self.lr)):
            raise ValueError(f"--lr must be a positive number, got {self.lr}")
        if self.min_lr is not None and not 0 <= self.min_lr <= self.lr:
            raise ValueError(f"--min-lr must be between 0 and --lr ({self.lr}), got {self.min_lr}")
        if self.lr_decay_iters is not None and self.lr_decay_iters < 1:
            raise ValueError(f"--lr-decay-iters must be at least 1, got {self.lr_decay_iters}")
        for name in ("beta1", "beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"--{name} must be in [0, 1), got {getattr(self, name)}")
        if self.target is not None and not (self.target >= 0 and math.isfinite(self.target)):
            raise ValueError(f"--target must be a number of 0 or more, got {self.target}")
        check_device_name(self.device)
