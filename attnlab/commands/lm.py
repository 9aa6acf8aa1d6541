"""`attnlab train gpt`, `attnlab sample`, `attnlab eval` for language models."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

from .common import given, refuse_model_changes, run_header, train_config


def cmd_train_gpt(args) -> int:
    from ..checkpoint import run_config
    from ..data.text import prepare
    from ..models.gpt import GPT, GPT_PRESETS, GPTConfig
    from ..train import LanguageModelTask, Trainer

    out = Path(args.out)
    model_over = given(args, args.model_fields)
    saved = run_config(out, args.resume, ("gpt",))
    if saved:
        mcfg = GPTConfig.from_dict(saved["model"])
        refuse_model_changes(out, mcfg, model_over, {"tokenizer": (args.tokenizer, saved["tokenizer"].get("kind"))})
        data_spec = args.data if args.data is not None else saved.get("data_spec")
        data = prepare(data_spec, out / "data", data_dir=args.data_dir, existing_tokenizer=saved["tokenizer"])
    else:
        data_spec = args.data
        data = prepare(data_spec, out / "data", tokenizer=args.tokenizer or "char",
                       vocab_size=args.vocab_size, data_dir=args.data_dir)
        mcfg = GPTConfig(**{**GPT_PRESETS[args.preset], **model_over, "vocab_size": data.tokenizer.vocab_size})
    tcfg = train_config(args, saved)
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
        f"tokens, vocab {data.tokenizer.vocab_size} | {run_header(trainer)}",
        file=sys.stderr,
    )
    result = trainer.fit()
    if not trainer.dist.main:
        return 0
    print(f"done: step {result['step']}, best val loss {result['best_val']:.4f}, run folder {out}", file=sys.stderr)
    if args.sample_chars > 0:
        from ..generate import generate_text

        import torch

        torch.manual_seed(tcfg.seed)
        model.eval()
        prompt = "\n" if "\n" in getattr(data.tokenizer, "stoi", {"\n": 0}) else data.tokenizer.decode([0])
        text = generate_text(model, data.tokenizer, prompt, args.sample_chars, temperature=0.8, top_k=200)[0]
        print("--- sample ---\n" + prompt.lstrip("\n") + text)
    return 0


def _load_lm(ckpt: str, device: str):
    from ..checkpoint import load_model
    from ..errors import CheckpointError
    from ..tokens import BPETokenizer, tokenizer_from_dict
    from ..train.trainer import pick_device

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

    from ..generate import generate_text

    model, tok, _, dev = _load_lm(args.ckpt, args.device)
    if args.max_new_tokens < 1:
        raise ValueError("--max-new-tokens must be at least 1")
    prompt = args.prompt
    if not prompt:
        prompt = "\n" if "\n" in getattr(tok, "stoi", {"\n": 0}) else tok.decode([0])
    tok.encode(prompt)  # unknown characters fail here, with a clear message
    if any(s == "" for s in args.stop):
        raise ValueError("--stop '' would stop every sample before it starts; give a non-empty string")
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

    from ..data.text import load_corpus

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
