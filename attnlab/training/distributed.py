"""Multi-process training through PyTorch's own engine, launched by torchrun.

    torchrun --nproc_per_node=N -m attnlab train gpt ...          # DistributedDataParallel
    torchrun --nproc_per_node=N -m attnlab train gpt ... --fsdp   # fully sharded (FSDP)

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; NCCL is used on
GPUs, gloo on CPU.
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from ..checkpoint import unwrap_model


@dataclass
class DistInfo:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def enabled(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        return self.rank == 0


def setup(device_name: str = "auto") -> tuple[DistInfo, torch.device | None]:
    """Join the process group when launched by torchrun; returns (info, device for this rank or None)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistInfo(), None
    info = DistInfo(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))
    use_cuda = torch.cuda.is_available() and device_name in ("auto", "cuda")
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
        return info, torch.device("cuda", info.local_rank)
    return info, torch.device("cpu")


def wrap(model: nn.Module, info: DistInfo, device: torch.device, fsdp: bool = False) -> nn.Module:
    if not info.enabled:
        return model
    if fsdp:
        if device.type != "cuda":
            raise ValueError("--fsdp needs GPUs (PyTorch's FSDP has no CPU backend); on CPU use DDP, the default")
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

        return FSDP(model, device_id=device if device.type == "cuda" else None, use_orig_params=True)
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def no_sync(model: nn.Module, last_micro_step: bool):
    """Skip the gradient all-reduce on all but the last micro-batch of an accumulation."""
    if last_micro_step or not hasattr(model, "no_sync"):
        return contextlib.nullcontext()
    return model.no_sync()


def shard(batch, info: DistInfo):
    """This rank's slice of a global batch drawn identically on every rank, so that N processes
    with batch B see exactly what one process with batch N·B would."""
    if not info.enabled:
        return batch
    out = []
    for t in batch:
        per = t.shape[0] // info.world
        out.append(t[info.rank * per : (info.rank + 1) * per])
    return out


def barrier(info: DistInfo) -> None:
    if info.enabled:
        dist.barrier()


def full_state_dict(model: nn.Module) -> dict:
    """The unsharded state dict (collective for FSDP: every rank must call it)."""
    try:
        from torch.distributed.fsdp import FullStateDictConfig, StateDictType
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    except ImportError:  # pragma: no cover
        FSDP = None
    if FSDP is not None and isinstance(model, FSDP):
        cfg = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, cfg):
            return model.state_dict()
    return unwrap_model(model).state_dict()


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
