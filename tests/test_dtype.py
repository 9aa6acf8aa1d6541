"""Both branches of `--dtype auto` on every machine (the capability check is overridden), and
bf16 training compared with fp32 at a bf16 tolerance."""

import pytest
import torch
import torch.nn.functional as F

from attnlab.data.text import prepare
from attnlab.models import GPT, GPTConfig
from attnlab.training import LanguageModelTask, TrainConfig, Trainer
from attnlab.training import devices as T
from attnlab.training import trainer as trainer_module

TEXT = "the quick brown fox jumps over the lazy dog. " * 100


def _gpt(width: int) -> GPT:
    return GPT(GPTConfig(vocab_size=32, block_size=16, n_layer=1, n_head=2, n_embd=width))


def test_capability_override(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "1")
    assert T.cpu_has_fast_bf16() is True
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "0")
    assert T.cpu_has_fast_bf16() is False


def test_auto_on_a_cpu_without_fast_bf16_is_fp32(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "0")
    dtype, why = T.pick_dtype("auto", torch.device("cpu"), _gpt(512))
    assert dtype == torch.float32 and "no fast bf16" in why


def test_auto_on_a_fast_bf16_cpu_keeps_narrow_models_in_fp32(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "1")
    dtype, why = T.pick_dtype("auto", torch.device("cpu"), _gpt(64))
    assert dtype == torch.float32 and "width 64" in why


def test_auto_on_a_fast_bf16_cpu_times_wide_models(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "1")
    dtype, why = T.pick_dtype("auto", torch.device("cpu"), _gpt(T.CPU_BF16_MIN_WIDTH))
    assert dtype is None and "timing" in why


@pytest.mark.parametrize("speedup, expected", [(2.0, torch.bfloat16), (1.0, torch.float32), (0.5, torch.float32)])
def test_trainer_takes_the_faster_dtype_and_leaves_the_run_untouched(tmp_path, monkeypatch, speedup, expected):
    """The start-up timing runs on a copy: weights, optimizer and RNG states are as without it."""
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "1")
    (tmp_path / "c.txt").write_text(TEXT)
    data = prepare(str(tmp_path / "c.txt"), tmp_path / "run" / "data")

    def fake_time_call(fn, dtype):  # runs the step, reports bf16 as `speedup` times faster
        fn(dtype)
        return 1.0 / speedup if dtype == torch.bfloat16 else 1.0

    torch.manual_seed(0)
    model = GPT(
        GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=T.CPU_BF16_MIN_WIDTH)
    )
    before = {k: v.clone() for k, v in model.state_dict().items()}
    monkeypatch.setattr(trainer_module, "time_call", fake_time_call)
    cfg = TrainConfig(max_iters=1, batch_size=2, progress=False)
    trainer = Trainer(model, LanguageModelTask(data, 16, 2), cfg, tmp_path / "run")
    assert trainer.dtype == expected, trainer.dtype_reason
    assert "timed" in trainer.dtype_reason
    assert torch.equal(torch.get_rng_state(), torch.Generator().manual_seed(cfg.seed).get_state())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not trainer.optimizer.state


def test_auto_on_cuda_is_bf16_where_supported(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert T.pick_dtype("auto", torch.device("cuda"))[0] == torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert T.pick_dtype("auto", torch.device("cuda"))[0] == torch.float32


def test_explicit_dtypes_win_over_the_hardware(monkeypatch):
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "0")
    assert T.pick_dtype("bf16", torch.device("cpu"))[0] == torch.bfloat16
    monkeypatch.setenv("ATTNLAB_FAST_BF16", "1")
    assert T.pick_dtype("fp32", torch.device("cpu"), _gpt(1024))[0] == torch.float32
    with pytest.raises(ValueError, match="auto, fp32 or bf16"):
        T.pick_dtype("fp16", torch.device("cpu"))


def test_bf16_loss_and_gradients_match_fp32_within_bf16_tolerance():
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, block_size=32, n_layer=2, n_head=4, n_embd=64))
    x, y = torch.randint(0, 50, (4, 32)), torch.randint(0, 50, (4, 32))

    def loss_and_grads(dtype):
        model.zero_grad()
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
            loss = F.cross_entropy(model(x).float().flatten(0, 1), y.flatten())
        loss.backward()
        return loss.item(), torch.cat([p.grad.flatten() for p in model.parameters()])

    l32, g32 = loss_and_grads(torch.float32)
    l16, g16 = loss_and_grads(torch.bfloat16)
    assert l16 == pytest.approx(l32, rel=1e-2)  # bf16 keeps 8 bits of mantissa: ~0.4 % per rounding
    assert F.cosine_similarity(g16, g32, dim=0) > 0.99


def test_bf16_training_run_lowers_the_loss_and_saves_fp32_weights(tmp_path):
    (tmp_path / "c.txt").write_text(TEXT)
    data = prepare(str(tmp_path / "c.txt"), tmp_path / "run" / "data")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=16, n_layer=1, n_head=2, n_embd=32))
    cfg = TrainConfig(
        max_iters=30,
        batch_size=8,
        eval_interval=30,
        eval_iters=2,
        warmup_iters=2,
        lr=3e-3,
        dtype="bf16",
        progress=False,
        device="cpu",
        threads=1,
        compile=False,
    )
    trainer = Trainer(model, LanguageModelTask(data, 16, 8), cfg, tmp_path / "run")
    assert trainer.dtype == torch.bfloat16
    first = trainer.evaluate()["train"]
    trainer.fit()
    assert trainer.history[-1]["train_loss"] < first - 0.3
    from safetensors.torch import load_file

    weights = load_file(str(tmp_path / "run" / "last" / "model.safetensors"))
    assert all(t.dtype == torch.float32 for t in weights.values())
