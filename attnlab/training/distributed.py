"""Multi-process training through PyTorch's own engine, launched by torchrun.

    torchrun --nproc_per_node=N -m attnlab train gpt ...          # DistributedDataParallel
    torchrun --nproc_per_node=N -m attnlab train gpt ... --fsdp   # fully sharded (FSDP2)

torchrun sets RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT; NCCL is used on
GPUs, gloo on CPU. ``--fsdp`` is PyTorch's ``fully_shard`` (FSDP2, on DTensor): every block,
then the whole model, is sharded across the ranks — parameters, gradients and optimizer state —
on CPU (gloo) as on CUDA (NCCL). Its checkpoints are sharded too (``torch.distributed.checkpoint``,
each rank writing its part; see ``Trainer.save``).
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
        backend = "nccl" if use_cuda else "gloo"
        restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if restart:
            # workers restarted by torchrun's elastic agent share its store with the attempt that
            # failed, whose ranks left their addresses under the default keys: a fresh prefix per
            # attempt keeps the new ranks from dialling the dead ones
            store = dist.TCPStore(
                os.environ["MASTER_ADDR"],
                int(os.environ["MASTER_PORT"]),
                world,
                is_master=info.rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
            )
            prefixed = dist.PrefixStore(f"attnlab/restart-{restart}", store)
            dist.init_process_group(backend=backend, store=prefixed, rank=info.rank, world_size=world)
        else:
            dist.init_process_group(backend=backend)
    if use_cuda:
        torch.cuda.set_device(info.local_rank)
        return info, torch.device("cuda", info.local_rank)
    return info, torch.device("cpu")


def wrap(model: nn.Module, info: DistInfo, device: torch.device, fsdp: bool = False, dtype=None) -> nn.Module:
    """The model for N processes: DDP, or under ``fsdp`` the model itself, sharded in place by
    :func:`shard_model` (its parameters become DTensors: build the optimizer afterwards)."""
    if not info.enabled:
        return model
    if fsdp:
        shard_model(model, dtype)
        return model
    from torch.nn.parallel import DistributedDataParallel as DDP

    return DDP(model, device_ids=[device.index] if device.type == "cuda" else None)


def shard_model(model: nn.Module, dtype=None) -> None:
    """FSDP2: ``fully_shard`` each Transformer block (so that one block's parameters are gathered
    at a time), then the root for what is left (embeddings, head). Under bf16 the gathered
    parameters are bf16 and gradients are reduced in fp32. Activation checkpointing, set on the
    blocks, composes with it (it recomputes inside each block's gathered window)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from ..blocks import DecoderBlock, TransformerBlock

    policy = MixedPrecisionPolicy()
    if dtype == torch.bfloat16:
        policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for m in model.modules():
        if isinstance(m, (TransformerBlock, DecoderBlock)):
            fully_shard(m, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def plain_class(model: nn.Module) -> type:
    """The model's own class (FSDP2 swaps a sharded model's class for an FSDP subclass of it)."""
    from torch.distributed.fsdp import FSDPModule

    return next(c for c in type(model).__mro__ if not issubclass(c, FSDPModule))


def is_sharded(model: nn.Module) -> bool:
    """True for a model sharded by :func:`shard_model`."""
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def no_sync(model: nn.Module, last_micro_step: bool):
    """Skip the gradient all-reduce (DDP) or reduce-scatter (FSDP2) on all but the last
    micro-batch of an accumulation."""
    if last_micro_step:
        return contextlib.nullcontext()
    if hasattr(model, "no_sync"):
        return model.no_sync()
    if is_sharded(model):
        return _without_gradient_sync(model)
    return contextlib.nullcontext()


@contextlib.contextmanager
def _without_gradient_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


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
    """The unsharded weights (collective under FSDP: every rank must call it; CPU tensors)."""
    if is_sharded(model):
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        return get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    return unwrap_model(model).state_dict()


def save_sharded(model: nn.Module, optimizer, folder) -> None:
    """Model and optimizer state with ``torch.distributed.checkpoint``: each rank writes its own
    shards to ``folder`` (collective), with the global shapes, so any number of processes reads it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    msd, osd = get_state_dict(model, optimizer)
    dcp.save({"model": msd, "optim": osd}, checkpoint_id=str(folder))


def load_sharded(model: nn.Module, optimizer, folder) -> None:
    """Read what :func:`save_sharded` wrote into ``model`` and ``optimizer``, sharded or not and
    with any number of processes (DCP reshards: 2 → 1, 1 → 2)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    msd, osd = get_state_dict(model, optimizer)
    state = {"model": msd, "optim": osd}
    dcp.load(state, checkpoint_id=str(folder))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


def full_optimizer_state(model: nn.Module, optimizer) -> dict:
    """The optimizer state keyed by parameter names, unsharded (to carry it into a sharded model)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    return get_optimizer_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))


def set_full_optimizer_state(model: nn.Module, optimizer, state: dict) -> None:
    """Load :func:`full_optimizer_state`'s result into ``optimizer`` of the (sharded) ``model``."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))


def cleanup(info: DistInfo) -> None:
    if info.enabled and dist.is_initialized():
        dist.destroy_process_group()
