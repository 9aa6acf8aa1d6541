"""The speedrun recipe's parts (issue 25): Muon for the blocks' matrices checked against the
published update, the trapezoidal schedule, and the model options (QK-norm, ReLU², logit soft-cap,
zero init), each against its formula."""

import math

import pytest
import torch
import torch.nn.functional as F

from attnlab.models import GPT, GPTConfig
from attnlab.training import TrainConfig
from attnlab.training.optim import MuonAdamW, hidden_matrices, make_optimizer, warmup_stable_decay


def published_newton_schulz(g: torch.Tensor, steps: int = 5, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """zeropower_via_newtonschulz5 as published in Keller Jordan's Muon repository (muon.py); its
    bf16 cast made ``dtype``."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.to(dtype)
    tall = g.size(-2) > g.size(-1)
    if tall:
        x = x.mT
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(steps):
        m = x @ x.mT
        x = a * x + (b * m + c * m @ m) @ x
    return x.mT if tall else x


def tiny_gpt(**kw):
    torch.manual_seed(0)
    return GPT(GPTConfig(vocab_size=13, context=8, layers=2, heads=2, dim=16, **kw))


def test_muon_takes_the_blocks_matrices_and_adamw_the_rest():
    model = tiny_gpt(tie_output=False)
    names = {id(p): n for n, p in model.named_parameters()}
    got = sorted(names[id(p)] for p in hidden_matrices(model))
    want = sorted(
        f"blocks.{i}.{m}.weight" for i in range(2) for m in ("attn.qkv", "attn.out_proj", "mlp.fc", "mlp.proj")
    )
    assert got == want
    opt = make_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.02))
    assert isinstance(opt, MuonAdamW)
    in_adamw = {names[id(p)] for g in opt.adamw.param_groups for p in g["params"]}
    assert {"tok_emb.weight", "lm_head.weight", "pos_emb.weight", "ln_f.weight"} <= in_adamw
    assert in_adamw.isdisjoint(want) and len(in_adamw) + len(want) == len(names)
    assert [g["lr_factor"] for g in opt.muon.param_groups] == [pytest.approx(20.0)]


def test_muon_steps_are_the_published_update():
    """Two steps of attnlab's optimizer against Muon's published algorithm: Nesterov momentum,
    Newton-Schulz orthogonalisation (in bf16, so within 20 % in Frobenius norm, where an
    unorthogonalised step is 80 % away and plain momentum 34-60 %), lr scaled by
    sqrt(max(1, rows/cols)); AdamW moves the rest."""
    model = tiny_gpt(tie_output=False)
    opt = make_optimizer(model, TrainConfig(optimizer="muon", lr=1e-3, muon_lr=0.05, muon_momentum=0.9))
    for g in opt.param_groups:  # as the trainer does (lr_at(step) x the group's factor)
        g["lr"] = 1e-3 * g.get("lr_factor", 1.0)
    matrices = {n for n, _ in model.named_parameters() if n.startswith("blocks") and n.endswith("_proj.weight")}
    matrices |= {
        n for n, _ in model.named_parameters() if n.endswith(("qkv.weight", "mlp.fc.weight", "mlp.proj.weight"))
    }
    buffers = {}

    def rel(a, b):
        return float((a - b).norm() / b.norm())

    for step in range(2):
        before = {n: p.detach().clone() for n, p in model.named_parameters()}
        x = torch.randint(0, 13, (4, 8))
        F.cross_entropy(model(x).flatten(0, 1), x.roll(-1, 1).flatten()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters()}
        opt.step()
        opt.zero_grad()
        for n, p in model.named_parameters():
            if n not in matrices:  # AdamW: every coordinate with a gradient moves by about lr
                assert 0 < (p.detach() - before[n]).abs().max() < 1.2e-3, n
                continue
            g = grads[n]
            plain = buffers.get(n, torch.zeros_like(g)).lerp(g, 1 - 0.9)
            buffers[n] = plain
            lr = 0.05 * math.sqrt(max(1.0, g.size(0) / g.size(1)))
            taken = (before[n] - p.detach()) / lr
            assert rel(taken, published_newton_schulz(g.lerp(plain, 0.9)).float()) < 0.2, n
            raw = g.lerp(plain, 0.9)
            assert rel(taken, raw / raw.norm() * taken.norm()) > 0.5, n  # not orthogonalised
            if step == 1:  # (on the first step both momenta are multiples of the gradient)
                assert rel(taken, published_newton_schulz(plain).float()) > 0.25, n
    assert len(matrices) == 8


def test_muon_state_round_trips_through_a_state_dict():
    model = tiny_gpt()
    opt = make_optimizer(model, TrainConfig(optimizer="muon"))
    model(torch.randint(0, 13, (2, 8))).sum().backward()
    opt.step()
    sd = opt.state_dict()
    fresh = make_optimizer(model, TrainConfig(optimizer="muon"))
    fresh.load_state_dict(sd)
    again = fresh.state_dict()
    assert again["param_groups"] == sd["param_groups"]
    assert sd["state"].keys() == again["state"].keys()
    for i, st in sd["state"].items():
        for k, v in st.items():
            assert torch.equal(torch.as_tensor(v), torch.as_tensor(again["state"][i][k])), (i, k)
    muon_buffers = [k for st in sd["state"].values() for k in st if k == "momentum_buffer"]
    assert len(muon_buffers) == len(hidden_matrices(model))


def test_trapezoid_schedule():
    kw = dict(lr=1.0, min_lr=0.0, warmup=10, decay_steps=100, cooldown=0.4)
    assert warmup_stable_decay(0, **kw) == pytest.approx(1 / 11)
    assert warmup_stable_decay(10, **kw) == pytest.approx(1.0)
    assert warmup_stable_decay(59, **kw) == pytest.approx(1.0)  # flat until 60 % of the run
    assert warmup_stable_decay(80, **kw) == pytest.approx(0.5)  # halfway down the cooldown
    assert warmup_stable_decay(100, **kw) == 0.0


def test_bad_speedrun_options_are_refused():
    with pytest.raises(ValueError, match=r"\(--optimizer\): choose one of adamw, muon"):
        TrainConfig(optimizer="sgd")
    with pytest.raises(ValueError, match="--fsdp"):
        TrainConfig(optimizer="muon", fsdp=True)
    with pytest.raises(ValueError, match="--cooldown"):
        TrainConfig(schedule="trapezoid", cooldown=0.0)
    with pytest.raises(ValueError, match="--logit-softcap"):
        GPTConfig(logit_softcap=-1.0)


def test_relu2_qk_norm_softcap_and_zero_init_follow_their_formulas():
    x = torch.randint(0, 13, (2, 8))
    plain = tiny_gpt(tie_output=False)
    capped = tiny_gpt(tie_output=False, logit_softcap=2.0)
    capped.load_state_dict(plain.state_dict())
    with torch.no_grad():
        plain.lm_head.weight.mul_(50)  # logits well past the cap
        capped.lm_head.weight.copy_(plain.lm_head.weight)
        raw, out = plain(x), capped(x)
    torch.testing.assert_close(out, 2.0 * torch.tanh(raw / 2.0))
    assert out.abs().max() < 2.0 < raw.abs().max()

    relu2 = tiny_gpt(activation="relu2")
    _, cache = relu2.run_with_cache(x)
    pre, post = cache["blocks.0.mlp.hook_pre"], cache["blocks.0.mlp.hook_post"]
    torch.testing.assert_close(post, pre.clamp(min=0) ** 2)

    normed = tiny_gpt(qk_norm=True, pos="rope")
    _, cache = normed.run_with_cache(x)
    q = cache["blocks.1.attn.hook_q"]  # after RMSNorm (unit gain at init) and rotation, which keeps norms
    torch.testing.assert_close(q.square().mean(-1), torch.ones(q.shape[:-1]), atol=1e-4, rtol=0)

    zero = tiny_gpt(zero_init=True, tie_output=False)
    _, cache = zero.run_with_cache(x)
    for i in range(2):
        torch.testing.assert_close(cache[f"blocks.{i}.hook_resid_post"], cache["hook_embed"])
    assert torch.count_nonzero(zero(x)) == 0  # the untied head starts at zero: uniform predictions


def test_speedrun_preset_maps_to_no_gpt2_checkpoint():
    from attnlab.errors import CheckpointError
    from attnlab.interop.gpt2 import export_gpt2

    model = GPT.from_preset("speedrun-cpu", vocab_size=13, context=8)
    with pytest.raises(CheckpointError, match="qk_norm=True") as e:
        export_gpt2(model)
    assert "activation='relu2'" in str(e.value) and "pos='rope'" in str(e.value)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_newton_schulz_is_the_published_iteration_in_either_dtype(dtype):
    """attnlab's Newton-Schulz against the published one computed in the same dtype, on a wide
    and a tall matrix: equal to that dtype's rounding; the fp32 result is the bf16 one, sharpened."""
    from attnlab.training.optim import newton_schulz

    for shape in ((16, 48), (48, 16)):
        g = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
        ref = published_newton_schulz(g, dtype=dtype)
        got = newton_schulz(g, dtype)
        assert got.dtype == dtype
        tol = 1e-5 if dtype == torch.float32 else 0.06  # (bf16: the two orders of the same ops round apart, 3-4 %)
        assert float((got.float() - ref.float()).norm() / ref.float().norm()) < tol
    g = torch.randn(16, 48, generator=torch.Generator().manual_seed(2))
    fp32, bf16 = newton_schulz(g, torch.float32), newton_schulz(g, torch.bfloat16).float()
    assert float((fp32 - bf16).norm() / fp32.norm()) < 0.05


def test_muon_in_bf16_steps_exactly_as_torch_muon_and_loads_its_state():
    from attnlab.training.optim import Muon

    torch.manual_seed(0)
    w1 = torch.nn.Parameter(torch.randn(24, 8))
    w2 = torch.nn.Parameter(w1.detach().clone())
    ours = Muon([w1], lr=0.02, weight_decay=0.01, momentum=0.9, ns_dtype=torch.bfloat16)
    theirs = torch.optim.Muon([w2], lr=0.02, weight_decay=0.01, momentum=0.9)
    for step in range(3):
        g = torch.randn(24, 8, generator=torch.Generator().manual_seed(step))
        w1.grad, w2.grad = g.clone(), g.clone()
        ours.step()
        theirs.step()
        assert torch.equal(w1, w2), step
    fresh = Muon([torch.nn.Parameter(w2.detach().clone())], ns_dtype=torch.float32)
    fresh.load_state_dict(theirs.state_dict())  # a checkpoint of torch's Muon loads
    assert fresh.param_groups[0]["momentum"] == 0.9
    assert torch.equal(next(iter(fresh.state.values()))["momentum_buffer"], theirs.state[w2]["momentum_buffer"])


@pytest.mark.parametrize("fast, expected", [("0", torch.float32), ("1", torch.bfloat16)])
def test_muon_orthogonalises_in_the_dtype_the_cpu_computes_fast(monkeypatch, fast, expected):
    from attnlab.training.optim import newton_schulz_dtype

    monkeypatch.setenv("ATTNLAB_FAST_BF16", fast)
    opt = make_optimizer(tiny_gpt(), TrainConfig(optimizer="muon"), "cpu")
    assert opt.muon.ns_dtype == expected and newton_schulz_dtype("cpu")[0] == expected
