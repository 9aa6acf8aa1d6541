import json

import pytest
import torch

from attnlab.checkpoint import find_checkpoint
from attnlab.data.text import prepare
from attnlab.models import GPT, GPTConfig
from attnlab.training import LanguageModelTask, TrainConfig, Trainer, TrainingInterrupted
from attnlab.training.optim import warmup_cosine

TEXT = "the quick brown fox jumps over the lazy dog. " * 200


def _setup(tmp_path, interrupt_at=None, **cfg):
    data = prepare(str(tmp_path / "corpus.txt"), tmp_path / "run" / "data")
    dropout = cfg.pop("dropout", 0.1)
    torch.manual_seed(0)  # the same initial weights in every run
    model = GPT(
        GPTConfig(vocab_size=data.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, n_embd=32, dropout=dropout)
    )
    task = LanguageModelTask(data, 16, 4)
    tcfg = TrainConfig(
        **{
            **dict(
                max_iters=12,
                batch_size=4,
                eval_interval=4,
                eval_iters=2,
                warmup_iters=3,
                log_interval=1,
                progress=False,
                seed=3,
                # pinned as helpers.PINNED_TRAINING, but --compile stays auto: test_compile drives it
                device="cpu",
                dtype="fp32",
                threads=1,
            ),
            **cfg,
        }
    )
    trainer = Trainer(model, task, tcfg, tmp_path / "run")
    if interrupt_at is not None:  # Ctrl-C while fetching the batch of step interrupt_at + 1
        real = task.batch

        def batch(split, bs, gen):
            if gen is trainer.data_gen and trainer.step == interrupt_at:
                raise KeyboardInterrupt
            return real(split, bs, gen)

        task.batch = batch
    return trainer


@pytest.mark.parametrize(
    "opt",
    [{}, {"optimizer": "muon", "schedule": "trapezoid"}, {"ema": 0.8}],
    ids=["adamw", "muon", "ema"],
)
def test_interrupt_and_resume_give_the_same_curve(tmp_path, opt):
    (tmp_path / "corpus.txt").write_text(TEXT)
    full = _setup(tmp_path, **opt)
    full.fit()
    ref = [r["loss"] for r in full.history]
    ref_params = {k: v.clone() for k, v in full.model.state_dict().items()}
    import shutil

    shutil.rmtree(tmp_path / "run")
    t = _setup(tmp_path, interrupt_at=7, **opt)
    with pytest.raises(TrainingInterrupted) as e:
        t.fit()
    assert e.value.step == 7
    assert json.loads((find_checkpoint(tmp_path / "run", "last") / "trainer.json").read_text())["step"] == 7
    resumed = _setup(tmp_path, **opt)
    resumed.resume()
    assert resumed.step == 7
    resumed.fit()
    got = [r["loss"] for r in resumed.history]
    assert len(got) == len(ref) == 12
    assert got == pytest.approx(ref, abs=1e-6)
    evals = [r["val_loss"] for r in resumed.history if "val_loss" in r]  # (under --ema: the average's)
    assert evals == pytest.approx([r["val_loss"] for r in full.history if "val_loss" in r], abs=1e-6)
    for k, v in resumed.model.state_dict().items():
        assert torch.allclose(v, ref_params[k], atol=1e-6), k
    lines = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(x)["step"] for x in lines] == list(range(1, 13))
    assert (tmp_path / "run" / "loss.png").stat().st_size > 1000
    assert (tmp_path / "run" / "best" / "model.safetensors").exists()


def test_training_lowers_the_loss(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    t = _setup(tmp_path, max_iters=60, eval_interval=60, lr=3e-3, eval_iters=4)
    before = t.evaluate()["val"]
    t.fit()
    assert t.best_val < before - 1.0


def test_grad_accumulation_matches_big_batch(tmp_path):
    (tmp_path / "corpus.txt").write_text(TEXT)
    a = _setup(tmp_path, max_iters=1, batch_size=8, dropout=0.0)
    b = _setup(tmp_path, max_iters=1, batch_size=4, grad_accum=2, dropout=0.0)
    b.model.load_state_dict(a.model.state_dict())
    # the 8 windows of `a`'s one batch are the two micro-batches of 4 that `b` draws
    g1, g2 = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    x8, _ = a.task.batch("train", 8, g1)
    x4a, _ = b.task.batch("train", 4, g2)
    x4b, _ = b.task.batch("train", 4, g2)
    assert torch.equal(x8, torch.cat([x4a, x4b]))
    la, lb = float(a.train_step()), float(b.train_step())  # one optimizer step each, through the trainer
    assert la == pytest.approx(lb, rel=1e-5)
    for (name, pa), pb in zip(a.model.named_parameters(), b.model.parameters()):
        assert torch.allclose(pa, pb, atol=1e-6), name
    moved = [
        not torch.equal(p, q) for p, q in zip(a.model.parameters(), _setup(tmp_path, dropout=0.0).model.parameters())
    ]
    assert any(moved)  # the step changed the weights (so equality above is not vacuous)


def test_schedule():
    kw = dict(lr=1.0, min_lr=0.1, warmup=10, decay_steps=110)
    assert warmup_cosine(0, **kw) == pytest.approx(1 / 11)
    assert warmup_cosine(10, **kw) == pytest.approx(1.0)
    assert warmup_cosine(60, **kw) == pytest.approx(0.55)
    assert warmup_cosine(500, **kw) == pytest.approx(0.1)


def test_activation_checkpointing_gives_the_same_gradients():
    from attnlab.training.trainer import set_activation_checkpointing

    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=11, block_size=8, n_layer=2, n_head=2, n_embd=16))
    x = torch.randint(0, 11, (3, 8))
    m(x).square().mean().backward()
    ref = [p.grad.clone() for p in m.parameters()]
    m.zero_grad()
    set_activation_checkpointing(m, True)
    assert all(b.checkpoint_activations for b in m.blocks)
    m(x).square().mean().backward()
    for a, p in zip(ref, m.parameters()):
        assert torch.allclose(a, p.grad, atol=1e-6)


def test_fused_adamw_takes_the_same_steps_as_the_reference_loop():
    """attnlab's optimizer (fused on CPU) against torch's per-parameter AdamW with the same two
    groups: the weights agree to rounding after a few steps, decayed and undecayed alike."""
    from attnlab.training.optim import adamw, decay_groups

    torch.manual_seed(0)
    # no biases: the key bias gets an exactly-zero gradient, which Adam turns into ±lr steps of rounding noise
    model = GPT(GPTConfig(vocab_size=11, context=8, layers=2, heads=2, dim=16, bias=False))
    ref = GPT(model.config)
    ref.load_state_dict(model.state_dict())
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    ours = adamw(model, 1e-2, 0.1, (0.9, 0.95), "cpu")
    assert ours.defaults.get("fused")
    decay, no_decay = decay_groups(ref)
    theirs = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        foreach=False,
    )
    x = torch.randint(0, 11, (4, 8))
    for _ in range(5):
        for m, opt in ((model, ours), (ref, theirs)):
            m(x).logsumexp(-1).mean().backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    for (name, a), b in zip(model.named_parameters(), ref.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=name)
    assert all(not torch.equal(p, start[n]) for n, p in model.named_parameters())  # every tensor moved


def test_ema_is_the_moving_average_of_the_training_weights(tmp_path):
    """--ema d: after the first step the average is the weights; then avg = d·avg + (1−d)·w. It is
    what evaluation sees and model.safetensors holds; trainer.safetensors keeps the training weights."""
    from safetensors.torch import load_file

    (tmp_path / "corpus.txt").write_text(TEXT)
    d = 0.8
    t = _setup(tmp_path, ema=d, dropout=0.0)
    avg = None
    for _ in range(5):
        t.train_step()
        w = {k: v.detach().clone() for k, v in t.model.named_parameters()}
        avg = w if avg is None else {k: d * avg[k] + (1 - d) * w[k] for k in w}
    for k, v in t.ema.module.named_parameters():
        assert torch.allclose(v, avg[k], atol=1e-6), k
        assert not torch.allclose(v, dict(t.model.named_parameters())[k])  # (the average is not the last weights)
    plain = _setup(tmp_path, dropout=0.0)
    plain.model.load_state_dict(t.ema.module.state_dict())
    assert t.evaluate() == plain.evaluate()  # evaluation scores the average
    last = t.save("last")
    saved, state = load_file(str(last / "model.safetensors")), load_file(str(last / "trainer.safetensors"))
    assert torch.equal(saved["blocks.0.attn.qkv.weight"], t.ema.module.blocks[0].attn.qkv.weight)
    assert torch.equal(state["weights.blocks.0.attn.qkv.weight"], t.model.blocks[0].attn.qkv.weight)
    assert int(state["ema.n_averaged"]) == 5


def test_bad_ema_values_are_refused():
    with pytest.raises(ValueError, match=r"\(--ema\).*must be in \[0, 1\)"):
        TrainConfig(ema=1.0)
    with pytest.raises(ValueError, match=r"\(--ema\).*must be in \[0, 1\)"):
        TrainConfig(ema=-0.5)
    with pytest.raises(ValueError, match="--fsdp"):
        TrainConfig(ema=0.99, fsdp=True)


def test_progress_into_a_pipe_is_plain_lines_not_redraws(tmp_path, capsys, monkeypatch):
    """With stderr not a terminal, no carriage-return bar: a plain line with the ETA every
    PLAIN_PROGRESS_S seconds (made 0 here, so every logged step writes one)."""
    from attnlab.training import trainer as T

    (tmp_path / "corpus.txt").write_text(TEXT)
    monkeypatch.setattr(T, "PLAIN_PROGRESS_S", 0.0)
    t = _setup(tmp_path, max_iters=6, progress=True, log_interval=3, eval_interval=6)
    capsys.readouterr()
    t.fit()
    err = capsys.readouterr().err
    assert "\r" not in err
    lines = [line for line in err.splitlines() if line.startswith("step ") and "min left" in line]
    assert [line.split(":")[0] for line in lines] == ["step 3/6", "step 6/6"], err
