"""Checkpoints: safetensors for tensors, JSON for everything else, written atomically.

A run folder holds ``last/`` and ``best/`` checkpoints. Each is written as ``<name>.tmp``
and swapped in with renames, so a crash leaves the previous checkpoint intact.
Nothing is ever unpickled.

    run/
      last/  config.json  model.safetensors  trainer.json  trainer.safetensors
      best/  config.json  model.safetensors
      metrics.jsonl  loss.png  data/
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, load_model as st_load_model, save_file, save_model as st_save_model
from torch import nn

from . import __version__
from .errors import CheckpointError

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"


def _model_classes() -> dict:
    from .models import MODEL_TYPES

    return MODEL_TYPES


def model_config_dict(model: nn.Module) -> dict:
    return {"attnlab_version": __version__, "model_type": model.model_type, "model": model.config.to_dict()}


def build_model(config: dict) -> nn.Module:
    classes = _model_classes()
    mtype = config.get("model_type")
    if mtype not in classes:
        raise CheckpointError(f"checkpoint has unknown model_type {mtype!r}; attnlab knows {sorted(classes)}")
    cls = classes[mtype]
    try:
        return cls(cls.config_class.from_dict(config["model"]))
    except (ValueError, TypeError, KeyError) as e:
        raise CheckpointError(f"checkpoint config does not describe a valid {mtype} model: {e}") from None


def write_checkpoint(
    path: Path,
    model: nn.Module,
    meta: dict,
    trainer_state: dict | None = None,
    trainer_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write a complete checkpoint folder at ``path`` atomically (old one kept until the new is whole)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    old = path.with_name(path.name + ".old")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    raw = model._orig_mod if hasattr(model, "_orig_mod") else model
    raw = raw.module if hasattr(raw, "module") and isinstance(raw.module, nn.Module) else raw
    st_save_model(raw, str(tmp / WEIGHTS))
    if trainer_tensors is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in trainer_tensors.items()}, str(tmp / TRAINER_TENSORS))
    if trainer_state is not None:
        (tmp / TRAINER_JSON).write_text(json.dumps(trainer_state, indent=1))
    (tmp / CONFIG).write_text(json.dumps({**model_config_dict(raw), **meta}, indent=1, ensure_ascii=False))
    for f in tmp.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    shutil.rmtree(old, ignore_errors=True)


def find_checkpoint(path: str | Path, prefer: str = "best") -> Path:
    """The checkpoint folder for ``path``: itself, or ``best/``/``last/`` inside a run folder."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; give a run folder written by `attnlab train`")
    if (path / CONFIG).is_file():
        return path
    order = [prefer, "last" if prefer == "best" else "best"]
    for name in order + [f"{n}.old" for n in order]:  # .old: a swap was interrupted
        if (path / name / CONFIG).is_file():
            return path / name
    raise CheckpointError(f"{path} holds no checkpoint (no config.json in it, in best/ or in last/)")


def ensure_new_run(out: Path) -> None:
    """Refuse to start a run where one already is: never overwrite the user's checkpoints."""
    if any((Path(out) / n / CONFIG).is_file() for n in ("last", "best", "last.old", "best.old")):
        raise CheckpointError(f"{out} already holds a checkpoint; pass --resume to continue it, or choose another --out")


def run_config(out: Path, resume: bool, kinds: tuple[str, ...]) -> dict | None:
    """The saved config of the run to resume (checked to be one of ``kinds``), or None for a
    new run, after making sure no run is there to be overwritten."""
    if not resume:
        ensure_new_run(out)
        return None
    saved = read_config(find_checkpoint(out, prefer="last"))
    if saved.get("model_type") not in kinds:
        raise CheckpointError(f"{out} holds a {saved.get('model_type')} run, not a {' or '.join(kinds)} run")
    return saved


def read_config(ckpt: Path) -> dict:
    try:
        return json.loads((ckpt / CONFIG).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ckpt / CONFIG} is unreadable or corrupt ({e}); use another checkpoint") from None


def load_weights(model: nn.Module, ckpt: Path) -> None:
    f = ckpt / WEIGHTS
    if not f.is_file():
        raise CheckpointError(f"{f} is missing; the checkpoint is incomplete, use another one")
    try:
        missing, unexpected = st_load_model(model, str(f), strict=False)
    except (SafetensorError, OSError, RuntimeError, ValueError) as e:
        raise CheckpointError(f"{f} is truncated or corrupt ({str(e).splitlines()[0]}); use another checkpoint") from None
    if missing or unexpected:
        raise CheckpointError(
            f"{f} does not match its config: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )


def load_trainer_state(ckpt: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    try:
        state = json.loads((ckpt / TRAINER_JSON).read_text())
        tensors = load_file(str(ckpt / TRAINER_TENSORS))
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt} has no trainer state (it is a weights-only checkpoint); cannot resume") from None
    except (SafetensorError, OSError, json.JSONDecodeError) as e:
        raise CheckpointError(f"trainer state in {ckpt} is corrupt ({e}); cannot resume from it") from None
    return state, tensors


def load_model(path: str | Path, *, expect: str | None = None, device: str | None = None, with_meta: bool = False):
    """Ready-to-use model (eval mode) from an attnlab run/checkpoint folder or a HuggingFace directory."""
    p = Path(path)
    if p.is_dir() and (p / CONFIG).is_file() and "attnlab_version" not in read_config(p):
        from .interop import load_hf

        model, meta = load_hf(p), {"model_type": None}
    else:
        ckpt = find_checkpoint(p)
        meta = read_config(ckpt)
        if expect is not None and meta.get("model_type") in _model_classes() and meta["model_type"] != expect:
            raise CheckpointError(f"{path} holds a {meta['model_type']} model, but this command needs a {expect} model")
        model = build_model(meta)
        load_weights(model, ckpt)
    if expect is not None and model.model_type != expect:
        raise CheckpointError(
            f"{path} holds a {model.model_type} model, but this command needs a {expect} model"
        )
    model.eval()
    if device:
        model.to(device)
    return (model, meta) if with_meta else model
