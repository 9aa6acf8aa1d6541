"""A run's state on disk besides the weights: the optimizer's moments as safetensors tensors plus
JSON scalars (never a pickle), and the metrics log, ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import CheckpointError


def optimizer_tensors(opt: torch.optim.Optimizer, model: nn.Module) -> tuple[dict, dict[str, Tensor]]:
    """The optimizer's state as JSON (groups, scalars, each group's parameter names) and tensors."""
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{idx}.{k}"] = v
            else:
                scalars[f"{idx}.{k}"] = v
    meta = {"param_groups": sd["param_groups"], "scalars": scalars, "param_names": group_names(opt, model)}
    return meta, tensors


def group_names(opt: torch.optim.Optimizer, model: nn.Module) -> list[list[str]]:
    """The names of each optimizer group's parameters, in the optimizer's order."""
    names = {id(p): n for n, p in model.named_parameters()}
    return [[names[id(p)] for p in g["params"]] for g in opt.param_groups]


def restore_optimizer(opt: torch.optim.Optimizer, meta: dict, tensors: dict[str, Tensor], model: nn.Module) -> None:
    """Load the saved optimizer state into ``opt``, matching each parameter's moments by its name,
    so that a run still resumes after a new attnlab moved a parameter to another group (ViT's
    class token and positions to the group without weight decay) or changed its shape."""
    saved: dict[int, dict] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            saved.setdefault(int(idx), {})[name] = v
    for key, v in meta["scalars"].items():
        idx, name = key.split(".", 1)
        saved.setdefault(int(idx), {})[name] = v
    params = dict(model.named_parameters())
    saved_names = meta.get("param_names") or guess_saved_names(meta, saved, model, params)
    now = group_names(opt, model)
    if saved_names is None or len(saved_names) != len(now):
        raise CheckpointError(
            "optimizer state does not fit this model (its parameters cannot be matched by name); start a new run"
        )
    flat = [n for g in saved_names for n in g]
    index_now = {n: i for i, n in enumerate(n for g in now for n in g)}
    state: dict[int, dict] = {}
    for idx, st in saved.items():
        name = flat[idx] if idx < len(flat) else None
        if name not in index_now:
            raise CheckpointError(
                f"optimizer state holds moments for {name!r}, which this model lacks; start a new run"
            )
        p = params[name]
        # a parameter an older attnlab kept in another shape (ViT's (1, T, D) position table, now
        # (T, D)): its moments are the same numbers, reshaped
        state[index_now[name]] = {
            k: v.reshape(p.shape) if torch.is_tensor(v) and v.dim() > 0 and v.numel() == p.numel() else v
            for k, v in st.items()
        }
    groups, start = [], 0
    for hyper, names in zip(meta["param_groups"], now):
        groups.append({**hyper, "params": list(range(start, start + len(names)))})
        start += len(names)
    try:
        opt.load_state_dict({"state": state, "param_groups": groups})
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(f"optimizer state does not fit this model ({e}); start a new run") from None


def guess_saved_names(meta: dict, saved: dict[int, dict], model: nn.Module, params: dict) -> list[list[str]] | None:
    """The parameter names of a checkpoint written before they were saved (attnlab 0.1): the
    grouping of today's rule, or of 0.1's rule (every matrix decays), whichever fits the saved
    group sizes and the sizes of the saved moments."""
    from .optim import decay_groups

    names = {id(p): n for n, p in params.items()}
    sizes = [len(g["params"]) for g in meta["param_groups"]]
    candidates = [decay_groups(model), decay_groups(model, skip=())]
    for groups in candidates:
        grouped = [[names[id(p)] for p in g] for g in groups]
        if [len(g) for g in grouped] != sizes:
            continue
        flat = [n for g in grouped for n in g]
        if all(
            v.numel() == params[flat[idx]].numel()
            for idx, st in saved.items()
            for v in st.values()
            if torch.is_tensor(v) and v.dim() > 0
        ):
            return grouped
    return None


def read_metrics(path: Path, upto: int | None = None) -> list[dict]:
    """The records of ``metrics.jsonl`` (a last line cut short by a kill is skipped)."""
    if not path.exists():
        return []
    recs = []
    for line in path.read_text().splitlines():
        try:
            rec = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(rec, dict) and "step" in rec and (upto is None or rec["step"] <= upto):
            recs.append(rec)
    return recs


def rewrite_metrics(path: Path, records: list[dict]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)
