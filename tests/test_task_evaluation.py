"""Each task owns its evaluation (``Task.evaluate``): the numbers checked against hand counts and
plain torch, and the paths that read them (training's validation accuracy, a claim's test
accuracy, ``attnlab eval``) agreeing with it."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attnlab.training.tasks import (
    ImageClassificationTask,
    LanguageModelTask,
    classification_scores,
    language_model_scores,
)


def test_classification_scores_by_hand():
    true = torch.tensor([0, 0, 1, 1, 2])
    pred = torch.tensor([0, 1, 1, 1, 0])
    s = classification_scores(pred, true, num_classes=4)  # class 3: neither true nor predicted
    assert s["accuracy"] == pytest.approx(3 / 5)
    # F1 per class: 0: tp 1, 2 true + 2 predicted -> 2/4; 1: tp 2, 2 + 3 -> 4/5; 2: tp 0 -> 0
    assert s["macro_f1"] == pytest.approx((0.5 + 0.8 + 0.0) / 3)
    assert s["confusion"].tolist() == [[1, 1, 0, 0], [0, 2, 0, 0], [1, 0, 0, 0], [0, 0, 0, 0]]


class _Bigram(nn.Module):
    """logits (B, T, V) from the current token only: a model whose loss is easy to recompute."""

    def __init__(self, vocab: int):
        super().__init__()
        self.table = nn.Embedding(vocab, vocab)

    def forward(self, x):
        return self.table(x)


class _Chars:
    def decode(self, ids):
        return "".join("ab c\né"[i % 6] for i in ids)  # one character each, "é" two bytes


def test_language_model_scores_against_plain_torch():
    torch.manual_seed(0)
    model = _Bigram(6)
    ids = np.random.default_rng(0).integers(0, 6, size=103)
    block = 10
    got = language_model_scores(model, ids, block, _Chars(), batch_size=4)
    n = (len(ids) - 1) // block  # 10 disjoint windows, the last 2 tokens unscored
    x = torch.as_tensor(ids[: n * block]).view(n, block)
    y = torch.as_tensor(ids[1 : n * block + 1]).view(n, block)
    with torch.no_grad():
        nll = F.cross_entropy(model(x).flatten(0, 1), y.flatten(), reduction="sum").item()
    text = _Chars().decode(y.flatten().tolist())
    assert got["tokens"] == n * block
    assert got["loss"] == pytest.approx(nll / (n * block), rel=1e-6)
    assert got["perplexity"] == pytest.approx(math.exp(nll / (n * block)), rel=1e-6)
    assert got["bits_per_char"] == pytest.approx(nll / math.log(2) / len(text), rel=1e-6)
    assert got["bits_per_byte"] == pytest.approx(nll / math.log(2) / len(text.encode()), rel=1e-6)
    # --max-batches: the first batches only, and bits per character over their text alone
    part = language_model_scores(model, ids, block, _Chars(), batch_size=4, max_batches=1)
    with torch.no_grad():
        nll4 = F.cross_entropy(model(x[:4]).flatten(0, 1), y[:4].flatten(), reduction="sum").item()
    assert part["tokens"] == 4 * block and part["loss"] == pytest.approx(nll4 / (4 * block), rel=1e-6)
    assert part["bits_per_char"] == pytest.approx(nll4 / math.log(2) / (4 * block), rel=1e-6)


def test_language_model_task_evaluates_its_split():
    from attnlab.data.text import TokenData

    rng = np.random.default_rng(1)
    data = TokenData(rng.integers(0, 6, 200), rng.integers(0, 6, 50), _Chars(), "random")
    task = LanguageModelTask(data, block_size=8, batch_size=4)
    model = _Bigram(6)
    got = task.evaluate(model, "val", batch_size=3)
    assert got["data"] == "random" and got["split"] == "val"
    assert got == {
        "data": "random",
        "split": "val",
        **language_model_scores(model, data.val, 8, _Chars(), batch_size=3),
    }


class _Splits:
    """Four 1x2x2 images per split whose class is the sign of their mean."""

    def __init__(self):
        x = torch.tensor([-1.0, -0.5, 0.5, 1.0]).view(4, 1, 1, 1).expand(4, 1, 2, 2).contiguous()
        y = torch.tensor([0, 0, 1, 1])
        self.train = self.val = self.test = (x, y)
        self.labels, self.mean, self.std = ["neg", "pos"], [0.0], [1.0]


class _SignOfMean(nn.Module):
    def __init__(self, flip_last: bool = False):
        super().__init__()
        self.w = nn.Parameter(torch.ones(1))
        self.flip_last = flip_last

    def forward(self, x):
        m = x.mean((1, 2, 3)) * self.w
        logits = torch.stack([-m, m], -1)
        if self.flip_last:
            logits[-1] = -logits[-1]
        return logits


def test_image_classification_evaluate_counts_batches_and_statistics():
    task = ImageClassificationTask(_Splits(), batch_size=2)
    got = task.evaluate(_SignOfMean(flip_last=True), "test", batch_size=2)
    # each batch of 2 has its last image flipped: images 1 and 3 wrong
    assert got["items"] == 4 and got["accuracy"] == 0.5 and got["correct"].tolist() == [True, False, True, False]
    first = task.evaluate(_SignOfMean(flip_last=True), "test", batch_size=2, max_batches=1)
    assert first["items"] == 2 and first["accuracy"] == 0.5
    # another run's statistics shift every input: a mean of +2 makes every image negative
    shifted = ImageClassificationTask(_Splits(), batch_size=2, stats=([2.0], [1.0]))
    assert shifted.evaluate(_SignOfMean(), "test")["accuracy"] == 0.5
    assert task.eval_metrics(_SignOfMean(), "cpu") == {"val_acc": 1.0}  # what training logs reads the same
