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
    if kind in ("transformer", "rnn"):
        from .seq2seq import cmd_eval_seq2seq

        return cmd_eval_seq2seq(args)
    from .lm import cmd_eval as lm_eval

    if args.split == "test":
        raise ValueError("language models have train and val splits; use --split val or train")
    args.split = args.split or "val"
    return lm_eval(args)


def cmd_inspect(args) -> int:
    if args.what == "alignment":
        from .seq2seq import cmd_inspect_alignment

        return cmd_inspect_alignment(args)
    from .vision import cmd_inspect as vision_inspect

    return vision_inspect(args)


def cmd_bench(args) -> int:
    from ..bench import run

    run(quick=args.quick, compile_=args.compile, json_path=args.json, markdown_path=args.markdown, device=args.device,
        only=args.only)
    return 0
