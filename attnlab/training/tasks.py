"""Tasks: a dataset plus an objective, in the shape the trainer wants."""

from __future__ import annotations

import itertools
import math
import sys
from collections.abc import Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..checkpoint import unwrap_model
from ..data.images import normalize
from ..data.text import TokenData
from ..losses import cross_entropy


def batch_starts(n: int, batch_size: int, max_batches: int | None = None, what: str = "eval") -> Iterator[int]:
    """The start of each batch of ``batch_size`` over ``n`` examples (the first ``max_batches``
    batches only: None, all), with a progress bar on a terminal (never in a log file)."""
    from tqdm.auto import tqdm

    batches = -(-n // batch_size) if not max_batches else min(-(-n // batch_size), max_batches)
    bar = tqdm(range(batches), desc=what, unit="batch", leave=False, disable=not sys.stderr.isatty())
    return (i * batch_size for i in bar)


def confusion_matrix(y: Tensor, pred: Tensor, k: int) -> Tensor:
    """Counts (k, k): row = true class, column = predicted class."""
    cm = torch.zeros(k, k, dtype=torch.long)
    cm.index_put_((y, pred), torch.ones_like(y), accumulate=True)
    return cm


def classification_scores(pred: Tensor, true: Tensor, num_classes: int) -> dict:
    """Accuracy, macro-F1 (over the classes that are true or predicted at least once: a class
    absent from both does not count) and the confusion matrix (k, k) of predicted classes ``pred``
    (N,) against ``true`` (N,)."""
    cm = confusion_matrix(true, pred, num_classes)
    f1 = 2 * cm.diag().float() / (cm.sum(0) + cm.sum(1)).float().clamp_min(1)
    present = (cm.sum(1) + cm.sum(0)) > 0
    return {
        "accuracy": (pred == true).float().mean().item(),
        "macro_f1": f1[present].mean().item(),
        "confusion": cm,
    }


@torch.no_grad()
def language_model_scores(
    model: nn.Module, ids, block: int, tokenizer, *, batch_size: int = 16, max_batches: int | None = None, what="eval"
) -> dict:
    """The next-token loss of ``model`` over the token stream ``ids`` (1-D) cut into disjoint
    windows of ``block`` tokens (each token predicted once, from the window it falls in), in nats
    per token, and what it is in perplexity and in bits per token, per character and per byte of
    the decoded text: what ``attnlab eval`` reports for a language model."""
    ids = np.asarray(ids, dtype=np.int64)
    n_windows = (len(ids) - 1) // block
    if n_windows < 1:
        from ..errors import DataError

        raise DataError(f"the split has {len(ids)} tokens, fewer than one window of {block} + 1")
    x = torch.from_numpy(ids[: n_windows * block].reshape(n_windows, block))
    y = torch.from_numpy(ids[1 : n_windows * block + 1].reshape(n_windows, block))
    dev = next(model.parameters()).device
    total, count, scored = 0.0, 0, []
    for i in batch_starts(n_windows, batch_size, max_batches, what):
        xb, yb = x[i : i + batch_size].to(dev), y[i : i + batch_size].to(dev)
        total += cross_entropy(model(xb), yb, reduction="sum").item()
        count += yb.numel()
        scored.append(y[i : i + batch_size])
    decoded = tokenizer.decode(torch.cat(scored).flatten().tolist())
    loss = total / count
    return {
        "tokens": count,
        "loss": loss,
        "perplexity": math.exp(loss),
        "bits_per_token": loss / math.log(2),
        "bits_per_char": total / math.log(2) / len(decoded),
        "bits_per_byte": total / math.log(2) / len(decoded.encode("utf-8")),
    }


class LanguageModelTask:
    """Next-token prediction on random windows of a token stream (teacher forcing on every
    position at once: the causal mask lets one forward pass predict all T next tokens)."""

    static_shapes = True  # every training batch is (B, T): --compile auto may compile
    target_metric = "val_loss"  # --target: stop once the validation loss is at or below it

    def __init__(self, data: TokenData, block_size: int, batch_size: int, loss_chunk: int = 0):
        """``loss_chunk``: compute the loss this many tokens at a time inside the model (its
        ``targets=`` forward: the full fp32 logits are never held at once); 0: all at once."""
        self.data, self.block_size, self.loss_chunk = data, block_size, loss_chunk
        self.items_per_batch = block_size * batch_size
        for split in ("train", "val"):
            if len(getattr(data, split)) < block_size + 2:
                from ..errors import DataError

                raise DataError(
                    f"the corpus is too short: its {split} split has {len(getattr(data, split))} tokens, "
                    f"less than one block of {block_size} + 1; use more text or a smaller --block-size"
                )

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        return self.data.batch(split, batch_size, self.block_size, generator)

    def loss(self, model: nn.Module, batch) -> Tensor:
        x, y = batch
        if self.loss_chunk:  # (through the model's own call: DDP's hooks and the compiled graph see it)
            return model(x, targets=y, loss_chunk=self.loss_chunk)
        return cross_entropy(model(x), y)  # logits (B, T, V) against the next tokens (B, T)

    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 16, max_batches=None) -> dict:
        """:func:`language_model_scores` over the whole ``split`` in windows of the task's block."""
        data = getattr(self.data, split)
        scores = language_model_scores(
            model, data, self.block_size, self.data.tokenizer, batch_size=batch_size, max_batches=max_batches
        )
        return {"data": self.data.name, "split": split, **scores}

    def meta(self) -> dict:
        return {"tokenizer": self.data.tokenizer.to_dict(), "data": self.data.name}


class ChatTask:
    """Supervised fine-tuning of a chat model: next-token prediction on whole conversations,
    the loss on the tokens the assistant wrote only (its turns and the end of each; the system and
    user turns and the template's words are context). A batch is ``batch_size`` conversations,
    right-padded to the longest (padding is after every real token: the causal mask keeps it unseen)."""

    static_shapes = False  # conversations differ in length
    target_metric = "val_loss"

    def __init__(self, data, block_size: int, batch_size: int):
        """``data``: a :class:`attnlab.data.chat.ChatData`."""
        self.data, self.block_size = data, block_size
        mean = sum(len(ids) for ids, _ in data.train) / len(data.train)
        self.items_per_batch = max(1, int(batch_size * min(mean, block_size)))

    @staticmethod
    def collate(examples) -> tuple[Tensor, Tensor]:
        """x (B, T): the conversations right-padded with 0; y (B, T): the next token where the
        assistant wrote it, else -100 (no loss)."""
        width = max(len(ids) for ids, _ in examples) - 1
        x = torch.zeros(len(examples), width, dtype=torch.long)
        y = torch.full((len(examples), width), -100, dtype=torch.long)
        for row, (ids, mask) in enumerate(examples):
            n = len(ids) - 1
            x[row, :n] = torch.tensor(ids[:-1])
            targets = torch.tensor(ids[1:])
            y[row, :n] = torch.where(torch.tensor(mask[1:]), targets, torch.full_like(targets, -100))
        return x, y

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        examples = self.data.train if split == "train" else self.data.val
        picked = torch.randint(len(examples), (batch_size,), generator=generator).tolist()
        return self.collate([examples[i] for i in picked])

    def loss(self, model: nn.Module, batch) -> Tensor:
        x, y = batch
        return cross_entropy(model(x), y)  # (ignores the -100 positions: context and padding)

    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 16, max_batches=None) -> dict:
        """The loss and perplexity on the assistant's tokens of every conversation of ``split``."""
        examples = self.data.train if split == "train" else self.data.val
        device = next(model.parameters()).device
        total, count = 0.0, 0
        model.eval()
        with torch.no_grad():
            for n, start in enumerate(range(0, len(examples), batch_size)):
                if max_batches is not None and n >= max_batches:
                    break
                x, y = self.collate(examples[start : start + batch_size])
                x, y = x.to(device), y.to(device)
                total += float(cross_entropy(model(x), y, reduction="sum"))
                count += int((y != -100).sum())
        loss = total / max(count, 1)
        return {"data": self.data.name, "split": split, "loss": loss, "perplexity": math.exp(min(loss, 50)),
                "assistant_tokens": count, "conversations": len(examples)}  # fmt: skip

    def meta(self) -> dict:
        return {"tokenizer": self.data.tokenizer.to_dict(), "data": self.data.name, "task": "chat"}


class RepeatedSequenceTask:
    """Next-token prediction on random tokens whose last 2h tokens are a random segment of h
    tokens written twice (h from ``min_half`` to T/2 per batch, after a random prefix): the
    second copy is predictable only by looking back at the first, at a distance that changes
    from batch to batch, which is how induction heads form (Olsson et al. 2022)."""

    static_shapes = True

    def __init__(self, vocab_size: int, length: int, batch_size: int, min_half: int = 6):
        if not 1 <= min_half <= length // 2:
            raise ValueError(f"min_half must be from 1 to length/2 = {length // 2}, got {min_half}")
        self.vocab_size, self.length, self.min_half = vocab_size, length, min_half
        self.items_per_batch = batch_size * length

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        t, v = self.length + 1, self.vocab_size  # + 1: inputs and next-token targets
        h = int(torch.randint(self.min_half, t // 2 + 1, (1,), generator=generator))
        segment = torch.randint(v, (batch_size, h), generator=generator)
        prefix = torch.randint(v, (batch_size, t - 2 * h), generator=generator)
        seq = torch.cat([prefix, segment, segment], dim=1)
        return seq[:, :-1], seq[:, 1:]

    def loss(self, model: nn.Module, batch) -> Tensor:
        x, y = batch
        return cross_entropy(model(x), y)

    def meta(self) -> dict:
        return {"data": f"repeated random sequences (vocabulary {self.vocab_size}, length {self.length})"}


class ClassificationMetrics:
    """Validation accuracy for any task with ``predict(model, split, device=) -> (predicted,
    true labels)``; it is also what ``--target`` stops on."""

    target_metric = "val_acc"
    select_metric = "val_acc"  # best/ is the most accurate checkpoint, not the lowest loss

    num_classes: int

    def eval_metrics(self, model: nn.Module, device) -> dict:
        return {"val_acc": self.evaluate(model, "val", device=device)["accuracy"]}

    def evaluate(self, model: nn.Module, split: str = "test", *, device="cpu", **batches) -> dict:
        """:func:`classification_scores` of the model's predictions over ``split`` (``batches``:
        the task's ``predict`` options, e.g. ``batch_size``, ``max_batches``), with ``correct``
        (N,) whether each item was right: what ``eval``, the training curves and the claims read."""
        pred, y = self.predict(model, split, device=device, **batches)
        return {
            "split": split,
            "items": len(y),
            "correct": pred == y,
            **classification_scores(pred, y, self.num_classes),
        }


class ImageClassificationTask(ClassificationMetrics):
    """Images and labels; light augmentation on the training split (random crop after zero
    padding, horizontal flip where it makes sense), normalisation by training-split statistics."""

    static_shapes = True  # every training batch is (B, C, H, W): --compile auto may compile

    def __init__(
        self,
        splits,
        batch_size: int,
        *,
        pad: int = 1,
        flip: bool = False,
        label_smoothing: float = 0.0,
        rotate: float = 0.0,
        scale: float = 0.0,
        stats: tuple | None = None,
    ):
        """``stats``: the (mean, std) per channel that inputs are normalised by (default: the
        training split's; a trained model evaluated on other data keeps its own run's)."""
        self.splits, self.pad, self.flip, self.label_smoothing = splits, pad, flip, label_smoothing
        self.stats = stats
        self.rotate, self.scale = rotate, scale  # random affine: ± degrees, ± relative scale
        self.items_per_batch = batch_size

    @property
    def num_classes(self) -> int:
        return len(self.splits.labels)

    def normalize(self, x: Tensor) -> Tensor:
        mean, std = self.stats or (self.splits.mean, self.splits.std)
        return normalize(x, mean, std)

    def _affine(self, x: Tensor, g: torch.Generator) -> Tensor:
        b = x.shape[0]
        angle = (torch.rand(b, generator=g) * 2 - 1) * self.rotate * torch.pi / 180
        s = 1 + (torch.rand(b, generator=g) * 2 - 1) * self.scale
        cos, sin = torch.cos(angle) / s, torch.sin(angle) / s
        theta = torch.stack(
            [torch.stack([cos, -sin, torch.zeros(b)], -1), torch.stack([sin, cos, torch.zeros(b)], -1)], 1
        )
        grid = F.affine_grid(theta, list(x.shape), align_corners=False)
        return F.grid_sample(x, grid, padding_mode="zeros", align_corners=False)

    def _augment(self, x: Tensor, g: torch.Generator) -> Tensor:
        b, _, h, w = x.shape
        if self.rotate > 0 or self.scale > 0:
            x = self._affine(x, g)
        if self.pad > 0:
            p = self.pad
            padded = F.pad(x, (p, p, p, p))
            dy = torch.randint(0, 2 * p + 1, (b,), generator=g)
            dx = torch.randint(0, 2 * p + 1, (b,), generator=g)
            rows = (dy[:, None] + torch.arange(h)[None])[:, None, :, None]  # (B, 1, H, 1)
            cols = (dx[:, None] + torch.arange(w)[None])[:, None, None, :]  # (B, 1, 1, W)
            bi = torch.arange(b)[:, None, None, None]
            ci = torch.arange(x.shape[1])[None, :, None, None]
            x = padded[bi, ci, rows, cols]
        if self.flip:
            flip = torch.rand(b, generator=g) < 0.5
            x = torch.where(flip[:, None, None, None], x.flip(-1), x)
        return x

    def batch(self, split: str, batch_size: int, generator: torch.Generator) -> tuple[Tensor, Tensor]:
        x, y = getattr(self.splits, split)
        idx = torch.randint(len(x), (batch_size,), generator=generator)
        xb = x[idx]
        if split == "train":
            xb = self._augment(xb, generator)
        return self.normalize(xb), y[idx]

    def loss(self, model: nn.Module, batch) -> Tensor:
        x, y = batch
        return cross_entropy(model(x), y, label_smoothing=self.label_smoothing)

    def eval_loss(self, model: nn.Module, batch) -> Tensor:
        """The plain NLL (no label smoothing): what validation reports."""
        x, y = batch
        return cross_entropy(model(x), y)

    @torch.no_grad()
    def predict(
        self, model: nn.Module, split: str, batch_size: int = 256, device="cpu", max_batches: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Predicted and true labels over a whole split (its first ``max_batches`` batches), no
        augmentation: (N,), (N,)."""
        model.eval()
        x, y = getattr(self.splits, split)
        starts = batch_starts(len(x), batch_size, max_batches, f"eval {split}")
        preds = [model(self.normalize(x[i : i + batch_size].to(device))).argmax(-1).cpu() for i in starts]
        pred = torch.cat(preds)
        return pred, y[: len(pred)]

    def meta(self) -> dict:
        s = self.splits
        return {"data": s.name, "labels": s.labels, "mean": s.mean, "std": s.std, "data_note": s.note}


@torch.no_grad()
def translations(
    model: nn.Module,
    sources: list[list[int]],
    unk_id: int,
    tgt_vocab,
    *,
    beam: int = 1,
    alpha: float = 1.0,
    max_len: int | None = None,
    batch_size: int = 64,
) -> list[str]:
    """The model's translation of each source (token ids; an empty one reads as ``unk_id``) as
    text: greedy for ``beam`` 1, else beam search with length penalty ``alpha``; sources cut to
    the model's context, at most ``max_len`` tokens out (default: 100, within the context)."""
    from ..data.parallel import pad_batch
    from ..generate.beam import decode

    context, dev = model.config.context, next(model.parameters()).device
    max_len = max_len or min(context - 1, 100)
    hyps = []
    for i in range(0, len(sources), batch_size):
        src, mask = pad_batch([s[:context] or [unk_id] for s in sources[i : i + batch_size]])
        hyps += decode(model, src.to(dev), mask.to(dev), beam=beam, max_len=max_len, alpha=alpha)
    return [tgt_vocab.decode(h) for h in hyps]


class Seq2SeqTask:
    """Teacher forcing: the decoder reads <bos> y_1 … y_{n-1} and predicts y_1 … y_n <eos>;
    padding never enters the loss (ignore_index) nor attention (masks)."""

    def __init__(self, data, batch_size: int, label_smoothing: float = 0.0):
        self.data, self.label_smoothing = data, label_smoothing
        self.pad_id = data.tgt_vocab.pad_id
        self.items_per_batch = batch_size * 16  # rough tokens per batch, for throughput display

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        return self.data.batch(split, batch_size, generator)

    def batch_weight(self, batch) -> int:
        """Target tokens in ``batch``: the loss is their mean, so accumulation weighs by them."""
        return int((batch[3] != self.pad_id).sum())

    def loss(self, model: nn.Module, batch) -> Tensor:
        src, src_mask, tgt_in, tgt_out = batch
        return cross_entropy(
            model(src, tgt_in, src_mask), tgt_out, ignore_index=self.pad_id, label_smoothing=self.label_smoothing
        )

    @property
    def target_metric(self) -> str | None:
        """Synthetic tasks have a clear finish line: exact sequences on held-out inputs."""
        return "val_exact" if self.data.synthetic else None

    @torch.no_grad()
    def eval_metrics(self, model: nn.Module, device) -> dict:
        if not self.data.synthetic:
            return {}
        from ..data.parallel import pad_batch
        from ..generate.beam import greedy_decode

        model = unwrap_model(model).eval()  # decoding needs the model's own methods (not a DDP wrapper)
        pairs = self.data.pairs["val"][:200]
        src, mask = pad_batch([s for s, _ in pairs], self.data.src_vocab.pad_id)
        hyps = greedy_decode(model, src.to(device), mask.to(device), max_len=max(len(t) for _, t in pairs) + 2)
        return {"val_exact": sum(h == t for h, (_, t) in zip(hyps, pairs)) / len(pairs)}

    def eval_loss(self, model: nn.Module, batch) -> Tensor:
        """The plain NLL per target token (no label smoothing): what ``eval`` reports as
        log-perplexity, and what validation logs and selects the best checkpoint on."""
        src, src_mask, tgt_in, tgt_out = batch
        return cross_entropy(model(src, tgt_in, src_mask), tgt_out, ignore_index=self.pad_id)

    def translate(self, model: nn.Module, sources: list[list[int]], *, beam: int = 1, alpha: float = 1.0) -> list[str]:
        """:func:`translations` of the sources (token ids) into the task's target vocabulary."""
        return translations(model, sources, self.data.src_vocab.unk_id, self.data.tgt_vocab, beam=beam, alpha=alpha)

    @torch.no_grad()
    def evaluate(
        self,
        model: nn.Module,
        split: str = "test",
        *,
        batch_size: int = 16,
        max_batches: int | None = None,
        max_sentences: int | None = None,
        beam: int = 1,
        alpha: float = 1.0,
    ) -> dict:
        """The plain NLL per target token under teacher forcing (and its perplexity), then the
        model's own translations (greedy for ``beam`` 1, else beam search with length penalty
        ``alpha``) scored against the references: corpus BLEU (sacreBLEU; over characters on a
        synthetic task, whose "sentences" are strings of symbols) and exact matches. Over the
        first ``max_sentences`` of ``split`` (its first ``max_batches`` batches)."""
        import time

        import sacrebleu

        from ..data.parallel import collate

        d = self.data
        if split not in d.pairs:
            from ..errors import DataError

            raise DataError(f"{d.name} has no {split} split; use one of {', '.join(sorted(d.pairs))}")
        model = unwrap_model(model).eval()
        dev = next(model.parameters()).device
        pairs, texts = d.pairs[split], d.texts[split]
        n = min(len(pairs), max_sentences or len(pairs), (max_batches or len(pairs)) * batch_size)
        total, count = 0.0, 0
        for i in batch_starts(n, batch_size, what=f"eval {split}"):
            src, mask, tin, tout = (t.to(dev) for t in collate(pairs[i : min(n, i + batch_size)], d.max_len))
            total += cross_entropy(model(src, tin, mask), tout, ignore_index=self.pad_id, reduction="sum").item()
            count += int((tout != self.pad_id).sum())
        t0 = time.perf_counter()
        hyps = self.translate(model, [src for src, _ in pairs[:n]], beam=beam, alpha=alpha)
        decode_s = time.perf_counter() - t0
        refs = [t for _, t in texts[:n]]
        metric = sacrebleu.BLEU(tokenize="char") if d.synthetic else sacrebleu.BLEU()
        bleu = metric.corpus_score(hyps, [refs])
        return {
            "data": d.name,
            "split": split,
            "sentences": n,
            "loss": total / count,
            "perplexity": math.exp(total / count),
            "bleu": bleu.score,
            "bleu_signature": str(metric.get_signature()),
            "exact_match": sum(h == r for h, r in zip(hyps, refs)) / n,
            "beam": beam,
            "decode_s": decode_s,
            "sentences_per_s": n / decode_s,
        }

    def meta(self) -> dict:
        d = self.data
        meta = {
            "data": d.name,
            "vocab": {"src": d.src_vocab.to_dict(), "tgt": d.tgt_vocab.to_dict()},
            "seq_max_len": d.max_len,
        }
        if d.synthetic:
            meta["synthetic"] = d.synthetic
        return meta


class CaptionTask:
    """Teacher forcing on captions: the decoder reads <bos> w_1 … w_{n-1} (and the image) and
    predicts w_1 … w_n <eos>; one random reference per image per batch. The RNN with attention
    adds the doubly stochastic regulariser λ Σ_i (1 - Σ_t a_{t,i})²."""

    def __init__(self, data, batch_size: int, label_smoothing: float = 0.0):
        self.data, self.label_smoothing = data, label_smoothing
        self.pad_id = data.vocab.pad_id
        self.items_per_batch = batch_size
        self.parts: dict[str, float] | None = None  # the last training loss's terms

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        images, tgt_in, tgt_out = self.data.batch(split, batch_size, generator)
        return normalize(images, self.data.mean, self.data.std), tgt_in, tgt_out

    def loss(self, model: nn.Module, batch) -> Tensor:
        from ..models.caption import doubly_stochastic_penalty

        images, tgt_in, tgt_out = batch
        raw = unwrap_model(model)
        self.parts = None
        if not (raw.config.arch == "rnn-attention" and raw.config.alpha_c > 0 and model.training):
            return cross_entropy(
                model(images, tgt_in), tgt_out, ignore_index=self.pad_id, label_smoothing=self.label_smoothing
            )
        # the decoder's attention over the grid (not the image encoder's), with its gradient
        with raw.caching("attn.hook_pattern", detach=False) as cache:
            logits = model(images, tgt_in)
        loss = cross_entropy(logits, tgt_out, ignore_index=self.pad_id, label_smoothing=self.label_smoothing)
        alphas = cache["attn.hook_pattern"][:, 0]  # (B, 1, T, N) -> (B, T, N)
        penalty = raw.config.alpha_c * doubly_stochastic_penalty(alphas, tgt_out != self.pad_id)
        # logged apart: the penalty's floor is (N - T)^2 / N per image, most of the total on a large grid
        self.parts = {"cross_entropy": loss.item(), "attention_penalty": penalty.item()}
        return loss + penalty

    def batch_weight(self, batch) -> int:
        return int((batch[2] != self.pad_id).sum())

    def eval_loss(self, model: nn.Module, batch) -> Tensor:
        """The plain NLL per word (no smoothing, no regulariser): what validation reports."""
        images, tgt_in, tgt_out = batch
        return cross_entropy(model(images, tgt_in), tgt_out, ignore_index=self.pad_id)

    def meta(self) -> dict:
        d = self.data
        return {"data": d.name, "vocab": d.vocab.to_dict(), "mean": d.mean, "std": d.std, "data_note": d.note}


def bert_mask(
    ids: Tensor,
    special: Tensor,
    mask_id: int,
    vocab_size: int,
    generator: torch.Generator,
    prob: float = 0.15,
    never: tuple[int, ...] = (),
) -> tuple[Tensor, Tensor]:
    """BERT's masking: choose ``prob`` of the real tokens (``special`` (B, T) True for [CLS],
    [SEP], [PAD] is never chosen); of those 80 % become [MASK], 10 % a random token, 10 % stay.
    The random token is never one of ``never`` (the special tokens: a random [PAD] or [CLS]
    inside a sentence teaches nothing). Returns (inputs, targets) with targets -100 where nothing
    is predicted."""
    chosen = (torch.rand(ids.shape, generator=generator) < prob) & ~special
    targets = torch.where(chosen, ids, torch.full_like(ids, -100))
    roll = torch.rand(ids.shape, generator=generator)
    allowed = torch.tensor([i for i in range(vocab_size) if i not in set(never)])
    random_ids = allowed[torch.randint(len(allowed), ids.shape, generator=generator)]
    inputs = torch.where(chosen & (roll < 0.8), torch.full_like(ids, mask_id), ids)
    inputs = torch.where(chosen & (roll >= 0.8) & (roll < 0.9), random_ids, inputs)
    return inputs, targets


class MaskedLMTask:
    """Masked-language-model pretraining on token sequences: predict the masked tokens."""

    def __init__(self, data, batch_size: int):
        self.data = data
        self.items_per_batch = batch_size * data.avg_len

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        ids, mask = self.data.batch(split, batch_size, generator)
        tok = self.data.tokenizer
        special = (ids == tok.cls_id) | (ids == tok.sep_id) | (ids == tok.pad_id)
        inputs, targets = bert_mask(ids, special, tok.mask_id, tok.vocab_size, generator, never=tok.special_ids)
        return inputs, mask, targets

    def batch_weight(self, batch) -> int:
        return int((batch[2] != -100).sum())

    def loss(self, model: nn.Module, batch) -> Tensor:
        inputs, mask, targets = batch
        chosen = targets != -100  # the vocabulary projection only where a token is predicted
        return cross_entropy(model(inputs, mask, head="mlm", select=chosen), targets[chosen])

    @torch.no_grad()
    def evaluate(self, model: nn.Module, split: str = "val", *, batch_size: int = 16, max_batches=None) -> dict:
        """The loss and the accuracy on the masked tokens of ``split`` (its first ``max_batches``
        batches), masked by :func:`bert_mask` from a fixed seed: the same masks every time."""
        tok = self.data.tokenizer
        dev = next(model.parameters()).device
        gen = torch.Generator().manual_seed(0)
        total = correct = count = 0
        for ids, mask in itertools.islice(self.data.batches(split, batch_size), max_batches):
            special = (ids == tok.cls_id) | (ids == tok.sep_id) | (ids == tok.pad_id)
            inputs, targets = bert_mask(ids, special, tok.mask_id, tok.vocab_size, gen, never=tok.special_ids)
            logits = model.mlm_logits(inputs.to(dev), mask.to(dev)).cpu()
            total += cross_entropy(logits, targets, reduction="sum").item()
            chosen = targets != -100
            correct += int((logits.argmax(-1)[chosen] == targets[chosen]).sum())
            count += int(chosen.sum())
        return {
            "data": self.data.name,
            "split": split,
            "masked_tokens": count,
            "loss": total / max(count, 1),
            "accuracy_masked": correct / max(count, 1),
        }

    def meta(self) -> dict:
        return {"data": self.data.name, "tokenizer": self.data.tokenizer.to_dict()}


class GraphClassificationTask(ClassificationMetrics):
    """Graph classification on graphs drawn by ``make(count, generator) -> (adjacency (B, N, N),
    node_mask (B, N), labels (B,))``: fresh graphs for every training batch, a fixed set of
    ``eval_graphs`` for validation and for test (drawn from their own seeds)."""

    static_shapes = True

    def __init__(self, make, batch_size: int, eval_graphs: int = 512):
        self.make, self.items_per_batch = make, batch_size
        self.fixed = {
            split: make(eval_graphs, torch.Generator().manual_seed(seed)) for split, seed in (("val", 1), ("test", 2))
        }
        self.num_classes = int(max(labels.max() for _, _, labels in self.fixed.values())) + 1

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        return self.make(batch_size, generator) if split == "train" else self.fixed[split]

    def loss(self, model: nn.Module, batch) -> Tensor:
        adjacency, node_mask, labels = batch
        return cross_entropy(model(adjacency, node_mask), labels)

    @torch.no_grad()
    def predict(self, model: nn.Module, split: str, device="cpu", **forward) -> tuple[Tensor, Tensor]:
        """(predicted, true) classes of the fixed ``split`` graphs; ``forward`` goes to the model
        (``eigvecs=`` to try other eigenvector signs)."""
        model.eval()
        adjacency, node_mask, labels = self.fixed[split]
        return model(adjacency.to(device), node_mask.to(device), **forward).argmax(-1).cpu(), labels

    def meta(self) -> dict:
        return {"data": getattr(self.make, "__name__", "graphs")}


class TextClassificationTask(ClassificationMetrics):
    """Sequence classification from the pooled [CLS]."""

    head = "classify"  # the model's head this task trains

    def __init__(self, data, batch_size: int, label_smoothing: float = 0.0):
        self.data, self.label_smoothing = data, label_smoothing
        self.items_per_batch = batch_size
        self.num_classes = len(data.classes)

    def batch(self, split: str, batch_size: int, generator: torch.Generator):
        return self.data.batch(split, batch_size, generator)

    def loss(self, model: nn.Module, batch) -> Tensor:
        ids, mask, labels = batch
        return cross_entropy(model(ids, mask, head=self.head), labels, label_smoothing=self.label_smoothing)

    def eval_loss(self, model: nn.Module, batch) -> Tensor:
        ids, mask, labels = batch
        return cross_entropy(model(ids, mask, head=self.head), labels)

    @torch.no_grad()
    def predict(
        self, model: nn.Module, split: str, device="cpu", batch_size: int = 64, max_batches: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """(predicted, true) class of each text of ``split`` (of its first ``max_batches`` batches)."""
        model.eval()
        preds = []
        for ids, mask in itertools.islice(self.data.batches(split, batch_size), max_batches):
            preds.append(model.classify(ids.to(device), mask.to(device)).argmax(-1).cpu())
        pred = torch.cat(preds)
        return pred, torch.tensor(self.data.label_ids[split][: len(pred)])

    def meta(self) -> dict:
        return {"data": self.data.name, "tokenizer": self.data.tokenizer.to_dict()}


class TokenTaggingTask(TextClassificationTask):
    """Token classification: a tag for the first piece of every word (labels -100 elsewhere),
    the loss a mean over tagged tokens."""

    head = "tag"

    def batch_weight(self, batch) -> int:
        return int((batch[2] != -100).sum())

    @torch.no_grad()
    def predict(
        self, model: nn.Module, split: str, device="cpu", batch_size: int = 64, max_batches: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """(predicted tag, true tag) of every tagged token of ``split`` (of its first ``max_batches``
        batches), in order: (N,), (N,)."""
        model.eval()
        preds, trues = [], []
        for ids, mask, labels in itertools.islice(self.data.batches(split, batch_size), max_batches):
            scored = labels != -100
            preds.append(model.tag(ids.to(device), mask.to(device)).argmax(-1).cpu()[scored])
            trues.append(labels[scored])
        return torch.cat(preds), torch.cat(trues)
