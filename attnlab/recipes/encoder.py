"""BERT-style text encoders: `attnlab train encoder --task mlm|classify|tag`, `eval` (masked-LM
loss and accuracy, or classification accuracy, macro-F1 and a confusion matrix), `predict` (a
label and its probabilities, or a tag per word) and `embed` (mean-pooled sentence vectors)."""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal, Sequence


from ..errors import CheckpointError, DataError, Note
from ..models.configs import ENCODER_PRESETS, TextEncoderConfig
from ..options import (
    Arg,
    Command,
    Device,
    at_least,
    below_one,
    checked,
    input_lines,
    texts_argument,
    vocab_size,
)
from . import register
from .base import (
    ModelKind,
    TINY_RUN,
    TextInspection,
    TrainOptions,
    Recipe,
    TrainingRun,
    Verbs,
    ConfusionPNG,
    Evaluation,
    TopK,
    confusion_figure,
    top_labels,
)
from ..outputs import output_file

if TYPE_CHECKING:
    import numpy as np


@dataclass(frozen=True)
class EncoderTrainOptions(TrainOptions):
    """The text encoder's own options of ``attnlab train encoder``: its task, data and start."""

    task: Annotated[
        Literal["mlm", "classify", "tag"] | None,
        Arg(
            "mlm: masked-language-model pretraining (default); classify: text classification; tag: a label per "
            "word (token classification)"
        ),
    ] = None
    data: Annotated[
        str | None,
        Arg(
            "mlm: python-docs (embedded, default) | shakespeare | a text file or folder; classify: "
            "python-docs-sections (embedded, default) | a text<TAB>label file; tag: synthetic-pos (embedded, "
            "default) | a text<TAB>tags file"
        ),
    ] = None
    init: Annotated[
        str | None,
        Arg("classify, tag: start from this pretrained encoder (an attnlab run or a HuggingFace BERT folder)"),
    ] = None
    vocab_size: Annotated[
        int | None,
        Arg("WordPiece vocabulary to train (default 4096; not with --init: its tokenizer is used)", vocab_size(16)),
    ] = None
    preset: Annotated[
        Literal[tuple(sorted(ENCODER_PRESETS))],  # type: ignore[valid-type]
        Arg("model shape (tiny: 2 layers, 2 heads, 128 wide)"),
    ] = "tiny"
    label_smoothing: Annotated[float | None, Arg("classify, tag: label smoothing (default 0)", below_one)] = None


class TextEncoderVerbs(Verbs):
    """A text encoder loaded by :func:`attnlab.load`: ``tokenizer``, ``embed`` and (classifiers) ``predict``."""

    def attach(self, meta: dict) -> None:
        try:  # a HuggingFace folder may hold the weights alone: the model still runs on token ids
            self.tokenizer = encoder_tokenizer(meta, self.checkpoint, self.config.vocab_size)
        except (CheckpointError, DataError, OSError):
            self.tokenizer = None

    def require_tokenizer(self):
        """The model's tokenizer, or the one-line error that says why it has none (a HuggingFace
        folder may hold the weights alone: the model still runs on token ids)."""
        if self.tokenizer is None:
            try:
                encoder_tokenizer(self.run_meta, self.checkpoint, self.config.vocab_size)  # (raises the reason)
            except OSError:
                pass
            raise CheckpointError(f"{self.checkpoint} has no tokenizer (no tokenizer in config.json, no vocab.txt)")
        return self.tokenizer

    @checked
    def embed(
        self,
        texts,
        attention_mask=None,
        *,
        batch_size: Annotated[int, Arg("texts per forward pass", at_least(1))] = 64,
    ):
        """Sentence embeddings: (D,) for one string, (N, D) NumPy for a list of them, ``batch_size``
        texts per forward pass (`attnlab embed`'s option). Token ids (B, T) with their mask give the
        model's own (B, D) tensor, as on an unloaded model."""
        import torch

        if isinstance(texts, torch.Tensor):
            return super().embed(texts, attention_mask)
        single = isinstance(texts, str)
        texts = _texts(texts, "embed")
        vectors = embed_texts(self, self.require_tokenizer(), texts, self.device, batch_size)
        return vectors[0] if single else vectors

    @checked
    def predict(self, texts, top_k: TopK = 3):
        """The ``top_k`` (label, probability) pairs of each text: a list per text, or one list for
        one. A tagger (``--task tag``) gives each text's (word, tag, probability) triples instead
        (words split on spaces)."""
        import torch

        from ..errors import OptionError

        if self.head is None:
            raise OptionError(
                "this encoder has no classification head; fine-tune it with "
                "attnlab.train('encoder', task='classify' or 'tag', ...)"
            )
        if self.config.per_token:
            single = isinstance(texts, str)
            out = [self._tag_words(t.split()) for t in _texts(texts, "predict")]
            return out[0] if single else out
        top_labels(torch.zeros(1, 1), [""], top_k)  # a bad top_k fails before any text is encoded
        single = isinstance(texts, str)
        ids, mask = encode_texts(self.require_tokenizer(), _texts(texts, "predict"), self.config.context)
        with torch.no_grad():
            probs = self.classify(ids.to(self.device), mask.to(self.device)).float().softmax(-1).cpu()
        out = top_labels(probs, list(self.config.labels or range(self.config.num_classes)), top_k)
        return out[0] if single else out

    def _tag_words(self, words: list[str]) -> list[tuple[str, str, float]]:
        import torch

        from ..data.tagged import encode_tagged

        ids, _, firsts, cut = encode_tagged(self.require_tokenizer(), words, None, {}, self.config.context)
        if cut:
            warnings.warn(
                f"the text is longer than the model's context of {self.config.context} tokens; its last "
                f"{len(words) - len(firsts)} words are not tagged",
                Note,
                stacklevel=3,
            )
        with torch.no_grad():
            probs = self.tag(torch.tensor([ids], device=self.device)).float().softmax(-1)[0, firsts].cpu()
        p, k = probs.max(-1)
        labels = self.config.labels or [str(i) for i in range(self.config.num_classes)]
        return [(w, labels[i], round(float(q), 4)) for w, i, q in zip(words, k.tolist(), p.tolist())]


def _texts(texts, what: str) -> list[str]:
    return texts_argument(texts, what)[0]


@register
class TextEncoderRecipe(Recipe):
    train_options = EncoderTrainOptions
    inspect_options = TextInspection
    tiny = dict(
        TINY_RUN,
        layers=1,
        heads=2,
        dim=16,
        mlp_dim=32,
        context=32,
        vocab_size=200,
    )
    name = "encoder"
    help = "a BERT-style text encoder: masked-LM pretraining, classification, sentence embeddings"
    description = (
        "Train a text encoder. --task mlm pretrains with BERT's masking (on the Python help pages that "
        "ship with Python, by default); --task classify fine-tunes on text<TAB>label lines (by default: "
        "which section of the Python documentation a paragraph comes from); --task tag labels every word, "
        "from text<TAB>tags lines with one tag per space-separated word (by default: synthetic-pos, "
        "part-of-speech tags of sentences where some words are nouns or verbs by context). Classify and "
        "tag start from scratch or from --init (an attnlab run or a HuggingFace BERT folder)."
    )
    models = {"text-encoder": ModelKind(TextEncoderConfig, "attnlab.models.encoder:TextEncoder", TextEncoderVerbs)}
    needs = "a text encoder (trained with `attnlab train encoder`, or a HuggingFace BERT folder)"
    presets = ENCODER_PRESETS
    set_by_data = ("vocab_size", "num_classes", "labels", "pad_id", "mlm_head", "per_token")
    explore_kind = "text"
    default_seconds = 275
    inspections = {
        "attention": "every layer's and head's attention on --text: query tokens down, key tokens across",
        "lens": "the masked-LM lens: each layer's top guess for every token of --text (write [MASK] to ask)",
    }
    train_defaults = replace(
        Recipe.train_defaults,
        batch_size=32,
        lr=5e-4,
        min_lr=5e-5,
        warmup_iters=100,
        max_iters=1500,
        weight_decay=0.01,
        beta2=0.98,
        eval_interval=250,
        eval_iters=5,
    )

    def check_new(self, o, model_over) -> None:
        if o.label_smoothing is not None and (o.task or "mlm") == "mlm":
            raise ValueError(
                "--label-smoothing applies to --task classify or tag (masked-LM pretraining does not smooth)"
            )
        if o.init and o.task not in ("classify", "tag"):  # (a new run's task defaults to mlm)
            raise ValueError(
                "--init starts a classifier from a pretrained encoder; use it with --task classify or --task tag"
            )
        if o.init and o.vocab_size:
            raise ValueError("--vocab-size trains a new tokenizer, but --init brings its own; drop one of them")
        shape = {k for k in model_over if k != "dropout"}
        if o.init and shape:
            raise ValueError(
                f"--init fixes the model's shape; drop {', '.join('--' + k.replace('_', '-') for k in sorted(shape))}"
            )

    def run_options(self, o, saved):
        return {"task": (o.task, saved.get("task")), "data": (o.data, saved.get("data_spec"))}

    def prepare(self, o, saved, model_over, tcfg, out):
        from ..data.labelled import load_labelled, load_pretraining_texts, tokenize
        from ..data.tagged import load_tagged, tokenize_tagged
        from ..tokens import WordPieceTokenizer, tokenizer_from_dict
        from ..training.tasks import MaskedLMTask, TextClassificationTask, TokenTaggingTask

        task_name = saved["task"] if saved else (o.task or "mlm")
        spec = saved.get("data_spec") if saved else o.data
        init_state = None
        supervised = task_name in ("classify", "tag")
        if task_name == "classify":
            labelled = load_labelled(spec)
            name, texts, labels, classes = labelled.name, labelled.texts, labelled.labels, labelled.classes
            if not saved and len(classes) < 2:  # (its accuracy would be 1.0 whatever it learned)
                raise DataError(
                    f"every training text of {name} has the label {classes[0]!r}: a classifier needs at least 2 "
                    "classes (its accuracy would be 1.0 whatever it learned)"
                )
        elif task_name == "tag":
            tagged = load_tagged(spec)
            name, classes = tagged.name, tagged.classes
            texts = {k: [" ".join(w) for w in v] for k, v in tagged.words.items()}  # for the tokenizer
        else:
            name, texts = load_pretraining_texts(spec, o.data_dir)
            labels, classes = None, None
        if saved:
            cfg = TextEncoderConfig.from_dict(saved["model"])
            tokenizer = tokenizer_from_dict(saved["tokenizer"])
            classes = cfg.labels if supervised else None
        elif o.init:
            pretrained = self.model_of(o.init, "cpu")
            tokenizer = pretrained.require_tokenizer()
            cfg = TextEncoderConfig(
                **{
                    **pretrained.config.to_dict(),
                    **model_over,
                    "mlm_head": False,
                    "num_classes": len(classes),
                    "labels": classes,
                    "per_token": task_name == "tag",
                }
            )
            init_state = {k: v for k, v in pretrained.state_dict().items() if not k.startswith(("mlm.", "head."))}
        else:
            tokenizer = WordPieceTokenizer.train(texts["train"], vocab_size=o.vocab_size or 4096)
            cfg = TextEncoderConfig(
                **{
                    **self.preset_fields(o),
                    **model_over,
                    "vocab_size": tokenizer.vocab_size,
                    "pad_id": tokenizer.pad_id,
                    "mlm_head": not supervised,
                    "num_classes": len(classes) if supervised else 0,
                    "labels": classes,
                    "per_token": task_name == "tag",
                }
            )
        if task_name == "tag":
            data = tokenize_tagged(tagged, tokenizer, cfg.context, classes)
        else:
            data = tokenize(name, tokenizer, texts, cfg.context, labels, classes)
        notes = []
        if data.truncated:
            notes.append(
                f"warning: {data.truncated} texts are longer than the model's context of {cfg.context} tokens; "
                "their first tokens are kept"
            )
        if supervised:
            kind = TokenTaggingTask if task_name == "tag" else TextClassificationTask
            task = kind(data, tcfg.batch_size, o.label_smoothing or 0.0)
        else:
            task = MaskedLMTask(data, tcfg.batch_size)

        def setup(model) -> None:
            if init_state is not None:
                missing, unexpected = model.load_state_dict(init_state, strict=False)
                if unexpected or [k for k in missing if not k.startswith(("head.", "mlm."))]:
                    raise CheckpointError(
                        f"--init {o.init} does not fit: missing {missing[:3]}, unexpected {unexpected[:3]}"
                    )

        counts = ", ".join(f"{len(v)} {k}" for k, v in data.ids.items())
        summary = (
            f"text encoder {cfg.layers} layers, {cfg.heads} heads, {cfg.dim} wide, context {cfg.context} | "
            f"{task_name} on {name}: {counts} texts, WordPiece vocabulary {tokenizer.vocab_size}"
            + (f", {len(classes)} {'tags' if task_name == 'tag' else 'classes'}" if classes else "")
            + (f" | from {o.init}" if o.init else "")
        )
        meta = {"data_spec": spec, "task": task_name, **({"init": str(o.init)} if o.init else {})}
        return TrainingRun("text-encoder", cfg, task, meta, summary, setup, notes)

    def finish(self, o, run, trainer, result) -> list[str]:
        if not hasattr(run.task, "predict"):  # pretraining
            return super().finish(o, run, trainer, result)
        test = run.task.evaluate(trainer.model, "test", device=trainer.device)
        what = "tagged words" if run.meta["task"] == "tag" else "texts"
        return [
            f"done: step {result['step']}, {result['seconds']:.0f}s, test accuracy of the last weights "
            f"{test['accuracy']:.4f} ({test['items']} {what}); {trainer.checkpoints_line()}; run folder {trainer.out}"
        ]

    # ---- embed, predict, eval ----------------------------------------------------------------------
    def commands(self) -> list[Command]:
        return [
            Command(
                "embed",
                "sentence embeddings from a text encoder",
                "One vector per input line: the mean of the last hidden states over the real tokens (as "
                "sentence-transformers pools).",
                embed_command,
                verbs=(TextEncoderVerbs.embed,),
            )
        ]

    def predict(self, ckpt, inputs: list[str], *, top_k: int, device: str) -> int:
        """``attnlab predict`` of a text classifier: the loaded model's ``predict``, printed."""
        texts = _texts(inputs, "predict")  # an empty text is refused before the model loads
        model = self.model_of(ckpt, device)
        if model.head is None:
            raise CheckpointError(
                f"{ckpt} is a pretrained encoder without a classifier; fine-tune it with "
                "`attnlab train encoder --task classify --init RUN` (or --task tag)"
            )
        if model.config.per_token:  # a tagger: word/TAG per word, a line per text
            for words in model.predict(texts):
                print(" ".join(f"{w}/{tag}" for w, tag, _ in words))
            return 0
        for text, top in zip(texts, model.predict(texts, top_k=top_k)):
            shown = ", ".join(f"{label} {p:.3f}" for label, p in top)
            print(f"{top[0][0]}\t{shown}\t{text[:60]}")
        return 0

    def evaluate(self, model, on: Evaluation, *, out: ConfusionPNG = None) -> tuple[dict, str]:
        """A tagger's accuracy and macro-F1 (and on the words seen with several tags in training,
        against each word's most frequent tag), a classifier's accuracy and macro-F1, or a masked
        LM's loss and accuracy on the masked tokens."""
        import torch

        from ..data.labelled import load_labelled, load_pretraining_texts, tokenize
        from ..data.tagged import load_tagged, tokenize_tagged, unigram_baseline
        from ..training.tasks import MaskedLMTask, TextClassificationTask, TokenTaggingTask

        out_file = output_file(out, ".png") if out else None  # (refused before any work)
        tok, spec, c = model.require_tokenizer(), on.data or model.run_meta.get("data_spec"), model.config
        batches = dict(batch_size=on.batch_size, max_batches=on.max_batches)
        if not c.per_token and not c.num_classes:
            split = on.split or "val"
            name, texts = load_pretraining_texts(spec, on.data_dir)
            if split not in texts:
                raise ValueError("masked-LM data has train and val splits; use --split val or train")
            res = MaskedLMTask(tokenize(name, tok, texts, c.context), on.batch_size).evaluate(model, split, **batches)
            return res, (
                f"{name} [{split}], {res['masked_tokens']} masked tokens: loss {res['loss']:.4f}, "
                f"accuracy {res['accuracy_masked']:.4f}"
            )
        split = on.split or "test"
        if c.per_token:
            data = load_tagged(spec)
            task = TokenTaggingTask(tokenize_tagged(data, tok, c.context, c.labels), on.batch_size)
            counted = "words"
        else:
            data = load_labelled(spec)
            ds = tokenize(data.name, tok, data.texts, c.context, data.labels, c.labels)
            task, counted = TextClassificationTask(ds, on.batch_size), "texts"
        scores = task.evaluate(model, split, device=model.device, **batches)
        res = {"data": data.name, "split": split, counted: scores["items"]}
        res.update(accuracy=scores["accuracy"], macro_f1=scores["macro_f1"])
        line = (
            f"{data.name} [{split}], {res[counted]} {'tagged words' if c.per_token else 'texts'}: accuracy "
            f"{res['accuracy']:.4f}, macro-F1 {res['macro_f1']:.4f}"
        )
        if c.per_token:
            # the words seen with several tags in training: where context must decide (the tagged
            # words in order are the scored tokens in order, so the two line up)
            base = unigram_baseline(data, split)
            sentences = data.words[split][: on.count(len(data.words[split]))]  # (--max-batches)
            words = [w.lower() for sentence in sentences for w in sentence]
            correct = scores["correct"]
            if len(words) != len(correct):  # texts cut at the context lose their last words' tags
                raise DataError(
                    f"{len(words) - len(correct)} words of {data.name} [{split}] fall beyond the model's context of "
                    f"{c.context} tokens; give shorter texts"
                )
            ambiguous = torch.tensor([w in base["ambiguous"] for w in words], dtype=torch.bool)
            res["ambiguous_words"] = int(ambiguous.sum())
            res["ambiguous_accuracy"] = correct[ambiguous].float().mean().item() if ambiguous.any() else float("nan")
            res["unigram_accuracy"] = base["accuracy"]
            res["unigram_ambiguous_accuracy"] = base["ambiguous_accuracy"]
            line += (
                f"; on the {res['ambiguous_words']} words seen with several tags in training "
                f"{res['ambiguous_accuracy']:.4f} (each word's most frequent tag: "
                f"{res['unigram_ambiguous_accuracy']:.4f})"
            )
        return res, line + confusion_figure(scores, c.labels, f"{data.name} {split}", out_file, res)

    def inspect(self, model, what: str, out: Path, o: TextInspection) -> dict:
        import numpy as np
        import torch

        from ..inspect.lens import lens_table, mlm_lens
        from ..inspect.plots import lens_png, token_attention_png

        if not o.text:
            raise ValueError(f'inspect {what} needs --text "some text" (with [MASK] where the model should guess)')
        tok, dev = model.require_tokenizer(), model.device
        if what == "attention":
            ids, mask = encode_texts(tok, [o.text], model.config.context)
            with torch.no_grad():
                _, cache = model.run_with_cache(ids.to(dev), mask.to(dev), names=["encoder.blocks.*.attn.hook_pattern"])
            maps = torch.stack(cache.layers("attn.hook_pattern")).float().cpu()[:, 0]  # (L, H, T, T)
            tokens = [tok.id_to_token(i) for i in ids[0].tolist()]
            token_attention_png(tokens, tokens, maps.numpy(), out, title=f"attention on {o.text[:60]!r}")
            return {"attention": maps.numpy(), "tokens": np.array(tokens)}
        if model.mlm is None:
            raise ValueError(
                f"{model.checkpoint} has no masked-LM head (a classifier): the lens reads an --task mlm run"
            )
        ids, mask = encode_texts(tok, [o.text], model.config.context)
        logits = mlm_lens(model, ids.to(dev), mask.to(dev))[:, 0]  # (L + 1, T, vocab)
        table = lens_table(logits, ids[0].tolist(), tok.id_to_token, top_k=3)
        lens_png(table, out, title="masked-LM lens: each layer's top guess for each token (colour: its probability)")
        return {"top_probs": table["top_probs"], "tokens": np.array(table["tokens"])}

    def explore(self, model, text: str | None = None) -> dict:
        import torch

        from ..inspect.detectors import pattern_scores
        from ..inspect.explorer import NEURON_VIEW_MAX, neuron_view, neuron_view_points

        if not text:
            raise ValueError('explore a text encoder with --text "some text"')
        tok, dev = model.require_tokenizer(), model.device
        ids, mask = encode_texts(tok, [text], model.config.context)
        neuron = ids.shape[1] <= NEURON_VIEW_MAX  # the neuron view (q, k, q·k) for short texts
        names = ["encoder.blocks.*.attn.hook_pattern", *(neuron_view_points("encoder.blocks") if neuron else [])]
        with torch.no_grad():
            _, cache = model.run_with_cache(ids.to(dev), mask.to(dev), names=names)
        patterns = torch.stack(cache.layers("attn.hook_pattern")).float().cpu()  # (L, 1, H, T, T)
        return {
            "kind": "text",
            "tokens": [tok.id_to_token(i) for i in ids[0].tolist()],
            "attention": patterns[:, 0].numpy(),
            "detectors": {k: v.numpy() for k, v in pattern_scores(patterns, ids).items()},
            **(neuron_view(cache) if neuron else {}),
        }


def encoder_tokenizer(meta: dict, ckpt, vocab_size: int):
    """The WordPiece tokenizer of a text-encoder run (config.json) or of a HuggingFace BERT folder."""
    from ..tokens import WordPieceTokenizer, tokenizer_from_dict

    tok = tokenizer_from_dict(meta["tokenizer"]) if meta.get("tokenizer") else WordPieceTokenizer.load(ckpt)
    if tok.vocab_size > vocab_size:
        raise CheckpointError(
            f"the tokenizer of {ckpt} has {tok.vocab_size} tokens but the model only "
            f"{vocab_size}: they do not belong together"
        )
    return tok


def encode_texts(tok, texts: list[str], context: int):
    """(ids (B, T), mask (B, T)) of ``[CLS] text [SEP]``, truncated to ``context`` (with a warning)."""
    from ..data.labelled import encode_truncated
    from ..data.parallel import pad_batch

    encoded = [encode_truncated(tok, t, context) for t in texts]
    cut = sum(c for _, c in encoded)
    if cut:
        warnings.warn(
            f"{cut} texts were longer than the model's context of {context} tokens and were truncated",
            Note,
            stacklevel=3,
        )
    return pad_batch([e for e, _ in encoded], tok.pad_id)


def embed_texts(model, tok, texts: list[str], device, batch_size: int) -> np.ndarray:
    """Mean-pooled sentence embeddings (N, D)."""
    import torch

    out = []
    with torch.no_grad():
        for i in range(0, len(texts), batch_size):
            ids, mask = encode_texts(tok, texts[i : i + batch_size], model.config.context)
            out.append(model.embed(ids.to(device), mask.to(device)).float().cpu())
    return torch.cat(out).numpy()


def embed_command(
    ckpt: Annotated[str, Arg("run folder of a text encoder, or a HuggingFace BERT folder")],
    text: Annotated[
        Sequence[str], Arg("texts (default: lines from --file or standard input)", flags=("text",), nargs="*")
    ] = (),
    *,
    file: Annotated[str | None, Arg("read texts from this file, one per line")] = None,
    out: Annotated[str | None, Arg("write the vectors to this .npy file (default: JSON lines on stdout)")] = None,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab embed``: one vector per input line (``options``: the ``embed`` verb's, ``batch_size``)."""
    import numpy as np

    from ..outputs import output_file

    out_file = output_file(out, ".npy") if out else None
    model = TextEncoderRecipe.model_of(ckpt, device)
    model.require_tokenizer()
    texts = input_lines(list(text), file)
    if not texts or any(not t.strip() for t in texts):
        raise DataError("embed needs non-empty lines of text (an empty line has no tokens to pool)")
    vectors = model.embed(texts, **options)
    if out_file is not None:
        with open(out_file, "wb") as f:  # np.save(path) would add .npy to any other name
            np.save(f, vectors)
        print(f"wrote {len(vectors)} vectors of {vectors.shape[1]} to {out_file}", file=sys.stderr)
    else:
        for v in vectors:
            print(json.dumps([round(float(x), 6) for x in v]))
    return 0
