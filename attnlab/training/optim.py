"""Optimizer and learning-rate schedule shared by every model."""

from __future__ import annotations

import inspect
import math

import torch
from torch import Tensor, nn

from .devices import cpu_has_fast_bf16


def decay_groups(
    model: nn.Module, skip: set[str] | tuple | None = None
) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
    """(decayed, not decayed) parameters, one rule for every family:

    * matrices (Linear and Embedding weights, conv kernels: ``dim >= 2``) decay;
    * biases and norm gains (``dim < 2``) do not;
    * nor do the parameters a model names in ``no_weight_decay()`` (timm's convention): ViT's
      class token and position embeddings, as in timm and DeiT. GPT keeps nanoGPT's rule, under
      which its token and position embeddings decay.
    Tied weights appear once. ``skip`` replaces the model's ``no_weight_decay()`` (``()``: attnlab
    0.1's rule, under which every matrix decayed)."""
    if skip is None:
        skip = model.no_weight_decay() if hasattr(model, "no_weight_decay") else ()
    skip = set(skip)
    seen, decay, no_decay = set(), [], []
    for name, p in model.named_parameters():
        if not p.requires_grad or id(p) in seen:
            continue
        seen.add(id(p))
        (decay if p.dim() >= 2 and name not in skip else no_decay).append(p)
    return decay, no_decay


def adamw(model: nn.Module, lr: float, weight_decay: float, betas=(0.9, 0.95), device_type: str = "cpu", exclude=()):
    """AdamW with the two groups of ``decay_groups`` (less the parameters in ``exclude``); fused (one kernel over every parameter
    instead of a dozen small ops per parameter) on CUDA and CPU. On a CPU the default
    per-parameter loop shows in a small model's step: GPT 4/4/128, batch 12, 2 cores: 45.8 ms
    per step with the loop, 43.4 ms fused (median of 5 interleaved timings); the weights agree
    to rounding (tested)."""
    skip = {id(p) for p in exclude}
    decay, no_decay = ([p for p in group if id(p) not in skip] for group in decay_groups(model))
    groups = [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    extra = {}
    if "fused" in inspect.signature(torch.optim.AdamW).parameters and device_type in ("cuda", "cpu"):
        extra["fused"] = True
    return torch.optim.AdamW(groups, lr=lr, betas=betas, **extra)


def hidden_matrices(model: nn.Module) -> list[nn.Parameter]:
    """The matrices Muon trains: the weights of the Linear layers inside the transformer blocks
    (attention's projections, the MLP's two layers). Embeddings, output heads, patch and pooling
    layers, norms and biases stay with AdamW, as in the Muon and modded-nanogpt recipes: their
    rows are looked up one at a time or read out, not mixed as a whole."""
    from ..blocks import DecoderBlock, TransformerBlock

    seen, out = set(), []
    for block in model.modules():
        if isinstance(block, (TransformerBlock, DecoderBlock)):
            for m in block.modules():
                if isinstance(m, nn.Linear) and m.weight.requires_grad and id(m.weight) not in seen:
                    seen.add(id(m.weight))
                    out.append(m.weight)
    return out


# Keller Jordan's quintic coefficients, chosen to maximise the slope at zero (torch.optim.Muon's too)
NS_COEFFICIENTS = (3.4445, -4.775, 2.0315)


def newton_schulz(
    g: Tensor, dtype: torch.dtype, steps: int = 5, coefficients=NS_COEFFICIENTS, eps: float = 1e-7
) -> Tensor:
    """Orthogonalise the matrix ``g`` (rows, cols): X ← X / ‖X‖_F, then ``steps`` times
    X ← aX + (bA + cA²)X with A = XXᵀ, on the wide orientation, computed in ``dtype``. It maps
    g = USVᵀ to about U S' Vᵀ with S' ≈ 1 (Jordan et al. 2024's zeropower_via_newtonschulz5)."""
    a, b, c = coefficients
    x = g.to(dtype)
    tall = g.size(0) > g.size(1)
    if tall:
        x = x.T
    x = x / x.norm().clamp(min=eps)
    for _ in range(steps):
        gram = x @ x.T
        x = torch.addmm(x, torch.addmm(gram, gram, gram, beta=b, alpha=c), x, beta=a)
    return x.T if tall else x


def newton_schulz_dtype(device_type: str) -> tuple[torch.dtype, str]:
    """The dtype Newton–Schulz runs fast in on this device, and why: bf16 on GPUs with bf16 and
    on CPUs with AVX512-BF16 or AMX (``devices.cpu_has_fast_bf16``); fp32 elsewhere, where bf16
    matmuls are emulated (a 2-core AVX2 EPYC took 1,030 ms per speedrun-cpu step in bf16)."""
    if device_type == "cuda":
        fast = torch.cuda.is_available() and torch.cuda.is_bf16_supported()
        return (torch.bfloat16, "GPU with bf16") if fast else (torch.float32, "GPU without bf16")
    if cpu_has_fast_bf16():
        return torch.bfloat16, "CPU with fast bf16"
    return torch.float32, "CPU without fast bf16 (AVX512-BF16/AMX): bf16 matmuls would be emulated"


class Muon(torch.optim.Optimizer):
    """``torch.optim.Muon``'s update (same defaults and param-group keys, same ``momentum_buffer``
    state, so checkpoints written with either load into the other), with the Newton–Schulz
    iteration in ``ns_dtype`` instead of always bf16:

        B ← μB + (1−μ)G;  U = lerp(G, B, μ) (Nesterov) or B;  O = NS(U)
        θ ← θ(1 − ηλ) − η·√max(1, rows/cols)·O
    """

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        weight_decay: float = 0.1,
        momentum: float = 0.95,
        nesterov: bool = True,
        ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
        eps: float = 1e-7,
        ns_steps: int = 5,
        adjust_lr_fn: str | None = None,
        *,
        ns_dtype: torch.dtype = torch.bfloat16,
    ) -> None:
        if adjust_lr_fn not in (None, "original"):
            raise ValueError(f"adjust_lr_fn={adjust_lr_fn!r}: only the original √max(1, rows/cols) is implemented")
        defaults = dict(
            lr=lr, weight_decay=weight_decay, momentum=momentum, nesterov=nesterov,
            ns_coefficients=ns_coefficients, eps=eps, ns_steps=ns_steps, adjust_lr_fn=adjust_lr_fn,
        )  # fmt: skip
        super().__init__(params, defaults)
        self.ns_dtype = ns_dtype

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                if p.grad.ndim != 2:
                    raise ValueError("Muon trains matrices: this parameter's gradient is not 2-D")
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(p.grad)
                buf = state["momentum_buffer"]
                buf.lerp_(p.grad, 1 - momentum)
                update = p.grad.lerp(buf, momentum) if group["nesterov"] else buf
                update = newton_schulz(update, self.ns_dtype, group["ns_steps"], group["ns_coefficients"], group["eps"])
                p.mul_(1 - lr * group["weight_decay"])
                p.add_(update.to(p.dtype), alpha=-lr * math.sqrt(max(1.0, p.shape[0] / p.shape[1])))
        return None


class MuonAdamW:
    """Muon (Jordan et al. 2024, :class:`Muon`: momentum, then the update's matrix
    orthogonalised by five Newton–Schulz steps) for the hidden matrices, AdamW for the rest, used
    as one optimizer: its ``param_groups`` are AdamW's followed by Muon's (the trainer sets each
    group's lr as the schedule's lr times the group's ``lr_factor``), and its ``state_dict`` is
    one torch-style dict over both, so checkpoints keep Muon's momentum by parameter name."""

    def __init__(self, adamw: torch.optim.Optimizer, muon: torch.optim.Optimizer) -> None:
        self.adamw, self.muon = adamw, muon

    @property
    def param_groups(self) -> list[dict]:
        return self.adamw.param_groups + self.muon.param_groups

    def step(self) -> None:
        self.adamw.step()
        self.muon.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.adamw.zero_grad(set_to_none=set_to_none)
        self.muon.zero_grad(set_to_none=set_to_none)

    def state_dict(self) -> dict:
        a, m = self.adamw.state_dict(), self.muon.state_dict()
        shift = sum(len(g["params"]) for g in a["param_groups"])
        state = {**a["state"], **{i + shift: st for i, st in m["state"].items()}}
        groups = a["param_groups"] + [{**g, "params": [i + shift for i in g["params"]]} for g in m["param_groups"]]
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, sd: dict) -> None:
        n = len(self.adamw.param_groups)
        a_groups, m_groups = sd["param_groups"][:n], sd["param_groups"][n:]
        if len(m_groups) != len(self.muon.param_groups):
            raise ValueError("the saved optimizer is not Muon + AdamW")
        shift = sum(len(g["params"]) for g in a_groups)
        self.adamw.load_state_dict(
            {"state": {i: st for i, st in sd["state"].items() if i < shift}, "param_groups": a_groups}
        )
        self.muon.load_state_dict(
            {
                "state": {i - shift: st for i, st in sd["state"].items() if i >= shift},
                "param_groups": [{**g, "params": [i - shift for i in g["params"]]} for g in m_groups],
            }
        )


def make_optimizer(model: nn.Module, cfg, device_type: str = "cpu"):
    """The optimizer ``cfg`` (a :class:`TrainConfig`) asks for: AdamW over every parameter, or
    Muon for the hidden matrices at ``cfg.muon_lr`` (no weight decay, as in the speedrun) with
    AdamW for the rest (:class:`MuonAdamW`)."""
    if cfg.optimizer == "adamw":
        return adamw(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), device_type)
    matrices = hidden_matrices(model)
    if not matrices:
        raise ValueError("--optimizer muon: this model has no transformer blocks whose matrices Muon could train")
    inner = adamw(model, cfg.lr, cfg.weight_decay, (cfg.beta1, cfg.beta2), device_type, exclude=matrices)
    ns_dtype, _ = newton_schulz_dtype(device_type)
    muon = Muon(matrices, lr=cfg.muon_lr, weight_decay=0.0, momentum=cfg.muon_momentum, ns_dtype=ns_dtype)
    for g in muon.param_groups:
        g["lr_factor"] = cfg.muon_lr / cfg.lr  # the schedule scales both optimizers alike
    return MuonAdamW(inner, muon)


def warmup_stable_decay(
    step: int, *, lr: float, min_lr: float, warmup: int, decay_steps: int, cooldown: float
) -> float:
    """The trapezoid: linear warmup to ``lr``, constant, then a straight line down to ``min_lr``
    over the last ``cooldown`` fraction of ``decay_steps`` (Hägele et al. 2024; the speedrun's
    schedule, which needs no knowledge of the run's length until the cooldown starts)."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    start = decay_steps * (1.0 - cooldown)
    if step < start:
        return lr
    return lr + (min_lr - lr) * (step - start) / max(1.0, decay_steps - start)


def warmup_cosine(step: int, *, lr: float, min_lr: float, warmup: int, decay_steps: int) -> float:
    """Linear warmup from 0 to ``lr`` over ``warmup`` steps, then cosine decay to ``min_lr``
    at ``decay_steps``, constant after that (nanoGPT's schedule)."""
    if step < warmup:
        return lr * (step + 1) / (warmup + 1)
    if step >= decay_steps:
        return min_lr
    ratio = (step - warmup) / max(1, decay_steps - warmup)
    return min_lr + 0.5 * (1.0 + math.cos(math.pi * ratio)) * (lr - min_lr)
