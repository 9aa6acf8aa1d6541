"""GPT speed: attnlab against HuggingFace GPT-2 of the same shape, measured in the same run.

Rows:
* training step (forward, loss, backward, clip, AdamW) tokens/s at nanoGPT's CPU shape
  (4 layers, 4 heads, 128 wide, context 64, batch 12) and the `shakespeare` shape
  (6/6/384, context 256, batch 16): attnlab vs transformers.GPT2LMHeadModel (SDPA attention,
  same activation, no dropout), and model FLOPs utilisation against the matmul peak measured
  at the start of the run;
* optionally attnlab eager vs torch.compile (--compile, adds a minute of compiling);
* generation of 256 new tokens (greedy, batch 1) from a GPT-2-small-shaped model with random
  weights: attnlab with KV cache vs HuggingFace `generate` vs attnlab without the cache.

bf16 rows run only where bf16 is fast (GPU, or a CPU with AVX512-BF16/AMX).

    python benchmarks/gpt_speed.py [--quick] [--compile] [--json FILE]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import matmul_peak, print_table, save_json, time_it  # noqa: E402

from attnlab.generate import generate  # noqa: E402
from attnlab.models import GPT, GPTConfig  # noqa: E402
from attnlab.training.optim import adamw  # noqa: E402
from attnlab.training.devices import cpu_has_fast_bf16  # noqa: E402


def hf_gpt2(cfg: GPTConfig):
    import transformers

    act = {"gelu": "gelu", "gelu_tanh": "gelu_pytorch_tanh", "relu": "relu"}[cfg.activation]
    hc = transformers.GPT2Config(
        vocab_size=cfg.vocab_size,
        n_positions=cfg.context,
        n_embd=cfg.dim,
        n_layer=cfg.layers,
        n_head=cfg.heads,
        resid_pdrop=0.0,
        embd_pdrop=0.0,
        attn_pdrop=0.0,
        activation_function=act,
        bos_token_id=0,
        eos_token_id=0,
        attn_implementation="sdpa",
    )
    return transformers.GPT2LMHeadModel(hc)


def flops_per_token(cfg: GPTConfig, n_params: int) -> float:
    """PaLM/nanoGPT estimate: 6N for the weights plus 12·L·D·T for attention scores, per token."""
    return 6 * n_params + 12 * cfg.layers * cfg.dim * cfg.context


def train_step_fn(model, batch: int, cfg: GPTConfig, dtype, hf: bool):
    x = torch.randint(0, cfg.vocab_size, (batch, cfg.context))
    y = torch.randint(0, cfg.vocab_size, (batch, cfg.context))
    opt = adamw(model, 1e-4, 0.1, (0.9, 0.99))
    ctx = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if dtype == torch.bfloat16 else None
    model.train()

    def step():
        if ctx:
            with ctx():
                logits = model(x).logits if hf else model(x)
        else:
            logits = model(x).logits if hf else model(x)
        loss = F.cross_entropy(logits.float().flatten(0, 1), y.flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def train_rows(shapes, dtypes, peaks, repeat, do_compile) -> list[dict]:
    rows = []
    for name, cfg, batch in shapes:
        for dtype in dtypes:
            torch.manual_seed(0)
            ours = GPT(cfg)
            hf = hf_gpt2(cfg)
            n = sum(p.numel() for p in ours.parameters()) - ours.pos_emb.weight.numel()
            fpt = flops_per_token(cfg, n)
            tokens = batch * cfg.context
            # alternate the two models so both see the same machine state
            t_ours, t_hf = [], []
            for _ in range(2):
                t_ours.append(time_it(train_step_fn(ours, batch, cfg, dtype, False), warmup=3, repeat=repeat))
                t_hf.append(time_it(train_step_fn(hf, batch, cfg, dtype, True), warmup=3, repeat=repeat))
            a, b = tokens / min(t_ours), tokens / min(t_hf)
            # the peak is measured again next to each row: on a shared VM it moves by up to 30 %
            # from minute to minute, and a stale peak makes MFU meaningless (even above 1)
            peaks[dtype] = max(peaks[dtype], matmul_peak(dtype))
            dn = str(dtype).replace("torch.", "")
            rows.append(
                {
                    "row": f"train {name} {dn}",
                    "attnlab": a,
                    "baseline": b,
                    "baseline is": "HF GPT2LMHeadModel",
                    "ratio": a / b,
                    "unit": "tokens/s",
                    "attnlab MFU": a * fpt / peaks[dtype],
                    "baseline MFU": b * fpt / peaks[dtype],
                }
            )
            if do_compile:
                compiled = torch.compile(GPT(cfg))
                t0 = time.perf_counter()
                train_step_fn(compiled, batch, cfg, dtype, False)()
                first = time.perf_counter() - t0
                c = tokens / time_it(train_step_fn(compiled, batch, cfg, dtype, False), warmup=3, repeat=repeat)
                # compiled against eager and against HF, eager timed again right after (same machine state)
                a2 = tokens / time_it(train_step_fn(ours, batch, cfg, dtype, False), warmup=3, repeat=repeat)
                note = f"first step (compiling) {first:.0f} s"
                rows.append(
                    {
                        "row": f"train {name} {dn} compile",
                        "attnlab": c,
                        "baseline": max(a, a2),
                        "baseline is": "attnlab eager",
                        "ratio": c / max(a, a2),
                        "unit": "tokens/s",
                        "attnlab MFU": c * fpt / peaks[dtype],
                        "note": note,
                    }
                )
                rows.append(
                    {
                        "row": f"train {name} {dn} compile",
                        "attnlab": c,
                        "baseline": b,
                        "baseline is": "HF GPT2LMHeadModel",
                        "ratio": c / b,
                        "unit": "tokens/s",
                        "attnlab MFU": c * fpt / peaks[dtype],
                        "baseline MFU": b * fpt / peaks[dtype],
                    }
                )
            print(f"  {rows[-1]['row']} done", file=sys.stderr, flush=True)
    return rows


def generation_rows(cfg: GPTConfig, new_tokens: int, prompt_len: int) -> list[dict]:
    torch.manual_seed(0)
    ours = GPT(cfg).eval()
    hf = hf_gpt2(cfg).eval()
    hf.load_state_dict(_to_hf_state(ours), strict=False)
    prompt = torch.randint(0, cfg.vocab_size, (1, prompt_len))

    def run_ours(cache):
        return lambda: generate(ours, prompt.tolist(), new_tokens, temperature=0, use_cache=cache)

    def run_hf():
        with torch.no_grad():
            return hf.generate(
                prompt,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                use_cache=True,
            )

    same = run_ours(True)()[0] == run_hf()[0].tolist()
    t_cache = time_it(run_ours(True), warmup=1, repeat=3)
    t_hf = time_it(run_hf, warmup=1, repeat=3)
    t_nocache = time_it(run_ours(False), warmup=0, repeat=1)
    a, b, c = new_tokens / t_cache, new_tokens / t_hf, new_tokens / t_nocache
    shape = f"{cfg.layers}/{cfg.heads}/{cfg.dim} V={cfg.vocab_size}"
    bf16 = GPT(cfg).eval()  # `attnlab sample --dtype bf16`: weights and activations in bf16
    bf16.load_state_dict(ours.state_dict())
    bf16 = bf16.to(torch.bfloat16)
    t_bf16 = time_it(lambda: generate(bf16, prompt.tolist(), new_tokens, temperature=0), warmup=1, repeat=3)
    agree = generate(bf16, prompt.tolist(), new_tokens, temperature=0)[0] == run_ours(True)()[0]
    batched = batched_row(ours, hf, new_tokens // 2, shape)
    return [
        batched,
        {
            "row": f"generate {new_tokens} tok, {shape}, bf16 weights",
            "attnlab": new_tokens / t_bf16,
            "baseline": b,
            "baseline is": "HF generate fp32",
            "ratio": (new_tokens / t_bf16) / b,
            "unit": "tokens/s",
            "note": f"same tokens as fp32: {agree}",
        },
        {
            "row": f"generate {new_tokens} tok, {shape}",
            "attnlab": a,
            "baseline": b,
            "baseline is": "HF generate",
            "ratio": a / b,
            "unit": "tokens/s",
            "note": f"same tokens: {same}",
        },
        {
            "row": f"generate {new_tokens} tok, {shape}",
            "attnlab": a,
            "baseline": c,
            "baseline is": "attnlab without KV cache",
            "ratio": a / c,
            "unit": "tokens/s",
        },
    ]


def batched_row(ours, hf, new_tokens: int, shape: str, batch: int = 8) -> dict:
    """8 prompts of different lengths (4 to 32 tokens), greedy, in one batch: attnlab left-pads
    and masks the padding (positions count real tokens), HF generate gets the attention mask."""
    g = torch.Generator().manual_seed(1)
    lengths = [4 + (28 * i) // (batch - 1) for i in range(batch)]
    prompts = [torch.randint(0, ours.config.vocab_size, (n,), generator=g).tolist() for n in lengths]
    width = max(lengths)
    ids = torch.zeros(batch, width, dtype=torch.long)
    att = torch.zeros(batch, width, dtype=torch.long)
    for i, p in enumerate(prompts):
        ids[i, width - len(p) :], att[i, width - len(p) :] = torch.tensor(p), 1

    def run_ours():
        return generate(ours, prompts, new_tokens, temperature=0)

    def run_hf():
        with torch.no_grad():
            out = hf.generate(
                ids,
                attention_mask=att,
                max_new_tokens=new_tokens,
                min_new_tokens=new_tokens,
                do_sample=False,
                pad_token_id=0,
                use_cache=True,
            )
        return [p + out[i, width:].tolist() for i, p in enumerate(prompts)]

    same = sum(a == b for a, b in zip(run_ours(), run_hf()))
    t_ours = time_it(run_ours, warmup=0, repeat=3)
    t_hf = time_it(run_hf, warmup=0, repeat=3)
    a, b = batch * new_tokens / t_ours, batch * new_tokens / t_hf
    return {
        "row": f"generate {new_tokens} tok × {batch} prompts (4-32 tokens), {shape}",
        "attnlab": a,
        "baseline": b,
        "baseline is": "HF generate",
        "ratio": a / b,
        "unit": "tokens/s",
        "note": f"same tokens: {same}/{batch}",
    }


def _to_hf_state(model: GPT) -> dict:
    import tempfile

    from safetensors.torch import load_file

    from attnlab.interop import export_hf

    with tempfile.TemporaryDirectory() as d:
        export_hf(model, d)
        return load_file(os.path.join(d, "model.safetensors"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="small shapes only")
    ap.add_argument("--compile", action="store_true", help="add attnlab torch.compile rows")
    ap.add_argument("--generate-only", action="store_true", help="only the generation rows")
    ap.add_argument("--train-only", action="store_true", help="only the training rows")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    torch.manual_seed(0)
    dtypes = [torch.float32] + ([torch.bfloat16] if cpu_has_fast_bf16() else [])
    peaks = {dt: matmul_peak(dt) for dt in dtypes}
    for dt, p in peaks.items():
        print(
            f"measured matmul peak {str(dt).replace('torch.', '')}: {p / 1e9:.0f} GFLOP/s "
            f"({torch.get_num_threads()} threads)"
        )
    shapes = [("4/4/128 T=64 B=12", GPTConfig(vocab_size=65, context=64, layers=4, heads=4, dim=128), 12)]
    if not args.quick:
        shapes.append(("6/6/384 T=256 B=16", GPTConfig(vocab_size=65, context=256, layers=6, heads=6, dim=384), 16))
    rows = (
        []
        if args.generate_only
        else train_rows(shapes, dtypes, peaks, repeat=3 if args.quick else 8, do_compile=args.compile)
    )
    gen_cfg = (
        GPTConfig(vocab_size=50257, context=1024, layers=6, heads=6, dim=384, activation="gelu_tanh")
        if args.quick
        else GPTConfig(layers=12, heads=12, dim=768, activation="gelu_tanh")
    )
    if not args.train_only:
        rows += generation_rows(gen_cfg, 64 if args.quick else 256, 16)
    print()
    print_table(
        rows, ["row", "unit", "attnlab", "baseline", "baseline is", "ratio", "attnlab MFU", "baseline MFU", "note"]
    )
    save_json(rows, args.json)


if __name__ == "__main__":
    main()
