"""What every training command does the same way: options given on the command line, the
training config of a new or resumed run, and the one rule for changed options on --resume."""

from __future__ import annotations

import sys

from ..errors import CheckpointError


def given(args, names) -> dict:
    """The options among ``names`` that the user gave (argparse default None = not given)."""
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def train_config(args, saved: dict | None):
    """The TrainConfig of this run. A resumed run keeps its saved values and takes the training
    options given now (they are safe to change); its learning-rate schedule stays the one it
    started with (decay to its original ``lr_decay_iters``) unless --lr-decay-iters is given."""
    from ..train import TrainConfig

    over = given(args, args.train_fields)
    if not saved:
        return TrainConfig(**{**args.train_defaults, **over})
    old = dict(saved.get("train", {}))
    if old.get("lr_decay_iters") is None:  # runs written before the schedule was saved explicitly
        old["lr_decay_iters"] = old.get("max_iters")
    cfg = TrainConfig.from_dict({**old, **over}, strict=False)
    changed = {k: v for k, v in over.items() if saved.get("train", {}).get(k) != v}
    if changed:
        print(f"resume: training options changed from the saved run: {changed}", file=sys.stderr)
    if "max_iters" in over and "lr_decay_iters" not in over:
        print(f"resume: keeping the run's schedule (cosine decay to step {cfg.lr_decay_iters}, then min lr); "
              "pass --lr-decay-iters N for another", file=sys.stderr)
    return cfg


def refuse_model_changes(out, model_cfg, model_over: dict, others: dict | None = None) -> None:
    """On --resume, model options (and ``others``: {option: (given, saved)}) must match the run."""
    clash = {} if model_cfg is None else {
        k: v for k, v in model_over.items() if not hasattr(model_cfg, k) or getattr(model_cfg, k) != v}
    clash.update({k: new for k, (new, old) in (others or {}).items() if new is not None and new != old})
    if clash:
        shown = ", ".join(f"--{k.replace('_', '-')} {v}" for k, v in clash.items())
        raise CheckpointError(f"--resume with options that differ from the checkpoint in {out} ({shown}); model "
                              "and data options cannot change: drop them to continue the run, or start a new --out")


def run_header(trainer) -> str:
    """The device and dtype of a run, with the reason for the dtype."""
    dtype = str(trainer.dtype).replace("torch.", "")
    return f"{trainer.device} {dtype} ({trainer.dtype_reason})"
