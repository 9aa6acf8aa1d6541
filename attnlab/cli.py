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
import os
import sys
import typing
from pathlib import Path

from . import __version__
from .errors import AttnlabError

EPILOG = "Every command has --help. Data directory: --data-dir or the ATTNLAB_DATA environment variable."


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad option in one line (what is wrong, where to look) and exits 2."""

    def error(self, message: str) -> typing.NoReturn:
        self.exit(2, f"error: {message} (see {self.prog} --help)\n")


def _number(kind, low, low_ok: bool, high=None, what: str = ""):
    """An argparse type: ``kind`` (int or float) in the range from ``low`` (inclusive when
    ``low_ok``) up to ``high`` (inclusive)."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if (v < low if low_ok else v <= low) or (high is not None and v > high):
            raise argparse.ArgumentTypeError(f"{text} is out of range: must be {what}")
        return v

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


positive_int = _number(int, 1, True, what="at least 1")
nonneg_int = _number(int, 0, True, what="0 or more")
nonneg_float = _number(float, 0.0, True, what="0 or more")
positive_float = _number(float, 0.0, False, what="more than 0")
probability = _number(float, 0.0, False, 1.0, what="in (0, 1]")
fraction = _number(float, 0.0, True, 1.0, what="in [0, 1]")


def device_name(text: str) -> str:
    from .train.trainer import check_device_name

    try:
        check_device_name(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).replace("--device ", "")) from None
    return text


def _field_options(parser: argparse.ArgumentParser, cls, skip=(), title: str = "", group=None) -> list[str]:
    """One --option per dataclass field (default None = 'not given'); returns the field names."""
    group = group or parser.add_argument_group(title)
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


LM_TRAIN_DEFAULTS: dict = {}
VISION_TRAIN_DEFAULTS = dict(batch_size=128, lr=1e-3, min_lr=1e-5, warmup_iters=100, max_iters=2000,
                             weight_decay=0.05, beta2=0.999, eval_interval=250, eval_iters=5)
SEQ2SEQ_TRAIN_DEFAULTS = dict(batch_size=64, lr=1e-3, min_lr=1e-5, warmup_iters=200, max_iters=2000,
                              weight_decay=0.01, beta2=0.98, eval_interval=250, eval_iters=10)


def build_parser() -> argparse.ArgumentParser:
    from .models.cnn import CNNConfig
    from .models.gpt import GPT_PRESETS, GPTConfig
    from .models.rnn import RNNConfig
    from .models.seq2seq import TransformerConfig
    from .models.vit import VIT_PRESETS, ViTConfig
    from .train.trainer import TrainConfig

    p = _Parser(
        prog="attnlab",
        description="Transformers the way they are taught: train, sample, evaluate and look inside.",
        epilog=EPILOG,
    )
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)

    train = sub.add_parser("train", help="train a model (gpt, vit, cnn, seq2seq)", description="Train a model with the shared trainer.")
    tsub = train.add_subparsers(dest="model", metavar="MODEL", parser_class=_Parser)
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
    gpt.add_argument("--vocab-size", type=_number(int, 2, True, what="at least 2"), default=None, help="BPE vocabulary size (default 1024)")
    gpt.add_argument("--preset", default="shakespeare-cpu", choices=sorted(GPT_PRESETS),
                     help="model shape to start from (default: shakespeare-cpu = 4 layers, 4 heads, 128 wide, context 64)")
    gpt.add_argument("--out", default="runs/gpt", help="run folder for checkpoints, metrics and plots (default: runs/gpt)")
    gpt.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    gpt.add_argument("--sample-chars", type=nonneg_int, default=300, help="print a sample of this many tokens at the end (0: none)")
    model_fields = _field_options(gpt, GPTConfig, skip=("vocab_size",), title="model (overrides the preset)")
    train_fields = _field_options(gpt, TrainConfig, title="training")
    gpt.set_defaults(func="lm:cmd_train_gpt", model_fields=model_fields, train_fields=train_fields,
                     train_defaults=LM_TRAIN_DEFAULTS)

    for name, cfg_cls, helptext in (("vit", ViTConfig, "a Vision Transformer image classifier"),
                                    ("cnn", CNNConfig, "the small CNN baseline (for comparisons)")):
        v = tsub.add_parser(name, help=helptext, epilog=EPILOG,
                            description=f"Train {helptext} on digits (embedded, default), mnist, cifar10 or a "
                                        "folder with one sub-folder per class.")
        v.add_argument("--data", default=None, help="digits (embedded, default) | mnist | cifar10 | FOLDER")
        v.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
        v.add_argument("--out", default=f"runs/{name}", help=f"run folder (default: runs/{name})")
        v.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
        v.add_argument("--label-smoothing", type=_number(float, 0.0, True, 0.99, what="in [0, 1)"), default=0.0, help="label smoothing of the loss (default 0)")
        v.add_argument("--pad", type=nonneg_int, default=None, help="random-crop padding in pixels (default: image size / 8)")
        v.add_argument("--flip", action=argparse.BooleanOptionalAction, default=None,
                       help="random horizontal flips (default: on for cifar10, off for digits/mnist)")
        v.add_argument("--rotate", type=_number(float, 0.0, True, 180.0, what="from 0 to 180 degrees"), default=None,
                       help="random rotation of ± this many degrees, with ± rotate%% scaling (default: 10 for "
                            "digits/mnist, 0 for cifar10)")
        if name == "vit":
            v.add_argument("--preset", default=None, choices=sorted(VIT_PRESETS),
                           help="model shape (default: picked from the data: digits, mnist or cifar)")
            mf = _field_options(v, ViTConfig, skip=("num_classes", "in_chans", "labels"), title="model (overrides the preset)")
        else:
            mf = []
        tf = _field_options(v, TrainConfig, title="training")
        v.set_defaults(func="vision:cmd_train_vision", model_fields=mf, train_fields=tf,
                       train_defaults=VISION_TRAIN_DEFAULTS, arch=name)

    s2 = tsub.add_parser("seq2seq", help="a translation model: Transformer, or RNN with/without attention",
                         epilog=EPILOG, description="Train an encoder-decoder on parallel text with teacher forcing. "
                         "With no --data it learns a synthetic task generated on the fly (reverse).")
    s2.add_argument("--data", default=None,
                    help="copy | reverse | sort | addition | dates (synthetic, default reverse) | multi30k | "
                         "SRC_FILE:TGT_FILE | FILE.tsv")
    s2.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    s2.add_argument("--src", default=None, help="source language for multi30k (default de)")
    s2.add_argument("--tgt", default=None, help="target language for multi30k (default en)")
    s2.add_argument("--arch", choices=["transformer", "rnn", "rnn-attention"], default=None,
                    help="transformer (default), rnn (no attention: one context vector), rnn-attention (Bahdanau)")
    s2.add_argument("--tokenizer", choices=["char", "bpe"], default=None, help="default: bpe for text, char for synthetic")
    s2.add_argument("--vocab-size", type=_number(int, 8, True, what="at least 8"), default=None, help="BPE vocabulary size (default 8000)")
    s2.add_argument("--separate-vocab", action="store_true", help="separate source/target BPE (default: joint)")
    s2.add_argument("--min-length", type=positive_int, default=None, help="synthetic tasks: shortest input (default 5)")
    s2.add_argument("--max-length", type=positive_int, default=None, help="synthetic tasks: longest input (default 20)")
    s2.add_argument("--label-smoothing", type=_number(float, 0.0, True, 0.99, what="in [0, 1)"), default=0.1, help="label smoothing (default 0.1)")
    s2.add_argument("--teacher-forcing", type=fraction, default=1.0, help="RNN teacher-forcing ratio (default 1.0)")
    s2.add_argument("--out", default="runs/seq2seq", help="run folder (default: runs/seq2seq)")
    s2.add_argument("--resume", action="store_true", help="continue the run in --out from its last checkpoint")
    grp = s2.add_argument_group("model")
    mf = _field_options(s2, TransformerConfig, skip=("src_vocab", "tgt_vocab"), group=grp)
    mf += _field_options(s2, RNNConfig, skip=("src_vocab", "tgt_vocab", *mf), group=grp)
    tf = _field_options(s2, TrainConfig, title="training")
    s2.set_defaults(func="seq2seq:cmd_train_seq2seq", model_fields=mf, train_fields=tf,
                    train_defaults=SEQ2SEQ_TRAIN_DEFAULTS)

    tr = sub.add_parser("translate", help="translate sentences with a trained seq2seq model",
                        description="Prints one translation per input line (arguments, --file or stdin).")
    tr.add_argument("--ckpt", required=True, help="run folder of a seq2seq model")
    tr.add_argument("text", nargs="*", help="sentences to translate (default: read lines from --file or stdin)")
    tr.add_argument("--file", default=None, help="read sentences from this file, one per line")
    tr.add_argument("--beam", type=positive_int, default=5, help="beam size; 1 = greedy (default 5)")
    tr.add_argument("--alpha", type=nonneg_float, default=1.0, help="length penalty exponent (GNMT; default 1.0)")
    tr.add_argument("--max-len", type=positive_int, default=None, help="longest output in tokens (default 100)")
    tr.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda")
    tr.set_defaults(func="seq2seq:cmd_translate")

    b = sub.add_parser("bench", help="benchmark attnlab against its peers and this machine's peak",
                       description="Attention, GPT training and generation, ViT and encoder-decoder training steps, "
                       "each against a peer (HuggingFace, torch.nn) measured in the same run, with model FLOPs "
                       "utilisation against the matmul peak measured at the start. Runs on CUDA when present.")
    b.add_argument("--quick", action="store_true", help="small shapes: about a minute on 2 CPU cores")
    b.add_argument("--compile", action=argparse.BooleanOptionalAction, default=None,
                   help="add torch.compile rows (default: on with CUDA, off on CPU where compiling takes minutes)")
    b.add_argument("--only", nargs="+", choices=["attention", "gpt", "generate", "vit", "encdec"], default=None,
                   help="run only these row groups (default: all)")
    b.add_argument("--json", default=None, help="write the table as JSON to this file")
    b.add_argument("--markdown", default=None, help="write the table as Markdown to this file")
    b.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda")
    b.set_defaults(func="dispatch:cmd_bench")

    s = sub.add_parser("sample", help="generate text from a trained GPT", description="Continue a prompt, streaming tokens as they come.")
    s.add_argument("--ckpt", required=True, help="run folder (or checkpoint / HuggingFace folder)")
    s.add_argument("--prompt", default="", help="text to continue (default: start from a newline)")
    s.add_argument("--max-new-tokens", type=positive_int, default=500, help="tokens to generate per sample (default 500)")
    s.add_argument("--temperature", type=nonneg_float, default=0.8, help="softmax temperature; 0 = greedy (default 0.8)")
    s.add_argument("--top-k", type=nonneg_int, default=200, help="sample only from the k most likely tokens (default 200; 0 = off)")
    s.add_argument("--top-p", type=probability, default=None, help="nucleus sampling: smallest set with this total probability")
    s.add_argument("--num-samples", type=positive_int, default=1, help="how many samples (default 1)")
    s.add_argument("--stop", action="append", default=[], help="stop a sample at this string (repeatable)")
    s.add_argument("--seed", type=nonneg_int, default=1337, help="random seed (default 1337)")
    s.add_argument("--no-cache", action="store_true", help="recompute the whole prefix each step instead of using the KV cache")
    s.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda")
    s.set_defaults(func="lm:cmd_sample")

    e = sub.add_parser("eval", help="evaluate a trained model (loss/perplexity, or accuracy)",
                       description="Language models: loss, perplexity and bits per character/byte on the validation "
                       "split. Image classifiers: accuracy on the test split and a confusion-matrix PNG.")
    e.add_argument("--ckpt", required=True, help="run folder or checkpoint folder")
    e.add_argument("--data", default=None, help="evaluate on this data instead of the run's own")
    e.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    e.add_argument("--split", choices=["val", "train", "test"], default=None,
                   help="which split (default: val for language models, test for classifiers)")
    e.add_argument("--block-size", type=positive_int, default=None, help="LM window length (default: the model's context)")
    e.add_argument("--batch-size", type=positive_int, default=16, help="examples per forward pass (default 16)")
    e.add_argument("--max-tokens", type=positive_int, default=200_000, help="LM: evaluate at most this many tokens (default 200000)")
    e.add_argument("--out", default=None, help="classifiers: confusion-matrix PNG (default: <run>/confusion.png)")
    e.add_argument("--beam", type=positive_int, default=1, help="seq2seq: beam size for BLEU (default 1 = greedy)")
    e.add_argument("--alpha", type=nonneg_float, default=1.0, help="seq2seq: beam length penalty exponent (default 1.0)")
    e.add_argument("--max-sentences", type=positive_int, default=100_000, help="seq2seq: evaluate at most this many")
    e.add_argument("--json", action="store_true", help="print the metrics as one JSON object")
    e.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda")
    e.set_defaults(func="dispatch:cmd_eval")

    pr = sub.add_parser("predict", help="classify image files with a trained ViT or CNN",
                        description="Print the top-k classes with probabilities for each image.")
    pr.add_argument("--ckpt", required=True, help="run folder of an image classifier")
    pr.add_argument("images", nargs="+", metavar="IMAGE", help="image files (PNG, JPEG, ...)")
    pr.add_argument("--top-k", type=positive_int, default=3, help="classes to show per image (default 3)")
    pr.add_argument("--device", type=device_name, default="auto", help="auto | cpu | cuda")
    pr.set_defaults(func="vision:cmd_predict")

    ins = sub.add_parser("inspect", help="look inside a trained model (PNG + raw numbers)",
                         description="Attention maps, rollout, patch-embedding components, position similarity, "
                         "mean attention distance, CKA. Each writes a PNG and its numbers (.npz) beside it.")
    ins.add_argument("what", choices=["attention", "rollout", "embeddings", "positions", "distance", "cka",
                                      "alignment"], help="what to draw")
    ins.add_argument("--ckpt", required=True, help="run folder")
    ins.add_argument("--image", default=None, help="image file (attention, rollout)")
    ins.add_argument("--text", default=None, help="alignment: the source sentence to translate")
    ins.add_argument("--out", required=True, help="PNG file to write")
    ins.add_argument("--token", type=nonneg_int, default=0, help="attention: query token to show (default 0 = class token)")
    ins.add_argument("--head-fusion", choices=["mean", "max", "min"], default="mean", help="rollout: how to fuse heads")
    ins.add_argument("--discard-ratio", type=_number(float, 0.0, True, 0.99, what="in [0, 1)"), default=0.0, help="rollout: drop this fraction of the weakest weights")
    ins.add_argument("--compare", default=None, help="cka: a second run folder (e.g. the CNN baseline)")
    ins.add_argument("--kernel", choices=["linear", "rbf"], default="linear", help="cka kernel (default linear)")
    ins.add_argument("--n-images", type=_number(int, 4, True, what="at least 4"), default=512, help="distance/cka: test images to use (default 512)")
    ins.add_argument("--batch-size", type=_number(int, 4, True, what="at least 4"), default=128, help="cka: minibatch size (default 128)")
    ins.add_argument("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    ins.set_defaults(func="dispatch:cmd_inspect")
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, "func", None):
            if args.command:  # e.g. `attnlab train` without a model: show that command's help
                parser.parse_args([args.command, "--help"])
            parser.print_help()
            return 0
    except SystemExit as e:  # --help, --version, or a bad option (already reported in one line)
        return e.code if isinstance(e.code, int) else 0
    from .checkpoint import abandon_new_runs, release_runs
    from .train.trainer import TrainingInterrupted

    import importlib

    module, name = args.func.split(":")
    func = getattr(importlib.import_module(f".commands.{module}", __package__), name)
    try:
        return func(args) or 0
    except TrainingInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (AttnlabError, ValueError, OSError) as e:
        abandon_new_runs()
        print(f"error: {one_line(e)}", file=sys.stderr)
        return 2
    except Exception as e:  # a bug, or a case nobody foresaw: still one line, the traceback on request
        abandon_new_runs()
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        print(f"error: unexpected {type(e).__name__}: {one_line(e)} (set ATTNLAB_DEBUG=1 to see the traceback, "
              "and please report it)", file=sys.stderr)
        return 1
    finally:
        release_runs()


def one_line(e: BaseException) -> str:
    """The first line of an exception's message; OS errors name the file they are about."""
    if isinstance(e, OSError) and not isinstance(e, AttnlabError) and e.filename is not None:
        return f"{e.strerror or type(e).__name__}: {e.filename}"
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


if __name__ == "__main__":
    raise SystemExit(main())
