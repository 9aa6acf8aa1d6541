"""The ``attnlab`` command line.

    attnlab train gpt [--data PATH|NAME] [--preset NAME] [--out DIR] ...
    attnlab sample --ckpt DIR [--prompt TEXT] ...
    attnlab eval --ckpt DIR [--json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sys
import typing
from pathlib import Path

from . import __version__
from .errors import AttnlabError

EPILOG = "Every command has --help. Data directory: --data-dir or the ATTNLAB_DATA environment variable."


def _field_options(parser: argparse.ArgumentParser, cls, skip=(), title: str = "") -> list[str]:
    """One --option per dataclass field (default None = 'not given'); returns the field names."""
    group = parser.add_argument_group(title)
    hints = typing.get_type_hints(cls)
    names = []
    for f in dataclasses.fields(cls):
        if f.name in skip:
            continue
        flag = "--" + f.name.replace("_", "-")
        typ = hints[f.name]
        args = typing.get_args(typ)
        base = next((a for a in args if a is not type(None)), typ) if args else typ
        default = f.default if f.default is not dataclasses.MISSING else None
        helptext = f"{cls.__name__}.{f.name} (default: {default})"
        if base is bool:
            group.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, default=None, help=helptext)
        else:
            group.add_argument(flag, dest=f.name, type=base, default=None, metavar=base.__name__.upper(), help=helptext)
        names.append(f.name)
    return names


def _given(args, names) -> dict:
    return {n: getattr(args, n) for n in names if getattr(args, n, None) is not None}


def build_parser() -> argparse.ArgumentParser:
    from .models.gpt import GPT_PRESETS, GPTConfig
    from .train.trainer import TrainConfig

    p = argparse.ArgumentParser(
        prog="attnlab",
        description="Transformers the way they are taught: train, sample, evaluate and look inside.",
        epilog=EPILOG,
    )
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")

    train = sub.add_parser("train", help="train a model", description="Train a model with the shared trainer.")
    tsub = train.add_subparsers(dest="model", metavar="MODEL")
    gpt = tsub.add_parser(
        "gpt",
        help="a GPT language model on any text",
        description="Train a decoder-only GPT to predict the next token of a text corpus. With no --data "
        "it trains on English text that ships with Python (no download needed).",
        epilog=EPILOG,
    )
    gpt.add_argument("--data", default=None,
                     help="text file, folder of text files, or a dataset name: python-docs (embedded, default), shakespeare")
    gpt.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    gpt.add_argument("--tokenizer", choices=["char", "bpe"], default=None, help="character-level (default) or byte-level BPE")
    gpt.add_argument("--vocab-size", type=int, default=None, help="BPE vocabulary size (default 1024)")
    gpt.add_argument("--preset", default="shakespeare-cpu", choices=sorted(GPT_PRESETS),
                     help="model shape to start from (default: shakespeare-cpu = 4 layers, 4 heads, 128 wide, context 64)")
    gpt.add_argument("--out", default="runs/gpt", help="run folder for checkpoints, metrics and plots (default: runs/gpt)")
    gpt.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    gpt.add_argument("--sample-chars", type=int, default=300, help="print a sample of this many tokens at the end (0: none)")
    model_fields = _field_options(gpt, GPTConfig, skip=("vocab_size",), title="model (overrides the preset)")
    train_fields = _field_options(gpt, TrainConfig, title="training")
    gpt.set_defaults(func=cmd_train_gpt, model_fields=model_fields, train_fields=train_fields)

    s = sub.add_parser("sample", help="generate text from a trained GPT", description="Continue a prompt, streaming tokens as they come.")
    s.add_argument("--ckpt", required=True, help="run folder (or checkpoint / HuggingFace folder)")
    s.add_argument("--prompt", default="", help="text to continue (default: start from a newline)")
    s.add_argument("--max-new-tokens", type=int, default=500, help="tokens to generate per sample (default 500)")
    s.add_argument("--temperature", type=float, default=0.8, help="softmax temperature; 0 = greedy (default 0.8)")
    s.add_argument("--top-k", type=int, default=200, help="sample only from the k most likely tokens (default 200; 0 = off)")
    s.add_argument("--top-p", type=float, default=None, help="nucleus sampling: smallest set with this total probability")
    s.add_argument("--num-samples", type=int, default=1, help="how many samples (default 1)")
    s.add_argument("--stop", action="append", default=[], help="stop a sample at this string (repeatable)")
    s.add_argument("--seed", type=int, default=1337, help="random seed (default 1337)")
    s.add_argument("--no-cache", action="store_true", help="recompute the whole prefix each step instead of using the KV cache")
    s.add_argument("--device", default="auto", help="auto | cpu | cuda")
    s.set_defaults(func=cmd_sample)

    e = sub.add_parser("eval", help="loss, perplexity and bits per character/byte of a trained model",
                       description="Evaluate a GPT checkpoint on the validation split of its data (or --data).")
    e.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    e.add_argument("--data", default=None, help="evaluate on this text instead (its last 10%% is used)")
    e.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    e.add_argument("--split", choices=["val", "train"], default="val", help="which split (default val)")
    e.add_argument("--block-size", type=int, default=None, help="window length (default: the model's context)")
    e.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default 16)")
    e.add_argument("--max-tokens", type=int, default=200_000, help="evaluate at most this many tokens (default 200000)")
    e.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    e.add_argument("--device", default="auto", help="auto | cpu | cuda")
    e.set_defaults(func=cmd_eval)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        if args.command:  # e.g. `attnlab train` without a model: show that command's help
            parser.parse_args([args.command, "--help"])
        parser.print_help()
        return 0
    from .train.trainer import TrainingInterrupted

    try:
        return args.func(args) or 0
    except TrainingInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (AttnlabError, ValueError, FileNotFoundError, IsADirectoryError, PermissionError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        print(f"error: {msg}", file=sys.stderr)
        return 2


# --------------------------------------------------------------------------------------------
def cmd_train_gpt(args) -> int:
    from .checkpoint import find_checkpoint, read_config
    from .data.text import prepare
    from .errors import CheckpointError
    from .models.gpt import GPT, GPT_PRESETS, GPTConfig
    from .train import LanguageModelTask, TrainConfig, Trainer

    out = Path(args.out)
    model_over = _given(args, args.model_fields)
    train_over = _given(args, args.train_fields)
    if args.resume:
        ckpt = find_checkpoint(out, prefer="last")
        saved = read_config(ckpt)
        if saved.get("model_type") != "gpt":
            raise CheckpointError(f"{out} holds a {saved.get('model_type')} run, not a GPT run")
        mcfg = GPTConfig.from_dict(saved["model"])
        clash = {k: v for k, v in model_over.items() if getattr(mcfg, k) != v}
        if clash:
            raise CheckpointError(
                f"--resume with model options {clash} that differ from the checkpoint's; drop them or start a new --out"
            )
        tcfg = TrainConfig.from_dict({**saved.get("train", {}), **train_over})
        data_spec = args.data if args.data is not None else saved.get("data_spec")
        data = prepare(data_spec, out / "data", data_dir=args.data_dir, existing_tokenizer=saved["tokenizer"])
    else:
        try:
            find_checkpoint(out)
            raise CheckpointError(f"{out} already holds a checkpoint; pass --resume to continue it, or choose another --out")
        except CheckpointError as e:
            if "already holds" in str(e):
                raise
        data_spec = args.data
        data = prepare(data_spec, out / "data", tokenizer=args.tokenizer or "char",
                       vocab_size=args.vocab_size, data_dir=args.data_dir)
        mcfg = GPTConfig(**{**GPT_PRESETS[args.preset], **model_over, "vocab_size": data.tokenizer.vocab_size})
        tcfg = TrainConfig(**train_over)
    import torch

    torch.manual_seed(tcfg.seed)  # the initial weights follow from the seed
    model = GPT(mcfg)
    task = LanguageModelTask(data, mcfg.block_size, tcfg.batch_size)
    trainer = Trainer(model, task, tcfg, out, meta={"data_spec": data_spec})
    if args.resume:
        trainer.resume()
    n_params = model.num_params()
    print(
        f"GPT {mcfg.n_layer} layers, {mcfg.n_head} heads, {mcfg.n_embd} wide, context {mcfg.block_size}: "
        f"{n_params / 1e6:.2f}M parameters | data {data.name}: {len(data.train):,} train / {len(data.val):,} val "
        f"tokens, vocab {data.tokenizer.vocab_size} | {trainer.device} {str(trainer.dtype).replace('torch.', '')}",
        file=sys.stderr,
    )
    result = trainer.fit()
    print(f"done: step {result['step']}, best val loss {result['best_val']:.4f}, run folder {out}", file=sys.stderr)
    if args.sample_chars > 0:
        from .generate import generate_text

        import torch

        torch.manual_seed(tcfg.seed)
        model.eval()
        prompt = "\n" if "\n" in getattr(data.tokenizer, "stoi", {"\n": 0}) else data.tokenizer.decode([0])
        text = generate_text(model, data.tokenizer, prompt, args.sample_chars, temperature=0.8, top_k=200)[0]
        print("--- sample ---\n" + prompt.lstrip("\n") + text)
    return 0


def _load_lm(ckpt: str, device: str):
    from .checkpoint import load_model
    from .errors import CheckpointError
    from .tokens import BPETokenizer, tokenizer_from_dict
    from .train.trainer import pick_device

    dev = pick_device(device)
    model, meta = load_model(ckpt, expect="gpt", device=str(dev), with_meta=True)
    if meta.get("tokenizer"):
        tok = tokenizer_from_dict(meta["tokenizer"])
    elif (Path(ckpt) / "tokenizer.json").is_file():
        tok = BPETokenizer.load(Path(ckpt) / "tokenizer.json")
    else:
        raise CheckpointError(f"{ckpt} has no tokenizer (no tokenizer in config.json, no tokenizer.json)")
    return model, tok, meta, dev


def cmd_sample(args) -> int:
    import torch

    from .generate import generate_text

    model, tok, _, dev = _load_lm(args.ckpt, args.device)
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    prompt = args.prompt
    if not prompt:
        prompt = "\n" if "\n" in getattr(tok, "stoi", {"\n": 0}) else tok.decode([0])
    tok.encode(prompt)  # unknown characters fail here, with a clear message
    torch.manual_seed(args.seed)
    gen = torch.Generator(device=dev).manual_seed(args.seed)
    kw = dict(temperature=args.temperature, top_k=args.top_k or None, top_p=args.top_p,
              use_cache=not args.no_cache, generator=gen, stop=args.stop)
    for i in range(args.num_samples):
        out = sys.stdout
        out.write(args.prompt)

        def stream(piece: str) -> None:
            out.write(piece)
            out.flush()

        generate_text(model, tok, prompt, args.max_new_tokens, stream=stream, **kw)
        out.write("\n" if i == args.num_samples - 1 else "\n---------------\n")
        out.flush()
    return 0


def cmd_eval(args) -> int:
    import numpy as np
    import torch
    import torch.nn.functional as F

    from .data.text import load_corpus

    model, tok, meta, dev = _load_lm(args.ckpt, args.device)
    block = args.block_size or model.config.block_size
    if block > model.config.block_size:
        raise ValueError(
            f"--block-size {block} is larger than the model's context of {model.config.block_size}; use at most that"
        )
    run = Path(args.ckpt)
    cache = run / "data" / "meta.json"
    if args.data is None and cache.is_file() and meta.get("tokenizer") == json.loads(cache.read_text())["tokenizer"]:
        m = json.loads(cache.read_text())
        ids = np.memmap(run / "data" / f"{args.split}.bin", dtype=np.dtype(m["dtype"]), mode="r")
        name = m["name"]
    else:
        spec = args.data if args.data is not None else meta.get("data_spec")
        name, text = load_corpus(spec, args.data_dir)
        all_ids = tok.encode(text)
        cut = int(len(all_ids) * 0.9)
        ids = np.asarray(all_ids[cut:] if args.split == "val" else all_ids[:cut])
    ids = np.asarray(ids[: args.max_tokens + 1], dtype=np.int64)
    n_windows = (len(ids) - 1) // block
    if n_windows < 1:
        raise ValueError(f"the {args.split} split has {len(ids)} tokens, fewer than one window of {block} + 1")
    x = torch.from_numpy(ids[: n_windows * block].reshape(n_windows, block))
    y = torch.from_numpy(ids[1 : n_windows * block + 1].reshape(n_windows, block))
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n_windows, args.batch_size):
            xb, yb = x[i : i + args.batch_size].to(dev), y[i : i + args.batch_size].to(dev)
            logits = model(xb)
            total += F.cross_entropy(logits.float().flatten(0, 1), yb.flatten(), reduction="sum").item()
            count += yb.numel()
    loss = total / count
    n_bytes = len(tok.decode(y.flatten().tolist()).encode("utf-8"))
    n_chars = len(tok.decode(y.flatten().tolist()))
    res = {
        "data": name, "split": args.split, "tokens": count, "loss": loss, "perplexity": math.exp(loss),
        "bits_per_token": loss / math.log(2),
        "bits_per_char": total / math.log(2) / n_chars,
        "bits_per_byte": total / math.log(2) / n_bytes,
    }
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{name} [{args.split}], {count:,} tokens: loss {loss:.4f} nats/token, perplexity {res['perplexity']:.2f}, "
              f"{res['bits_per_char']:.3f} bits/char, {res['bits_per_byte']:.3f} bits/byte")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
