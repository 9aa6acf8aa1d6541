"""The GPU rows of issue 35, each against a baseline measured in the same process:

* train: one GPT-2-small training step (12/12/768, T 1024, vocab 50304, bf16 autocast, fused
  AdamW, torch.compile) three ways: attnlab with the loss outside the compiled model (what the
  trainer did before), attnlab with the loss compiled with the model (``TaskLoss``, what it does
  now), and a nanoGPT-shaped reference written below (its ``model.py``: loss inside forward);
* generate: greedy, GPT-2 small, bf16, 256 new tokens, batch 1 and 8: eager ``generate`` against
  ``generate(compile=True)`` (the fixed-shape step, CUDA graphs) and HuggingFace ``generate``;
* serve: continuous batching of 64 requests on 8 rows against one request at a time (the row names
  the workload's ceiling: the speed-up if every forward cost the same);
* trainer (issue 51): ``Trainer.fit`` on random ids of a real 50,257-token vocabulary against
  nanoGPT's ``train.py`` loop, both timed over 10 steps per synchronisation, with and without the
  chunked loss.

Every row is printed (``row: ...``) the moment it is measured, then the tables.

    python benchmarks/gpu_speed.py                  # on a CUDA machine (about 4 minutes on an H100)
    python benchmarks/gpu_speed.py --smoke          # the same code paths at toy sizes on a CPU (a check, not a measurement)
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch import nn

from common import compile_eagerly, matmul_peak, print_row, print_table, sync, time_it
from attnlab.generate.fast import fast_decoder
from attnlab.generate import generate
from attnlab.models import GPT, GPTConfig
from attnlab.training.tasks import LanguageModelTask  # noqa: F401  (the task TaskLoss runs in the trainer)
from attnlab.training.trainer import TaskLoss


class NanoBlock(nn.Module):
    """nanoGPT's Block: pre-LN causal self-attention (SDPA, is_causal) and a GELU MLP."""

    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.ln_1, self.ln_2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.c_attn, self.c_proj = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.fc, self.proj = nn.Linear(dim, 4 * dim), nn.Linear(4 * dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.c_attn(self.ln_1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).contiguous().view(b, t, c)
        x = x + self.c_proj(y)
        return x + self.proj(F.gelu(self.fc(self.ln_2(x))))


class NanoGPT(nn.Module):
    """nanoGPT's GPT, trimmed to what a training step runs: the loss is computed in forward."""

    def __init__(self, vocab: int, context: int, layers: int, heads: int, dim: int) -> None:
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(NanoBlock(dim, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight

    def forward(self, idx, targets):
        x = self.wte(idx) + self.wpe(torch.arange(idx.shape[1], device=idx.device))
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1), ignore_index=-1)


class _LMTask:
    """The language-model loss as the trainer's task computes it (attnlab.losses.cross_entropy)."""

    def loss(self, model, batch):
        from attnlab.losses import cross_entropy

        x, y = batch
        return cross_entropy(model(x), y)


def train_rows(device, shape, batch, steps, before: bool = True) -> list[dict]:
    vocab, context, layers, heads, dim = shape
    x = torch.randint(vocab, (batch, context), device=device)
    y = torch.randint(vocab, (batch, context), device=device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    peak = matmul_peak(dtype, device=device)
    flops_per_token = 6 * (12 * layers * dim * dim + vocab * dim) + 12 * layers * dim * context

    def step_of(model, loss):
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=True)

        def step():
            with torch.autocast(device.type, dtype=dtype, enabled=dtype == torch.bfloat16):
                value = loss()
            value.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)

        return step

    rows = []
    torch.manual_seed(0)
    ours = GPT(GPTConfig(vocab_size=vocab, context=context, layers=layers, heads=heads, dim=dim)).to(device)
    compiled_model = torch.compile(ours)
    compiled_loss = torch.compile(TaskLoss(ours, _LMTask()))
    ref = NanoGPT(vocab, context, layers, heads, dim).to(device)
    compiled_ref = torch.compile(ref)
    from attnlab.losses import cross_entropy

    candidates = {
        "attnlab, loss compiled with the model (TaskLoss)": step_of(ours, lambda: compiled_loss(x, y)),
        "nanoGPT-shaped reference, loss in forward": step_of(ref, lambda: compiled_ref(x, y)),
    }
    if before:  # (a third compile of GPT-2 small: about a minute more)
        candidates["attnlab, loss outside the compiled model (before)"] = step_of(
            ours, lambda: cross_entropy(compiled_model(x), y)
        )
    seconds = {}
    for name, step in candidates.items():
        t0 = time.perf_counter()
        step()  # compiles
        sync(device)
        compile_s = time.perf_counter() - t0
        seconds[name] = (time_it(step, warmup=2, repeat=steps, device=device), compile_s)
    ref_s = seconds["nanoGPT-shaped reference, loss in forward"][0]
    for name, (s, compile_s) in seconds.items():
        tok_s = batch * context / s
        rows.append(
            {
                "train step": name,
                "ms": f"{s * 1e3:.1f}",
                "tokens/s": f"{tok_s:,.0f}",
                "MFU": f"{100 * tok_s * flops_per_token / peak:.1f} %",
                "vs reference": f"{ref_s / s:.3f}x",
                "compile s": f"{compile_s:.0f}",
            }
        )
    return rows


class RandomTokens:
    """The tokenizer of a stream of random token ids, as the trainer's checkpoints record it."""

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size

    def to_dict(self) -> dict:
        return {"kind": "random ids", "vocab_size": self.vocab_size}


def nanogpt_step(data, shape, batch, device, dtype):
    """One step of nanoGPT's ``train.py`` loop on :class:`NanoGPT` (compiled), as a function: a batch
    of ``data``'s training windows (pinned and moved without blocking on CUDA), autocast forward,
    backward, gradient clipping at 1.0, fused AdamW."""
    vocab, context, layers, heads, dim = shape
    cuda = device.type == "cuda"
    torch.manual_seed(0)
    model = NanoGPT(vocab, context, layers, heads, dim).to(device)
    compiled = torch.compile(model)
    opt = torch.optim.AdamW(model.parameters(), lr=6e-4, betas=(0.9, 0.95), weight_decay=0.1, fused=cuda)
    generator = torch.Generator().manual_seed(0)

    def step():
        x, y = data.batch("train", batch, context, generator)
        if cuda:
            x, y = x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=dtype, enabled=cuda):
            loss = compiled(x, y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def trainer_rows(device, shape, batch, window, windows, loss_chunk) -> list[dict]:
    """The trainer itself (``Trainer.fit``: its batches, bf16 autocast, gradient clipping, fused AdamW,
    the schedule, one read-back per logging window) on a stream of random ids of a real 50,257-token
    vocabulary, against nanoGPT's training loop (its ``train.py``: a batch drawn from the same
    stream and moved pinned and non-blocking, autocast, clipping, fused AdamW; its model pads the
    vocabulary to 50,304 and takes the loss over all of those classes, as attnlab's
    ``vocab_multiple=64`` head computes them and keeps the 50,257). Both are timed over ``window``
    steps per synchronisation; each row is printed when measured."""
    import tempfile

    import numpy as np

    from attnlab.data.text import TokenData
    from attnlab.training import TrainConfig, Trainer

    vocab, context, layers, heads, dim = shape
    cuda = device.type == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32
    rng = np.random.default_rng(0)
    n = max(2_000_000, 4 * batch * context)
    data = TokenData(
        rng.integers(vocab, size=n, dtype=np.uint16), rng.integers(vocab, size=n // 10, dtype=np.uint16),
        RandomTokens(vocab), "random ids",
    )  # fmt: skip
    padded = -(-vocab // 64) * 64
    peak = matmul_peak(dtype, device=device)
    flops_per_token = 6 * (12 * layers * dim * dim + padded * dim) + 12 * layers * dim * context
    tokens = batch * context
    rows = []

    def row(name: str, seconds: float, wall_s: float, ref_s: float | None) -> dict:
        r = {
            f"train, vocabulary {vocab:,}": name,
            "ms/step": f"{seconds * 1e3:.1f}",
            "tokens/s": f"{tokens / seconds:,.0f}",
            "MFU": f"{100 * tokens / seconds * flops_per_token / peak:.1f} %",
            "vs nanoGPT": f"{(ref_s or seconds) / seconds:.3f}x",
            "wall s (compiling too)": f"{wall_s:.0f}",
        }
        print_row(r)
        rows.append(r)
        return r

    t0 = time.perf_counter()
    ref_step = nanogpt_step(data, (padded, *shape[1:]), batch, device, dtype)
    ref_s = time_it(ref_step, warmup=window, repeat=windows, device=device, per_sync=window)  # (warm-up compiles)
    row(f"nanoGPT train.py loop, {window} steps per sync", ref_s, time.perf_counter() - t0, None)
    del ref_step  # (its model and optimizer state leave the device before the trainer's arrive)
    for chunk in (0, loss_chunk):
        torch.manual_seed(0)
        config = GPTConfig(vocab_size=vocab, vocab_multiple=64, context=context, layers=layers, heads=heads, dim=dim)
        cfg = TrainConfig(
            max_iters=window * (windows + 1), batch_size=batch, lr=6e-4, warmup_iters=0, beta2=0.95,
            eval_interval=10**9, eval_iters=1, log_interval=window, progress=False, device=device.type,
            dtype="bf16" if cuda else "fp32", compile=True,
        )  # fmt: skip
        with tempfile.TemporaryDirectory(prefix="attnlab-trainer-row-") as out:
            trainer = Trainer(GPT(config), LanguageModelTask(data, context, batch, loss_chunk=chunk), cfg, out)
            t0 = time.perf_counter()
            trainer.fit()
            wall = time.perf_counter() - t0
        rates = [r["items_per_s"] for r in trainer.history if "items_per_s" in r][1:]  # after the compiling window
        seconds = tokens / statistics.median(rates)
        label = "attnlab Trainer" + (f", --loss-chunk {chunk}" if chunk else "") + f", {window} steps per log"
        row(label, seconds, wall, ref_s)
        del trainer
    return rows


def generate_rows(device, shape, new_tokens) -> list[dict]:
    vocab, context, layers, heads, dim = shape
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = GPT(
        GPTConfig(vocab_size=vocab, context=context, layers=layers, heads=heads, dim=dim, activation="gelu_tanh")
    )
    model = model.to(device=device, dtype=dtype).eval()
    rows = []
    for batch in (1, 8):
        prompts = [
            [int(t) for t in torch.randint(vocab, (8,), generator=torch.Generator().manual_seed(i))]
            for i in range(batch)
        ]

        def run(compile):
            return generate(model, prompts, new_tokens, temperature=0, compile=compile)

        # each measurement is printed as it is made: a run stopped at its time limit still tells
        eager = run(False)
        t_eager = time_it(lambda: run(False), warmup=0, repeat=2, device=device)  # (warm: run above)
        print(f"batch {batch}: eager {batch * new_tokens / t_eager:,.0f} tokens/s", flush=True)
        t0 = time.perf_counter()
        fast = run(True)  # compiles (and records the CUDA graph)
        sync(device)
        compile_s = time.perf_counter() - t0
        print(f"batch {batch}: compile=True's first call (compiling) took {compile_s:.0f} s", flush=True)
        t_fast = time_it(lambda: run(True), warmup=1, repeat=3, device=device)
        same = sum(a == b for a, b in zip(eager, fast))
        print(f"batch {batch}: compile=True {batch * new_tokens / t_fast:,.0f} tokens/s, {same}/{batch} rows "
              "the same tokens as eager", flush=True)  # fmt: skip
        decoder = fast_decoder(model, batch, length=8 + new_tokens)  # (the one generate(compile=True) used)
        counts = decoder.graph_counts() or {}
        print(f"batch {batch}: {decoder.graph_line()}", flush=True)
        row = {
            "generate (greedy)": f"batch {batch}, {new_tokens} tokens",
            "eager tok/s": f"{batch * new_tokens / t_eager:,.0f}",
            "compile=True tok/s": f"{batch * new_tokens / t_fast:,.0f}",
            "speed-up": f"{t_eager / t_fast:.2f}x",
            "same tokens": f"{same}/{batch}",
            "compile s": f"{compile_s:.0f}",
            "graphs, recompiles, cudagraph skips": ", ".join(
                str(counts.get(k, "-")) for k in ("graphs", "recompiles", "cudagraph_skips")
            ),
            "HF tok/s": "-",
        }
        try:
            row["HF tok/s"] = f"{batch * new_tokens / hf_generate_seconds(model, prompts, new_tokens, device):,.0f}"
        except ImportError:
            pass
        print_row(row)
        rows.append(row)
    return rows


def hf_generate_seconds(model, prompts, new_tokens, device) -> float:
    """HuggingFace GPT-2 with attnlab's weights (interop), greedy generate, static shapes as HF runs them."""
    import transformers

    from attnlab.interop.gpt2 import export_gpt2

    state, config = export_gpt2(model)
    config = {k: v for k, v in config.items() if k not in ("architectures", "model_type", "torch_dtype")}
    hf = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
    hf.load_state_dict({k: v.float() for k, v in state.items()}, strict=False)
    hf = hf.to(device=device, dtype=next(model.parameters()).dtype).eval()
    ids = torch.tensor(prompts, device=device)

    def run():
        with torch.no_grad():
            hf.generate(ids, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False, pad_token_id=0)

    return time_it(run, warmup=1, repeat=2, device=device)


def serve_rows(device, quick) -> list[dict]:
    from attnlab.bench import serving_rows

    return serving_rows(device, quick)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="toy sizes (a CPU check of the code paths)")
    ap.add_argument(
        "--only",
        nargs="*",
        choices=["trainer", "train", "generate", "serve"],
        default=["trainer", "train", "generate", "serve"],
        help="trainer: the trainer against nanoGPT's loop at a real 50,257-token vocabulary; train: one compiled "
        "step against the nanoGPT-shaped one; generate; serve (default: all)",
    )
    ap.add_argument("--window", type=int, default=10, help="trainer: steps per synchronisation (default 10)")
    ap.add_argument(
        "--no-before",
        dest="before",
        action="store_false",
        help="leave out the training step with the loss outside the compiled model (the trainer before issue 35)",
    )
    args = ap.parse_args()
    if args.smoke:
        compile_eagerly()  # (the code paths and graph counts, without inductor's minutes of code generation)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    gpt2 = (50304, 1024, 12, 12, 768)
    toy = (128, 64, 2, 2, 32)
    shape = toy if args.smoke else gpt2
    if "trainer" in args.only:
        trainer_shape = (50257, 64, 2, 2, 32) if args.smoke else (50257, 1024, 12, 12, 768)
        window, windows = (2, 2) if args.smoke else (args.window, 5)
        rows = trainer_rows(device, trainer_shape, 2 if args.smoke else 16, window, windows, 64 if args.smoke else 4096)
        print_table(rows, list(rows[0]))
    if "train" in args.only:
        print_table(train_rows(device, shape, 2 if args.smoke else 16, 3 if args.smoke else 10, args.before), [
            "train step", "ms", "tokens/s", "MFU", "vs reference", "compile s"])  # fmt: skip
    if "generate" in args.only:
        gen_shape = (shape[0] if args.smoke else 50257, *shape[1:])
        print_table(generate_rows(device, gen_shape, 16 if args.smoke else 256), [
            "generate (greedy)", "eager tok/s", "compile=True tok/s", "speed-up", "same tokens", "compile s",
            "graphs, recompiles, cudagraph skips", "HF tok/s"])  # fmt: skip
    if "serve" in args.only:
        rows = serve_rows(device, args.smoke)  # (the three ways are measured together)
        for row in rows:
            print_row(row)
        print_table(rows, list(rows[0]))
    print("peak memory", f"{torch.cuda.max_memory_allocated() / 2**30:.1f} GiB" if device.type == "cuda" else "-")


if __name__ == "__main__":
    main()
