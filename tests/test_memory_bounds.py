"""Bounds from memory and sizes, checked before any work: a batch that cannot fit, a generation
too long for one call, a vocabulary or synthetic length no run could use."""

import pytest
import torch

import attnlab
from attnlab.cli import main
from attnlab.models import GPT, GPTConfig
from attnlab.training import memory
from attnlab.training.tasks import LanguageModelTask
from helpers import PINNED_TRAINING


class Tokens:
    """A token stream for LanguageModelTask."""

    def __init__(self, n=5000, vocab=30):
        self.train = self.val = torch.randint(vocab, (n,), generator=torch.Generator().manual_seed(0))

    def batch(self, split, batch_size, block, generator):
        starts = torch.randint(len(self.train) - block - 1, (batch_size,), generator=generator)
        x = torch.stack([self.train[s : s + block] for s in starts])
        y = torch.stack([self.train[s + 1 : s + block + 1] for s in starts])
        return x, y


def test_activation_bytes_are_measured_and_grow_with_the_context():
    torch.manual_seed(0)
    small = memory.activation_bytes_per_example(
        GPT(GPTConfig(vocab_size=30, context=32, layers=2, heads=2, dim=32)), LanguageModelTask(Tokens(), 32, 4)
    )
    large = memory.activation_bytes_per_example(
        GPT(GPTConfig(vocab_size=30, context=64, layers=2, heads=2, dim=32)), LanguageModelTask(Tokens(), 64, 4)
    )
    deeper = memory.activation_bytes_per_example(
        GPT(GPTConfig(vocab_size=30, context=32, layers=4, heads=2, dim=32)), LanguageModelTask(Tokens(), 32, 4)
    )
    # the (32 x 32) stream alone is 4 KB per saved tensor; dozens are saved per layer
    assert 50_000 < small < 2_000_000
    assert 1.8 < large / small < 4.5 and 1.5 < deeper / small < 2.5


def test_a_batch_that_cannot_fit_is_refused_before_any_step(tmp_path, capsys):
    out = tmp_path / "run"
    assert main(["train", "gpt", "--preset", "nano", "--batch-size", "1000000000", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "--batch-size 1,000,000,000 needs about" in err and "give --batch-size" in err
    assert len(err.strip().splitlines()) == 1 and not out.exists()


def test_the_suggested_batch_fits_the_memory_given(tmp_path, monkeypatch):
    monkeypatch.setattr(memory, "available_bytes", lambda device: 60_000_000)  # 60 MB free
    options = dict(
        preset="nano", context=64, max_iters=1, eval_interval=1, eval_iters=1, progress=False, sample_chars=0
    )
    with pytest.raises(attnlab.errors.OptionError, match=r"give --batch-size ([\d,]+) or less") as refused:
        attnlab.train("gpt", out=tmp_path / "a", batch_size=4096, **options, **PINNED_TRAINING)
    suggested = int(refused.value.args[0].split("give --batch-size ")[1].split(" ")[0].replace(",", ""))
    assert 1 <= suggested < 4096
    run = attnlab.train("gpt", out=tmp_path / "b", batch_size=suggested, **options, **PINNED_TRAINING)
    assert run.step == 1
    with pytest.raises(attnlab.errors.OptionError):
        attnlab.train("gpt", out=tmp_path / "c", batch_size=4 * suggested + 8, **options, **PINNED_TRAINING)


def test_the_check_leaves_batch_norm_statistics_alone():
    from attnlab.models.cnn import CNN, CNNConfig
    from attnlab.training.runs import fits_in_memory
    from attnlab.training import TrainConfig

    class Images:
        def batch(self, split, batch_size, generator):
            return torch.rand(batch_size, 1, 8, 8, generator=generator), torch.zeros(batch_size, dtype=torch.long)

        def loss(self, model, batch):
            return torch.nn.functional.cross_entropy(model(batch[0]), batch[1])

    model = CNN(CNNConfig(in_chans=1, num_classes=3, widths=(4, 8), image_size=8))
    before = {n: b.clone() for n, b in model.named_buffers()}
    assert any("running_mean" in n for n in before)
    fits_in_memory(model, Images(), TrainConfig(batch_size=8, device="cpu"))
    for n, b in model.named_buffers():
        assert torch.equal(b, before[n]), n


@pytest.fixture(scope="module")
def tiny_gpt_run(tmp_path_factory):
    """A context-16 GPT run of one step (the generation bounds read it)."""
    return attnlab.train(
        "gpt",
        out=tmp_path_factory.mktemp("bounds") / "g",
        preset="nano",
        context=16,
        max_iters=1,
        eval_interval=1,
        eval_iters=1,
        batch_size=2,
        progress=False,
        **PINNED_TRAINING,
    )


def test_generation_and_sizes_have_bounds(tiny_gpt_run, tmp_path, capsys):
    model = GPT(GPTConfig(vocab_size=30, context=16, layers=1, heads=1, dim=8))
    from attnlab.generate import generate

    assert len(generate(model, [[1, 2]], 3)[0]) == 5
    run = tiny_gpt_run
    loaded = attnlab.load(run.out)
    with pytest.raises(attnlab.errors.OptionError, match="from 1 to 1,000,000"):  # (the CLI's words, below)
        loaded.generate("a", 10**15)
    assert main(["sample", "--ckpt", str(run.out), "--max-new-tokens", "2000000"]) == 2
    assert "from 1 to 1,000,000" in capsys.readouterr().err
    assert main(["train", "gpt", "--tokenizer", "bpe", "--vocab-size", "1000000000", "--out", str(tmp_path / "v")]) == 2
    assert "must be from 2 to 1,048,576" in capsys.readouterr().err and not (tmp_path / "v").exists()
    assert main(["train", "seq2seq", "--max-length", "100000", "--out", str(tmp_path / "s")]) == 2
    assert "do not fit the model's context of 256" in capsys.readouterr().err


def test_a_generation_whose_kv_cache_cannot_fit_is_refused(tiny_gpt_run, monkeypatch):
    run = tiny_gpt_run
    model = attnlab.load(run.out)
    per_row = 16 * model.config.layers * 2 * model.config.dim * 4  # positions x layers x (k, v) x width x fp32
    monkeypatch.setattr(memory, "available_bytes", lambda device: 10 * per_row)  # room for 10 rows
    assert len(model.generate(["a"] * 4, 3, batch_size=4)) == 4
    with pytest.raises(attnlab.errors.OptionError, match=r"give batch_size=10 or less"):
        model.generate(["a"] * 64, 3, batch_size=64)
