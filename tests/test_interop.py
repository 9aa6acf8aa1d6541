import pytest
import torch

transformers = pytest.importorskip("transformers")

import attnlab  # noqa: E402
from attnlab.generate import generate  # noqa: E402
from attnlab.models import GPT, GPTConfig  # noqa: E402


def _hf_model():
    cfg = transformers.GPT2Config(
        vocab_size=101, n_positions=40, n_embd=48, n_layer=3, n_head=4, resid_pdrop=0, embd_pdrop=0, attn_pdrop=0
    )
    torch.manual_seed(0)
    m = transformers.GPT2LMHeadModel(cfg).eval()
    with torch.no_grad():  # HF zero-inits biases and sets LN to identity; make them random to test the mapping
        for n, p in m.named_parameters():
            if n.endswith("bias") or "ln" in n:
                p.add_(torch.randn_like(p) * 0.1)
    return m


def test_load_hf_gpt2_equal_logits_and_greedy(tmp_path):
    hf = _hf_model()
    hf.save_pretrained(tmp_path)
    ours = attnlab.load(tmp_path)
    idx = torch.randint(0, 101, (2, 17))
    with torch.no_grad():
        ref = hf(idx).logits
    assert torch.allclose(ours(idx), ref, atol=1e-4)
    prompt = idx[:1, :5]
    with torch.no_grad():
        hf_out = hf.generate(prompt, max_new_tokens=15, do_sample=False, pad_token_id=0)
    assert generate(ours, prompt.tolist(), 15, temperature=0)[0] == hf_out[0].tolist()


def test_load_hf_pytorch_bin(tmp_path):
    hf = _hf_model()
    hf.save_pretrained(tmp_path, safe_serialization=False)
    if not (tmp_path / "pytorch_model.bin").exists():
        pytest.skip("this transformers version always writes safetensors")
    ours = attnlab.load(tmp_path)
    idx = torch.randint(0, 101, (1, 9))
    with torch.no_grad():
        assert torch.allclose(ours(idx), hf(idx).logits, atol=1e-4)


def test_export_hf_loads_in_transformers(tmp_path):
    ours = GPT(GPTConfig(vocab_size=77, block_size=24, n_layer=2, n_head=2, n_embd=32)).eval()
    with torch.no_grad():
        for n, p in ours.named_parameters():
            if n.endswith("bias") or "ln" in n:
                p.add_(torch.randn_like(p) * 0.1)
    attnlab.export_hf(ours, tmp_path)
    hf = transformers.GPT2LMHeadModel.from_pretrained(tmp_path).eval()
    idx = torch.randint(0, 77, (2, 11))
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, ours(idx), atol=1e-4)
    back = attnlab.load(tmp_path)
    assert torch.allclose(back(idx), ours(idx), atol=1e-5)


def test_a_rotary_gpt_exports_as_gpt_neox_and_alibi_is_refused(tmp_path):
    """A pre-LN GPT with rotary positions and biases is a GPT-NeoX without parallel blocks:
    transformers reads the export to the same logits; ALiBi maps to no HuggingFace family here."""
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    m = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=2, n_embd=8, position="rope")).eval()
    attnlab.export_hf(m, tmp_path / "neox")
    hf = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "neox").eval()
    assert type(hf).__name__ == "GPTNeoXForCausalLM"
    idx = torch.randint(10, (2, 8))
    with torch.no_grad():
        assert torch.allclose(hf(idx).logits, m(idx), atol=1e-5)
    alibi = GPT(GPTConfig(vocab_size=10, block_size=8, n_layer=1, n_head=1, n_embd=8, position="alibi"))
    with pytest.raises(attnlab.errors.CheckpointError, match="learned positions"):
        attnlab.export_hf(alibi, tmp_path / "alibi")
