"""Int8 Linear layers for generation (attnlab/quantize.py): the weight-only layer against its
formula, whole models against fp32, and the command-line options."""

import json

import pytest
import torch
import torch.nn.functional as F

from attnlab.cli import main
from attnlab.generate import generate
from attnlab.models import GPT, GPTConfig
from attnlab.errors import OptionError
from attnlab.generate.quantize import Int8Linear, quantize


def test_int8_weights_round_each_row_to_its_own_scale():
    torch.manual_seed(0)
    lin = torch.nn.Linear(48, 20)
    with torch.no_grad():
        lin.weight[3] *= 100  # one large row must not coarsen the others
    q = Int8Linear(lin)
    assert q.weight_int8.dtype == torch.int8 and q.weight_int8.shape == (20, 48)
    scale = q.scale.float()
    assert ((scale - lin.weight.abs().amax(1) / 127) / scale).abs().max() < 0.02  # max |w| / 127, rounded up
    err = (q.dequantized() - lin.weight).abs()
    assert (err <= scale[:, None] * 0.5 * (1 + 1e-5)).all()  # half a step of the row's own scale
    assert err[0].max() < 0.01 * lin.weight[0].abs().max()
    x = torch.randn(2, 5, 48)
    want = F.linear(x.bfloat16().float(), q.dequantized(), lin.bias)  # (the kernel takes bf16 activations)
    got = q(x)
    assert got.shape == (2, 5, 20) and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=2e-2, atol=2e-2 * want.abs().max().item())


@pytest.mark.parametrize("how", ["int8", "dynamic-int8"])
def test_a_quantized_gpt_predicts_what_the_fp32_one_does(how):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=50, context=32, layers=2, heads=2, dim=64)).eval()
    with torch.no_grad():
        model.tok_emb.weight.mul_(20)  # confident predictions, so that rounding rarely flips the argmax
    x = torch.randint(0, 50, (4, 32))
    with torch.no_grad():
        ref = model(x)
        q = quantize(model, how)
        got = q(x)
    linears = [m for m in q.modules() if isinstance(m, torch.nn.Linear)]
    assert not linears or how == "dynamic-int8" and all("Quantized" in type(m).__name__ for m in linears)
    if how == "int8":
        assert sum(isinstance(m, Int8Linear) for m in q.modules()) == 2 * 4 + 1  # 4 per block + the head
    rel = (got - ref).norm() / ref.norm()
    assert rel < 0.03, rel
    assert (got.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9


def test_unknown_quantization_is_refused():
    with pytest.raises(ValueError, match="unknown quantization 'int3'"):
        quantize(torch.nn.Linear(2, 2), "int3")


def test_sample_and_eval_with_int8(tmp_path, capsys):
    corpus = tmp_path / "c.txt"
    corpus.write_text("to be or not to be, that is the question. " * 100)
    run = tmp_path / "run"
    args = ["train", "gpt", "--data", str(corpus), "--preset", "nano", "--max-iters", "60", "--eval-interval", "60"]
    assert main([*args, "--eval-iters", "1", "--no-progress", "--sample-chars", "0", "--out", str(run)]) == 0
    losses = {}
    for how in (None, "int8", "dynamic-int8"):
        capsys.readouterr()
        extra = ["--quantize", how] if how else []
        assert main(["eval", "--ckpt", str(run), "--json", *extra]) == 0
        losses[how] = json.loads(capsys.readouterr().out)["loss"]
    assert losses["int8"] == pytest.approx(losses[None], rel=0.01)
    assert losses["dynamic-int8"] == pytest.approx(losses[None], rel=0.01)
    assert main(["sample", "--ckpt", str(run), "--max-new-tokens", "20", "--quantize", "int8"]) == 0
    assert len(capsys.readouterr().out) >= 20
    assert main(["sample", "--ckpt", str(run), "--quantize", "int3"]) != 0
    assert "--quantize" in capsys.readouterr().err


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_weights_compute_the_same_layer_and_decode_the_same_tokens(dtype):
    """--quantize packed: the same weights in the GEMM library's packed layout give the plain
    layer's outputs (to the rounding of another summation order), keep the weight and bias
    parameters (tied head included), and greedy fp32 decoding gives the same tokens."""
    from attnlab.generate.quantize import PackedLinear, why_not_packed

    if why_not_packed(dtype) is not None:
        pytest.skip(why_not_packed(dtype))
    torch.manual_seed(0)
    linear = torch.nn.Linear(48, 40).to(dtype)
    packed = PackedLinear(linear)
    assert packed.weight is linear.weight and packed.bias is linear.bias
    for x in (torch.randn(1, 48), torch.randn(2, 7, 48)):  # one row (decoding) and a prefill's many
        x = x.to(dtype)
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(packed(x), linear(x), atol=tol, rtol=tol)
    model = GPT(GPTConfig(vocab_size=50, context=64, layers=2, heads=2, dim=32)).eval().to(dtype)
    plain = generate(model, [[1, 2, 3]], 24, temperature=0)
    head_tied = model.lm_head.weight is model.tok_emb.weight
    quantize(model, "packed")
    assert isinstance(model.blocks[0].attn.qkv, PackedLinear) and isinstance(model.lm_head, PackedLinear)
    assert (model.lm_head.weight is model.tok_emb.weight) == head_tied
    if dtype == torch.float32:
        assert generate(model, [[1, 2, 3]], 24, temperature=0) == plain
    # a gated MLP's gate and up projections (bf16) are packed as one product, adding no parameter
    # and no state: the same logits as the plain layers (oneDNN's sums are the plain ones')
    swiglu = GPTConfig(vocab_size=50, context=64, layers=2, heads=4, kv_heads=2, dim=32, norm="rms", gated_mlp=True,
                       activation="silu", pos="rope", bias=False)  # fmt: skip
    model = GPT(swiglu).eval().to(dtype)
    names, ids = set(model.state_dict()), torch.randint(50, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(ids)
        quantize(model, "packed")
        after = model(ids)
    assert set(model.state_dict()) == names
    assert (model.blocks[0].mlp.gate_up is not None) == (dtype == torch.bfloat16)
    if dtype == torch.bfloat16:
        assert torch.equal(after, before)
    else:
        torch.testing.assert_close(after, before, atol=1e-5, rtol=1e-5)


def test_packing_says_what_this_cpu_or_build_lacks(monkeypatch):
    """Both sides of the hardware check: without bf16 instructions (or without MKL) packing is
    refused in one line that says what to do; with them it is allowed."""
    from attnlab.generate.quantize import PackedLinear, why_not_packed

    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert "sample in fp32" in why_not_packed(torch.bfloat16)
    with pytest.raises(ValueError, match="--quantize packed: this CPU has no bf16"):
        PackedLinear(torch.nn.Linear(4, 4).to(torch.bfloat16))
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    assert why_not_packed(torch.bfloat16) is None
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: False)
    assert "no MKL" in why_not_packed(torch.float32)
    assert "fp32 and bf16" in why_not_packed(torch.float16)


def test_generate_quantize_decodes_a_quantized_copy_as_sample_quantize_does(tiny_run, capsys):
    """generate(quantize=) is the sample command's --quantize as a keyword of the one generate: the
    same greedy text as `attnlab sample --quantize int8`, from a copy (the model keeps its layers)."""
    run = tiny_run("gpt")
    model = run.load()
    plain = model.generate("to", 12, temperature=0)
    int8 = model.generate("to", 12, temperature=0, quantize="int8")
    capsys.readouterr()
    assert main(["sample", "--ckpt", str(run.out), "--prompt", "to", "--max-new-tokens", "12",
                 "--temperature", "0", "--quantize", "int8", "--device", "cpu"]) == 0  # fmt: skip
    assert capsys.readouterr().out.strip() == ("to" + int8).strip()
    assert not any(isinstance(m, Int8Linear) for m in model.modules())  # (the copy was quantized)
    assert model.generate("to", 12, temperature=0) == plain
    with pytest.raises(OptionError, match="quantize="):
        model.generate("to", 2, quantize="int3")


@pytest.mark.slow
@pytest.mark.parametrize("how", ["int8", "dynamic-int8", "int4", "packed"])
def test_every_quantize_choice_runs_with_compile(how, tiny_run, capsys):
    """--quantize X --compile decodes the tokens --quantize X does: compiled (int8, int4), or eager
    with a one-line note where the compiler cannot trace the layers (packed, dynamic-int8), never a
    compiler's traceback (issue 80)."""
    from attnlab.generate.quantize import why_not_packed
    from attnlab.options import QUANTIZE_CHOICES

    assert set(QUANTIZE_CHOICES) == {"int8", "dynamic-int8", "int4", "packed"}  # (a new choice is tested here too)
    if how == "packed" and why_not_packed(torch.float32):
        pytest.skip(f"packed layers: {why_not_packed(torch.float32)}")
    run = tiny_run("gpt")
    argv = ["sample", "--ckpt", str(run.out), "--prompt", "to", "--max-new-tokens", "12", "--temperature", "0",
            "--quantize", how, "--device", "cpu"]  # fmt: skip
    capsys.readouterr()
    assert main(argv) == 0
    eager = capsys.readouterr().out
    assert main([*argv, "--compile"]) == 0
    out, err = capsys.readouterr()
    assert out == eager
    if how in ("int8", "int4"):
        assert "compiled decode step: 1 graph(s), 0 graph breaks" in err, err
    else:
        assert err.strip().splitlines() == [
            f"warning: --compile does not trace the {'packed' if how == 'packed' else 'dynamically quantised'} layers "
            f"of --quantize {how}: this decode runs eager"
        ], err
