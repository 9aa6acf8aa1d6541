"""`attnlab train seq2seq`, `attnlab translate`, seq2seq `eval` and `inspect alignment`."""

from __future__ import annotations

import json
import math
import sys
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

from .common import given, refuse_model_changes, run_header, train_config
from ..errors import CheckpointError

ARCH_ATTENTION = {"rnn": "none", "rnn-attention": "additive"}


DEFAULT_DATA_OPTS = dict(src_lang="de", tgt_lang="en", tokenizer=None, vocab_size=8000, joint=True, min_len=5,
                         max_len=20)


def _data_opts(args) -> dict:
    """The data options given on the command line (None where not given)."""
    return dict(src_lang=args.src, tgt_lang=args.tgt, tokenizer=args.tokenizer, vocab_size=args.vocab_size,
                joint=False if args.separate_vocab else None, min_len=args.min_length, max_len=args.max_length)


def _arch(model_type: str, model_cfg: dict) -> str:
    if model_type == "transformer":
        return "transformer"
    return "rnn" if model_cfg.get("attention") == "none" else "rnn-attention"


def _model_from_args(args, data, model_over):
    from ..models import RNNConfig, RNNSeq2Seq, Transformer, TransformerConfig

    sv, tv = data.src_vocab.size, data.tgt_vocab.size
    arch = args.arch or "transformer"
    own = TransformerConfig if arch == "transformer" else RNNConfig
    foreign = sorted(k for k in model_over if k not in own.__dataclass_fields__)
    if foreign:
        raise ValueError(f"--arch {arch} has no option{'s' if len(foreign) > 1 else ''} "
                         f"{', '.join('--' + k.replace('_', '-') for k in foreign)}; see attnlab train seq2seq --help")
    if arch == "transformer":
        fields = dict(model_over)
        fields.setdefault("share_embeddings", data.src_vocab is data.tgt_vocab)
        return Transformer(TransformerConfig(**{**fields, "src_vocab": sv, "tgt_vocab": tv}))
    fields = dict(model_over)
    fields.setdefault("attention", ARCH_ATTENTION[arch])
    return RNNSeq2Seq(RNNConfig(**{**fields, "src_vocab": sv, "tgt_vocab": tv}))


def _load_data(spec: str, opts: dict, data_dir, vocab: dict | None = None):
    from ..data.parallel import load_parallel

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        data = load_parallel(spec, data_dir=data_dir, vocab=vocab, **opts)
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    return data


def cmd_train_seq2seq(args) -> int:
    from ..checkpoint import run_config
    from ..models import RNNSeq2Seq, Transformer
    from ..train import Trainer
    from ..train.tasks import Seq2SeqTask

    out = Path(args.out)
    model_over = given(args, args.model_fields)
    given_opts = _data_opts(args)
    if not args.resume:  # check the options before anything is read or written
        tcfg = train_config(args, None)
    saved = run_config(out, args.resume, ("transformer", "rnn"))
    if saved:
        cls = Transformer if saved["model_type"] == "transformer" else RNNSeq2Seq
        model_cfg = cls.config_class.from_dict(saved["model"])
        spec, opts = saved.get("data_spec"), saved.get("data_opts", {})
        refuse_model_changes(out, model_cfg, model_over, {
            "arch": (args.arch, _arch(saved["model_type"], saved["model"])), "data": (args.data, spec),
            **{k: (v, opts.get(k, DEFAULT_DATA_OPTS[k])) for k, v in given_opts.items()}})
        tcfg = train_config(args, saved)
        data = _load_data(spec, opts, args.data_dir, saved.get("vocab"))
        torch.manual_seed(tcfg.seed)
        model = cls(model_cfg)
    else:
        spec = args.data or "reverse"
        opts = {**DEFAULT_DATA_OPTS, **{k: v for k, v in given_opts.items() if v is not None}}
        if opts["min_len"] > opts["max_len"]:
            raise ValueError(f"--min-length {opts['min_len']} is larger than --max-length {opts['max_len']}")
        data = _load_data(spec, opts, args.data_dir)
        torch.manual_seed(tcfg.seed)
        model = _model_from_args(args, data, model_over)
    if isinstance(model, RNNSeq2Seq):
        model.teacher_forcing = args.teacher_forcing
    task = Seq2SeqTask(data, tcfg.batch_size, args.label_smoothing)
    trainer = Trainer(model, task, tcfg, out, meta={"data_spec": spec, "data_opts": opts})
    if args.resume:
        trainer.resume()
    n = sum(p.numel() for p in model.parameters())
    print(f"{model.model_type} {n / 1e6:.2f}M parameters | data {data.name} | vocab {data.src_vocab.size}/"
          f"{data.tgt_vocab.size} | {run_header(trainer)}", file=sys.stderr)
    result = trainer.fit()
    print(f"done: step {result['step']}, best val loss {result['best_val']:.4f}, run folder {out}", file=sys.stderr)
    return 0


def load_seq2seq(ckpt: str, device: str = "auto"):
    from ..checkpoint import load_model
    from ..data.parallel import Vocab
    from ..train.trainer import pick_device

    dev = pick_device(device)
    model, meta = load_model(ckpt, device=str(dev), with_meta=True)
    if model.model_type not in ("transformer", "rnn"):
        raise CheckpointError(f"{ckpt} holds a {model.model_type} model; this command needs a seq2seq model "
                              "(trained with `attnlab train seq2seq`)")
    return model, Vocab.from_dict(meta["vocab"]["src"]), Vocab.from_dict(meta["vocab"]["tgt"]), meta, dev


def translate_texts(model, sv, tv, texts, *, beam=5, alpha=1.0, max_len=None, device="cpu", batch_size=64):
    from ..data.parallel import pad_batch
    from ..decode import beam_search, greedy_decode

    limit = model.config.max_len
    max_len = max_len or min(limit - 1, 100)
    outs = []
    for i in range(0, len(texts), batch_size):
        ids = []
        for t in texts[i : i + batch_size]:
            e = sv.encode(t) or [sv.unk_id]
            if len(e) > limit:
                print(f"warning: a sentence of {len(e)} tokens was truncated to the model's maximum of {limit}",
                      file=sys.stderr)
                e = e[:limit]
            ids.append(e)
        src, mask = pad_batch(ids)
        src, mask = src.to(device), mask.to(device)
        if beam <= 1:
            outs += greedy_decode(model, src, mask, max_len=max_len)
        else:
            outs += [h[0].tokens for h in beam_search(model, src, mask, beam=beam, max_len=max_len, alpha=alpha)]
    return [tv.decode(o) for o in outs]


def cmd_translate(args) -> int:
    model, sv, tv, _, dev = load_seq2seq(args.ckpt, args.device)
    if args.text:
        texts = list(args.text)
    elif args.file:
        path = Path(args.file)
        if not path.is_file():
            raise ValueError(f"--file {path} does not exist")
        try:
            texts = path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"--file {path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None
    else:
        texts = sys.stdin.read().splitlines()
    if not any(t.strip() for t in texts):
        raise ValueError("no sentences to translate: give them as arguments, with --file, or on standard input")
    for line in translate_texts(model, sv, tv, texts, beam=args.beam, alpha=args.alpha, max_len=args.max_len, device=dev):
        print(line, flush=True)
    return 0


def cmd_eval_seq2seq(args) -> int:
    import sacrebleu

    from ..data.parallel import collate

    model, sv, tv, meta, dev = load_seq2seq(args.ckpt, args.device)

    # the run's own data, or --data encoded with the run's vocabulary
    data = _load_data(args.data or meta.get("data_spec"), meta.get("data_opts", {}), args.data_dir, meta["vocab"])
    split = args.split or "test"
    if split not in data.pairs:
        raise ValueError(f"{data.name} has no {split} split; use one of {', '.join(sorted(data.pairs))}")
    pairs, texts = data.pairs[split], data.texts[split]
    n = min(len(pairs), args.max_sentences)
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, n, args.batch_size):
            src, mask, tin, tout = (t.to(dev) for t in collate(pairs[i : min(n, i + args.batch_size)], data.max_len))
            logits = model(src, tin, mask)
            total += F.cross_entropy(logits.float().flatten(0, 1), tout.flatten(), ignore_index=0, reduction="sum").item()
            count += int((tout != 0).sum())
    t0 = time.perf_counter()
    hyps = translate_texts(model, sv, tv, [s for s, _ in texts[:n]], beam=args.beam, alpha=args.alpha, device=dev)
    decode_s = time.perf_counter() - t0
    refs = [t for _, t in texts[:n]]
    metric = sacrebleu.BLEU()
    bleu = metric.corpus_score(hyps, [refs])
    res = {"data": data.name, "split": split, "sentences": n, "loss": total / count, "perplexity": math.exp(total / count),
           "bleu": bleu.score, "bleu_signature": str(metric.get_signature()),
           "exact_match": sum(h == r for h, r in zip(hyps, refs)) / n, "beam": args.beam,
           "decode_s": decode_s, "sentences_per_s": n / decode_s}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{data.name} [{split}], {n} sentences: perplexity {res['perplexity']:.2f}, BLEU {bleu.score:.2f} "
              f"({res['bleu_signature']}), exact match {res['exact_match']:.3f}, beam {args.beam} "
              f"({res['sentences_per_s']:.1f} sentences/s)")
    return 0


def alignment(model, sv, tv, text: str, device="cpu"):
    """Greedy-translate ``text`` and return (source tokens, target tokens, {name: (T, S) weights})."""
    from ..data.parallel import pad_batch
    from ..decode import greedy_decode
    from ..inspect import capture_attention

    ids = sv.encode(text)[: model.config.max_len]
    if not ids:
        raise ValueError("--text is empty")
    src, mask = pad_batch([ids])
    out = greedy_decode(model, src.to(device), mask.to(device), max_len=min(100, model.config.max_len - 1))[0]
    tgt_in = torch.tensor([[1] + out], device=device)
    maps = {}
    with torch.no_grad():
        if model.model_type == "rnn":
            if model.config.attention == "none":
                raise ValueError("this RNN has no attention (attention='none'), so it has no alignment to draw")
            model(src.to(device), tgt_in, mask.to(device))
            maps["attention"] = model.last_alignment[0]
        else:
            with capture_attention(model, include="cross_attn") as rec:
                model(src.to(device), tgt_in, mask.to(device))
            per_layer = rec.maps()
            for name, w in sorted(per_layer.items()):
                layer = name.split(".")[1]
                for h in range(w.shape[1]):
                    maps[f"layer {layer} head {h}"] = w[0, h]
            maps["average"] = torch.stack([w[0].mean(0) for w in per_layer.values()]).mean(0)
    tok = lambda v, i: v.tokenizer.decode([i]) if v.tokenizer.kind == "bpe" else v.tokenizer.itos[i]  # noqa: E731
    src_tokens = [tok(sv, i) for i in ids]
    tgt_tokens = [tok(tv, i) for i in out] + ["<eos>"]
    return src_tokens, tgt_tokens, {k: v[: len(tgt_tokens), : len(src_tokens)].cpu() for k, v in maps.items()}


def cmd_inspect_alignment(args) -> int:
    import numpy as np

    from ..inspect.plots import alignment_png

    if not args.text:
        raise ValueError("inspect alignment needs --text \"a source sentence\"")
    model, sv, tv, _, dev = load_seq2seq(args.ckpt, "cpu")
    src_tokens, tgt_tokens, maps = alignment(model, sv, tv, args.text)
    out = Path(args.out)
    alignment_png(src_tokens, tgt_tokens, maps, out)
    np.savez(out.with_suffix(".npz"), **{k.replace(" ", "_"): v.numpy() for k, v in maps.items()})
    print(f"wrote {out} and {out.with_suffix('.npz')}")
    return 0
