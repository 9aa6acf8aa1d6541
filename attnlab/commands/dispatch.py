"""Commands shared by every model type: pick the implementation from the checkpoint."""

from __future__ import annotations

from pathlib import Path


def checkpoint_type(ckpt: str) -> str | None:
    from ..checkpoint import find_checkpoint, read_config

    p = Path(ckpt)
    if p.is_dir() and (p / "config.json").is_file():
        cfg = read_config(p)
        if "attnlab_version" not in cfg:
            return {"gpt2": "gpt", "vit": "vit"}.get(cfg.get("model_type"), cfg.get("model_type"))
    return read_config(find_checkpoint(p)).get("model_type")


def cmd_eval(args) -> int:
    kind = checkpoint_type(args.ckpt)
    if kind in ("vit", "cnn"):
        from .vision import cmd_eval_classifier

        return cmd_eval_classifier(args)
    from .lm import cmd_eval as lm_eval

    if args.split == "test":
        raise ValueError("language models have train and val splits; use --split val or train")
    args.split = args.split or "val"
    return lm_eval(args)
