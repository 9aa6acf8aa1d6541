"""A run's state on disk besides the weights: the optimizer's moments as safetensors tensors plus
JSON scalars (never a pickle), and the metrics log, ``metrics.jsonl``."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from torch import Tensor

from ..errors import CheckpointError


def optimizer_tensors(opt: torch.optim.Optimizer) -> tuple[dict, dict[str, Tensor]]:
    sd = opt.state_dict()
    tensors, scalars = {}, {}
    for idx, st in sd["state"].items():
        for k, v in st.items():
            if torch.is_tensor(v):
                tensors[f"optim.{idx}.{k}"] = v
            else:
                scalars[f"{idx}.{k}"] = v
    return {"param_groups": sd["param_groups"], "scalars": scalars}, tensors


def restore_optimizer(opt: torch.optim.Optimizer, meta: dict, tensors: dict[str, Tensor]) -> None:
    state: dict[int, dict] = {}
    for key, v in tensors.items():
        if key.startswith("optim."):
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = v
    for key, v in meta["scalars"].items():
        idx, name = key.split(".", 1)
        state.setdefault(int(idx), {})[name] = v
    # a parameter an older attnlab kept in another shape (ViT's (1, T, D) position table, now
    # (T, D)): its moments are the same numbers, reshaped
    params = [p for group in opt.param_groups for p in group["params"]]
    for idx, st in state.items():
        if idx < len(params):
            for name, v in st.items():
                if (
                    torch.is_tensor(v)
                    and v.dim() > 0
                    and v.shape != params[idx].shape
                    and v.numel() == params[idx].numel()
                ):
                    st[name] = v.reshape(params[idx].shape)
    try:
        opt.load_state_dict({"state": state, "param_groups": meta["param_groups"]})
    except (ValueError, KeyError) as e:
        raise CheckpointError(f"optimizer state does not fit this model ({e}); start a new run") from None


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
