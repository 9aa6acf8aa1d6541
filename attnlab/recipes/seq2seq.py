"""Sequence to sequence: `attnlab train seq2seq` (Transformer, RNN with and without attention),
`attnlab translate`, `eval` (perplexity, sacreBLEU) and `inspect alignment`."""

from __future__ import annotations

import warnings
from pathlib import Path
from dataclasses import dataclass, replace
from typing import Annotated, Any, Literal, Sequence


from ..models.configs import RNNConfig, TransformerConfig
from ..errors import Note
from ..options import (
    checked,
    Beam,
    LengthPenalty,
    Arg,
    Device,
    Command,
    texts_argument,
    below_one,
    fraction,
    input_lines,
    positive_int,
    vocab_size,
)
from . import register
from .base import ModelKind, TINY_RUN, Evaluation, Recipe, TextInspection, TrainingRun, TrainOptions, Verbs


class Seq2SeqVerbs(Verbs):
    """A seq2seq model loaded by :func:`attnlab.load`: ``src_vocab``, ``tgt_vocab`` and ``translate``."""

    def attach(self, meta: dict) -> None:
        from ..data.parallel import Vocab

        self.src_vocab, self.tgt_vocab = Vocab.from_dict(meta["vocab"]["src"]), Vocab.from_dict(meta["vocab"]["tgt"])

    @checked
    def translate(
        self,
        texts: str | list[str],
        *,
        beam: Beam = 5,
        alpha: LengthPenalty = 1.0,
        max_len: Annotated[int | None, Arg("longest output in tokens (default 100)", positive_int)] = None,
    ):
        """The translation of one sentence (a string) or of each of a list: ``beam`` 1 = greedy,
        ``alpha`` its length penalty, ``max_len`` the longest output (`attnlab translate`'s options)."""
        texts, single = texts_argument(texts, "translate")
        out = translate_texts(self, self.src_vocab, self.tgt_vocab, texts, beam=beam, alpha=alpha, max_len=max_len)
        return out[0] if single else out


@dataclass(frozen=True)
class Seq2SeqTrainOptions(TrainOptions):
    """The seq2seq family's own options of ``attnlab train seq2seq``: its data, architecture and task."""

    data: Annotated[
        str | None,
        Arg(
            "copy | reverse | sort | addition | dates | reorder (synthetic, default reverse) | multi30k | "
            "SRC_FILE:TGT_FILE | FILE.tsv"
        ),
    ] = None
    src: Annotated[str | None, Arg("source language for multi30k (default de)")] = None
    tgt: Annotated[str | None, Arg("target language for multi30k (default en)")] = None
    arch: Annotated[
        Literal["transformer", "rnn", "rnn-attention"] | None,
        Arg("transformer (default), rnn (no attention: one context vector), rnn-attention (Bahdanau)"),
    ] = None
    tokenizer: Annotated[Literal["char", "bpe"] | None, Arg("default: bpe for text, char for synthetic")] = None
    vocab_size: Annotated[int | None, Arg("BPE vocabulary size (default 8000)", vocab_size(8))] = None
    separate_vocab: Annotated[bool, Arg("separate source/target BPE (default: joint)")] = False
    min_length: Annotated[int | None, Arg("synthetic tasks: shortest input (default 5)", positive_int)] = None
    max_length: Annotated[int | None, Arg("synthetic tasks: longest input (default 20)", positive_int)] = None
    label_smoothing: Annotated[float, Arg("label smoothing", below_one)] = 0.1
    teacher_forcing: Annotated[float, Arg("RNN teacher-forcing ratio", fraction)] = 1.0


ARCH_ATTENTION = {"rnn": "none", "rnn-attention": "additive"}
DEFAULT_DATA = "reverse"  # the embedded default: a synthetic task
DEFAULT_DATA_OPTS = dict(
    src_lang="de", tgt_lang="en", tokenizer=None, vocab_size=8000, joint=True, min_len=5, max_len=20
)


def arch_of(model_type: str, model_cfg: dict) -> str:
    """The --arch of a saved model."""
    if model_type == "transformer":
        return "transformer"
    return "rnn" if model_cfg.get("attention") == "none" else "rnn-attention"


@register
class Seq2SeqRecipe(Recipe):
    train_options = Seq2SeqTrainOptions
    inspect_options = TextInspection
    tiny = dict(
        TINY_RUN,
        data="copy",
        min_length=3,
        max_length=5,
        dim=32,
        heads=2,
        enc_layers=1,
        dec_layers=1,
        mlp_dim=32,
    )
    name = "seq2seq"
    help = "a translation model: Transformer, or RNN with/without attention"
    description = (
        "Train an encoder-decoder on parallel text with teacher forcing. With no --data it learns a "
        "synthetic task generated on the fly (reverse)."
    )
    models = {
        "transformer": ModelKind(TransformerConfig, "attnlab.models.seq2seq:Transformer", Seq2SeqVerbs),
        "rnn": ModelKind(RNNConfig, "attnlab.models.rnn:RNNSeq2Seq", Seq2SeqVerbs),
    }
    needs = "a seq2seq model (trained with `attnlab train seq2seq`)"
    set_by_data = ("src_vocab", "tgt_vocab", "pad_id", "bos_id", "eos_id")
    explore_kind = "cross"
    # synthetic tasks stop once 99 % of held-out sequences come out exactly right (val_exact)
    train_defaults = replace(
        Recipe.train_defaults,
        batch_size=64,
        lr=1e-3,
        min_lr=1e-5,
        warmup_iters=200,
        max_iters=2000,
        weight_decay=0.01,
        beta2=0.98,
        eval_interval=250,
        eval_iters=10,
        target=0.99,
    )
    default_seconds = (62, 171)  # reverse: about 1,300 steps until 99 % exact (benchmarks/first_hour.py, 12-07)
    # a synthetic task is learned by a smaller Transformer, faster (sized to the task: 0.34M
    # parameters). One layer each side learns reverse in as many steps as two (1,300-1,400) at
    # half the cost per step: 55-59 s instead of ~2 minutes, 99.4-99.6 % exact on 500 fresh inputs
    # (benchmarks/README.md, embedded defaults)
    SYNTHETIC_TRANSFORMER = dict(dim=128, heads=4, enc_layers=1, dec_layers=1, mlp_dim=256, dropout=0.0)
    SYNTHETIC_TRAIN = dict(lr=2e-3, warmup_iters=100, eval_interval=100)
    inspections = {
        "attention": "cross-attention of a translation: target words down, source words across (--text)",
        "alignment": "the same as attention (its older name)",
    }

    @staticmethod
    def data_options(o) -> dict:
        """The data options given on the command line (None where not given)."""
        return dict(
            src_lang=o.src,
            tgt_lang=o.tgt,
            tokenizer=o.tokenizer,
            vocab_size=o.vocab_size,
            joint=False if o.separate_vocab else None,
            min_len=o.min_length,
            max_len=o.max_length,
        )

    def train_defaults_for(self, o):
        from ..data.sources import SYNTHETIC

        synthetic = (o.data or DEFAULT_DATA) in SYNTHETIC
        return replace(self.train_defaults, **(self.SYNTHETIC_TRAIN if synthetic else {}))

    def preset_fields(self, o) -> dict:
        """A Transformer on a synthetic task starts from the smaller shape sized to it."""
        from ..data.sources import SYNTHETIC

        synthetic = (o.data or DEFAULT_DATA) in SYNTHETIC
        return dict(self.SYNTHETIC_TRANSFORMER) if synthetic and (o.arch or "transformer") == "transformer" else {}

    def check_new(self, o, model_over) -> None:
        arch = o.arch or "transformer"
        own = TransformerConfig if arch == "transformer" else RNNConfig
        foreign = sorted(k for k in model_over if k not in own.__dataclass_fields__)
        if foreign:
            raise ValueError(
                f"--arch {arch} has no option{'s' if len(foreign) > 1 else ''} "
                f"{', '.join('--' + k.replace('_', '-') for k in foreign)}; see attnlab train seq2seq --help"
            )
        opts = {**DEFAULT_DATA_OPTS, **{k: v for k, v in self.data_options(o).items() if v is not None}}
        if opts["min_len"] > opts["max_len"]:
            raise ValueError(f"--min-length {opts['min_len']} is larger than --max-length {opts['max_len']}")
        from ..data.sources import SYNTHETIC

        context = model_over.get("context", own.context)
        if (o.data or DEFAULT_DATA) in SYNTHETIC and opts["max_len"] + 2 > context:  # (before building them)
            raise ValueError(
                f"--max-length {opts['max_len']:,}: synthetic sequences of up to {opts['max_len'] + 2:,} tokens "
                f"(with <bos> and <eos>) do not fit the model's context of {context}; give --context "
                f"{opts['max_len'] + 2} or a smaller --max-length"
            )

    def run_options(self, o, saved):
        opts = saved.get("data_opts", {})
        return {
            "arch": (o.arch, arch_of(saved["model_type"], saved["model"])),
            "data": (o.data, saved.get("data_spec")),
            **{k: (v, opts.get(k, DEFAULT_DATA_OPTS[k])) for k, v in self.data_options(o).items()},
        }

    def prepare(self, o, saved, model_over, tcfg, out):
        from ..training.tasks import Seq2SeqTask

        if saved:
            mtype, spec, opts = saved["model_type"], saved.get("data_spec"), saved.get("data_opts", {})
            data = load_data(spec, opts, o.data_dir, saved.get("vocab"))
            cfg = self.models[mtype].config_class.from_dict(saved["model"])
        else:
            spec = o.data or DEFAULT_DATA
            opts = {**DEFAULT_DATA_OPTS, **{k: v for k, v in self.data_options(o).items() if v is not None}}
            data = load_data(spec, opts, o.data_dir)
            arch = o.arch or "transformer"
            fields = {
                **model_over,
                "src_vocab": data.src_vocab.size,
                "tgt_vocab": data.tgt_vocab.size,
                **data.tgt_vocab.special_ids(),
            }
            if arch == "transformer":
                mtype = "transformer"
                fields.setdefault("share_embeddings", data.src_vocab is data.tgt_vocab)
                fields = {**self.preset_fields(o), **fields}
            else:
                mtype = "rnn"
                fields.setdefault("attention", ARCH_ATTENTION[arch])
            cfg = self.models[mtype].config_class(**fields)

        def setup(model) -> None:
            if isinstance(model.config, RNNConfig):
                model.teacher_forcing = o.teacher_forcing

        task = Seq2SeqTask(data, tcfg.batch_size, o.label_smoothing)
        summary = f"{mtype} | data {data.name} | vocab {data.src_vocab.size}/{data.tgt_vocab.size}"
        return TrainingRun(mtype, cfg, task, {"data_spec": spec, "data_opts": opts}, summary, setup)

    # ---- translate, eval, inspect alignment ------------------------------------------------------
    def commands(self) -> list[Command]:
        return [
            Command(
                "translate",
                "translate sentences with a trained seq2seq model",
                "Prints one translation per input line (arguments, --file or stdin).",
                translate,
                verbs=(Seq2SeqVerbs.translate,),
            )
        ]

    def evaluate(
        self,
        model,
        on: Evaluation,
        *,
        beam: Beam = 1,
        alpha: LengthPenalty = 1.0,
        max_sentences: Annotated[int, Arg("seq2seq: evaluate at most this many", positive_int)] = 100_000,
    ) -> tuple[dict, str]:
        from ..training.tasks import Seq2SeqTask

        meta = model.run_meta
        # the run's own data, or --data encoded with the run's vocabulary
        data = load_data(on.data or meta.get("data_spec"), meta.get("data_opts", {}), on.data_dir, meta["vocab"])
        task = Seq2SeqTask(data, on.batch_size)
        split, n = on.split or "test", max_sentences
        res = task.evaluate(
            model, split, batch_size=on.batch_size, max_batches=on.max_batches, max_sentences=n, beam=beam, alpha=alpha
        )
        return res, (
            f"{data.name} [{split}], {res['sentences']} sentences: perplexity {res['perplexity']:.2f}, BLEU "
            f"{res['bleu']:.2f} ({res['bleu_signature']}), exact match {res['exact_match']:.3f}, beam "
            f"{beam} ({res['sentences_per_s']:.1f} sentences/s)"
        )

    def inspect(self, model, what: str, out: Path, o: TextInspection) -> dict:
        from ..inspect.plots import alignment_png

        if not o.text:
            raise ValueError(f'inspect {what} needs --text "a source sentence"')
        src_tokens, tgt_tokens, maps = alignment(model, model.src_vocab, model.tgt_vocab, o.text)
        alignment_png(src_tokens, tgt_tokens, maps, out)
        return {k.replace(" ", "_"): v.numpy() for k, v in maps.items()}

    def explore(self, model, src: str | None = None, tgt: str | None = None) -> dict:
        from ..inspect.explorer import cross_attention

        if not src:
            raise ValueError('explore a seq2seq model with --src "a source sentence" [--tgt "its translation"]')
        return cross_attention(model, model.src_vocab, model.tgt_vocab, src, tgt)


def load_data(spec: str, opts: dict, data_dir, vocab: dict | None = None):
    """Parallel data (its warnings printed as one line each)."""
    from ..data.parallel import load_parallel

    return load_parallel(spec, data_dir=data_dir, vocab=vocab, **opts)


def translate_texts(model, sv, tv, texts, *, beam=5, alpha=1.0, max_len=None, batch_size=64):
    """Translate ``texts`` (greedy for ``beam`` 1), in batches; one string per input. A sentence
    with what the vocabulary never saw, or longer than the model's context, is said as a Note."""
    from ..training.tasks import translations

    limit, sources = model.config.context, []
    for n, t in enumerate(texts, 1):
        unseen = sv.unknown(t)
        if unseen:
            shown = ", ".join(repr(c) for c in unseen[:5]) + (" …" if len(unseen) > 5 else "")
            warnings.warn(
                f"sentence {n} holds what this model's vocabulary never saw ({shown}); it reads those as "
                "<unk>, so its translation of them is a guess",
                Note,
                stacklevel=2,
            )
        e = sv.encode(t)
        if len(e) > limit:
            warnings.warn(
                f"a sentence of {len(e)} tokens was truncated to the model's maximum of {limit}", Note, stacklevel=2
            )
        sources.append(e)
    return translations(model, sources, sv.unk_id, tv, beam=beam, alpha=alpha, max_len=max_len, batch_size=batch_size)


def translate(
    ckpt: Annotated[str, Arg("run folder of a seq2seq model")],
    text: Annotated[
        Sequence[str],
        Arg("sentences to translate (default: read lines from --file or stdin)", flags=("text",), nargs="*"),
    ] = (),
    *,
    file: Annotated[str | None, Arg("read sentences from this file, one per line")] = None,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab translate``: one translation per input line (``options``: :meth:`Seq2SeqVerbs.translate`'s)."""
    model = Seq2SeqRecipe.model_of(ckpt, device)
    texts = input_lines(list(text), file)
    if not any(t.strip() for t in texts):
        raise ValueError("no sentences to translate: give them as arguments, with --file, or on standard input")
    said = iter(model.translate([t for t in texts if t.strip()], **options))
    for text in texts:  # (one line out per line in: an empty line stays empty)
        print(next(said) if text.strip() else "", flush=True)
    return 0


def alignment(model, sv, tv, text: str):
    """Greedy-translate ``text`` and return (source tokens, target tokens, {name: (T, S) weights}):
    every decoder layer and head of the explorer's :func:`cross_attention`, and their average
    (an RNN with attention has one map)."""
    import torch

    from ..inspect.explorer import cross_attention

    data = cross_attention(model, sv, tv, text)
    att = torch.from_numpy(data["attention"])  # (L, H, T, S)
    if model.model_type == "rnn":
        maps = {"attention": att[0, 0]}
    else:
        maps = {f"layer {layer} head {h}": att[layer, h] for layer in range(att.shape[0]) for h in range(att.shape[1])}
        maps["average"] = att.mean((0, 1))
    return data["source"], data["target"], maps
