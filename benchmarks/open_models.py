"""Open models (issue 49): the memory of loading a sharded bf16 checkpoint, and greedy generation
against HuggingFace ``generate`` on the same model, in one run.

    python benchmarks/open_models.py --work /tmp/open-models          # Qwen2-shaped, ~0.5B, random weights
    python benchmarks/open_models.py --work /tmp/open-models --shape smollm2-135m   # Llama-shaped, ~135M

A Qwen2.5-0.5B-shaped model (24 layers, 896 wide, 14 query heads on 2 key/value heads, 4,864 MLP,
151,936 tokens, tied head) is built by ``transformers`` from its config with random weights and
saved as bf16 safetensors shards of 200 MB. Then:

1. ``attnlab.load(folder, dtype="bf16")`` runs in a child process that reports its resident
   memory after its imports and its peak (``VmHWM``) after loading: the growth against the
   checkpoint's bytes.
2. In one process, the same checkpoint as ``transformers`` loads it and as attnlab loads it, both
   in ``--dtype`` (bf16 by default, as the checkpoint is; attnlab's plain layers round as
   ``transformers``' do, so that the near-ties of random weights go the same way): 64 greedy tokens after a 32-token prompt, each timed by its best of three interleaved rounds,
   by ``transformers``' ``generate``, attnlab's eager ``generate``, attnlab's compiled
   fixed-shape decoder (``compile=True``) and attnlab's eager ``generate`` with the weights packed
   for the CPU's GEMM (``--quantize packed``) or in int8 (``--quantize int8``, activations in
   fp32), and the tokens compared.
"""

from __future__ import annotations

import argparse
import copy
import json
import subprocess
import sys
import time
from pathlib import Path

SHAPES = {  # (transformers' config class, its fields): the two model sizes of issue 65's speed question
    "qwen2-0.5b": ("Qwen2Config", dict(vocab_size=151936, hidden_size=896, intermediate_size=4864, num_hidden_layers=24,
                   num_attention_heads=14, num_key_value_heads=2, max_position_embeddings=32768,
                   tie_word_embeddings=True, rope_theta=1000000.0)),
    "smollm2-135m": ("LlamaConfig", dict(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                     num_attention_heads=9, num_key_value_heads=3, max_position_embeddings=8192,
                     tie_word_embeddings=True, rope_theta=100000.0)),
}  # fmt: skip
CONFIG = SHAPES["qwen2-0.5b"][1]

LOAD = """
import sys, attnlab
def kb(key):
    return int(next(line for line in open("/proc/self/status") if line.startswith(key)).split()[1])
import torch  # (the imports' memory is the baseline)
before = kb("VmRSS")
model = attnlab.load(sys.argv[1], dtype="bf16")
print(before, kb("VmHWM"), sum(p.numel() for p in model.parameters()))
"""


def checkpoint(folder: Path, init_std: float = 0.02, shape: str = "qwen2-0.5b") -> int:
    """The checkpoint (made once): its bytes on disk."""
    if not any(folder.glob("*.safetensors")):
        import torch
        import transformers

        torch.manual_seed(0)
        kind, fields = SHAPES[shape]
        config = getattr(transformers, kind)(**fields, bos_token_id=None, eos_token_id=None, pad_token_id=None,
                                             initializer_range=init_std)  # fmt: skip
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
        model.save_pretrained(folder, max_shard_size="200MB")
    return sum(p.stat().st_size for p in folder.glob("*.safetensors"))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the checkpoint (about 1 GB)")
    p.add_argument("--tokens", type=int, default=64, help="greedy tokens to generate (default 64)")
    p.add_argument("--dtype", choices=["fp32", "bf16"], default="bf16", help="generation's dtype (default bf16)")
    p.add_argument(
        "--init-std",
        type=float,
        default=0.02,
        help="the random weights' standard deviation (transformers' initializer_range, 0.02 by default: "
        "near-uniform next-token distributions whose near-ties bf16 rounds differently on each side; "
        "a larger one gives peaked ones, as a trained model's are)",
    )
    p.add_argument(
        "--rounds", type=int, default=3, help="rounds of every run in turn; each run's best counts (default 3)"
    )
    p.add_argument(
        "--shape", choices=sorted(SHAPES), default="qwen2-0.5b", help="the model's shape (default qwen2-0.5b)"
    )
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    folder = args.work / (f"{args.shape}-random" + (f"-std{args.init_std:g}" if args.init_std != 0.02 else ""))
    n_bytes = checkpoint(folder, args.init_std, args.shape)
    out = subprocess.run([sys.executable, "-c", LOAD, str(folder)], capture_output=True, text=True, check=True)
    before, peak, params = (int(x) for x in out.stdout.split())
    growth = (peak - before) * 1024
    row = {"checkpoint_bytes": n_bytes, "parameters": params, "rss_after_imports_mb": before / 1024,
           "peak_rss_mb": peak / 1024, "growth_over_checkpoint": growth / n_bytes}  # fmt: skip
    print(f"load: {params / 1e6:.0f}M parameters, {n_bytes / 1e6:,.0f} MB of bf16 shards; resident memory "
          f"{before / 1024:,.0f} MB after imports, peak {peak / 1024:,.0f} MB: the load grew it by "
          f"{growth / 1e6:,.0f} MB = {growth / n_bytes:.2f}x the checkpoint", flush=True)  # fmt: skip

    import torch
    import transformers

    import attnlab
    from attnlab.generate import generate
    from attnlab.generate.quantize import quantize

    torch.manual_seed(1)
    prompt = torch.randint(SHAPES[args.shape][1]["vocab_size"], (1, 32))
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    theirs = transformers.AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).eval()
    ours = attnlab.load(folder, dtype=args.dtype)

    def hf_generate():
        with torch.no_grad():
            return theirs.generate(prompt, attention_mask=torch.ones_like(prompt), max_new_tokens=args.tokens,
                                   min_new_tokens=args.tokens, do_sample=False)[0].tolist()  # fmt: skip

    packed = quantize(copy.deepcopy(ours), "packed")  # (the same weights, packed for the CPU's GEMM)
    int8 = quantize(copy.deepcopy(ours).float(), "int8")  # (int8 weights; its activations in fp32)

    def attnlab_generate(model, compile: bool = False):
        with torch.no_grad():
            return generate(model, prompt.tolist(), args.tokens, temperature=0.0, compile=compile)[0]

    runs = (("transformers", hf_generate), ("attnlab", lambda: attnlab_generate(ours)),
            ("attnlab compiled", lambda: attnlab_generate(ours, True)),
            ("attnlab --quantize packed", lambda: attnlab_generate(packed)),
            ("attnlab --quantize int8", lambda: attnlab_generate(int8)))  # fmt: skip
    timings = {name: (float("inf"), None) for name, _ in runs}
    # rounds of every run in turn, each timed by its best round: a slow spell of the machine falls on
    # every side alike (the compiled decoder's first run compiles, so its first round never counts)
    for _ in range(args.rounds):
        for name, run in runs:
            start = time.perf_counter()
            tokens = run()
            timings[name] = (min(timings[name][0], time.perf_counter() - start), tokens)
    hf_s, hf_tokens = timings["transformers"]
    row.update(tokens=args.tokens, threads=torch.get_num_threads(), dtype=args.dtype, transformers_s=hf_s)
    row["shape"] = args.shape
    for name in ("attnlab", "attnlab compiled", "attnlab --quantize packed", "attnlab --quantize int8"):
        our_s, our_tokens = timings[name]
        same = sum(a == b for a, b in zip(hf_tokens[32:], our_tokens[32:]))
        as_eager = sum(a == b for a, b in zip(timings["attnlab"][1][32:], our_tokens[32:]))
        row[name] = {"s": our_s, "speedup": hf_s / our_s, "same_tokens": same, "same_as_attnlab_eager": as_eager}
        print(f"generate ({args.dtype}, {torch.get_num_threads()} threads): {args.tokens} greedy tokens after 32: "
              f"transformers {hf_s:.2f} s ({args.tokens / hf_s:.1f} tokens/s), {name} {our_s:.2f} s "
              f"({args.tokens / our_s:.1f} tokens/s): {hf_s / our_s:.2f}x; the same token at {same} of "
              f"{args.tokens} positions ({as_eager} as attnlab's eager decoding)", flush=True)  # fmt: skip
    if args.json:
        args.json.write_text(json.dumps(row, indent=1))


if __name__ == "__main__":
    main()
