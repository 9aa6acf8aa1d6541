"""`attnlab bench`: attnlab against its peers and the hardware, every row a ratio measured in
the same run. Rows: attention forward+backward, GPT training step (vs HuggingFace GPT-2; eager
vs torch.compile), GPT generation with the KV cache (vs HuggingFace generate), ViT training step
(vs HuggingFace ViT), encoder–decoder training step (vs torch.nn.Transformer), and model FLOPs
utilisation against the matmul peak measured at the start of the run."""

from __future__ import annotations

import json
from typing import Annotated, Literal, get_args
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path


from .options import Arg, Device, checked


def sync(device) -> None:
    import torch

    if str(device).startswith("cuda"):
        torch.cuda.synchronize()


def time_it(fn: Callable[[], object], *, warmup: int = 3, repeat: int = 10, device="cpu", per_sync: int = 1) -> float:
    """Median seconds per call over ``repeat`` timings of ``per_sync`` calls each, the device
    synchronised once per timing (a training loop that reads back every N steps: N calls queue
    behind each other as they do there)."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        for _ in range(per_sync):
            fn()
        sync(device)
        times.append((time.perf_counter() - t) / per_sync)
    return statistics.median(times)


def matmul_peak(dtype=None, n: int = 1024, device="cpu", seconds: float = 1.0) -> float:
    """Measured FLOP/s of a square matmul here (``dtype``: default float32): the denominator of MFU
    (never a spec-sheet number)."""
    import torch

    dtype = torch.float32 if dtype is None else dtype

    if str(device).startswith("cuda"):
        n = 8192
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(2):
        a @ b
    sync(device)
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        iters += 1
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def markdown_table(rows: list[dict], columns: list[str]) -> str:
    def fmt(v):
        if v is None:
            return "-"
        if isinstance(v, float):
            return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
        return str(v)

    widths = {c: max(len(c), *(len(fmt(r.get(c))) for r in rows)) for c in columns}
    lines = [
        "| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |",
        "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|",
    ]
    lines += ["| " + " | ".join(fmt(r.get(c)).ljust(widths[c]) for c in columns) + " |" for r in rows]
    return "\n".join(lines)


COLUMNS = ["row", "unit", "attnlab", "baseline", "baseline is", "ratio", "MFU", "baseline MFU"]


def _row(name, unit, ours, base, base_name, **extra) -> dict:
    return {
        "row": name,
        "unit": unit,
        "attnlab": ours,
        "baseline": base,
        "baseline is": base_name,
        "ratio": ours / base if base else None,
        **extra,
    }


def _train_step(model, make_loss, params=None):
    import torch

    from .training.optim import adamw

    opt = adamw(model, 1e-4, 0.01)
    model.train()

    def step():
        make_loss().backward()
        torch.nn.utils.clip_grad_norm_(params or model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def attention_rows(device, lengths, repeat) -> list[dict]:
    import torch

    from torch import nn

    from .attention import MultiHeadAttention

    rows = []
    for t in lengths:
        x = torch.randn(1, t, 64, device=device, requires_grad=True)
        ours = MultiHeadAttention(64, 1, causal=True).to(device)
        theirs = nn.MultiheadAttention(64, 1, batch_first=True).to(device)
        mask = torch.ones(t, t, dtype=torch.bool, device=device).triu(1)
        fast = time_it(lambda: ours(x).sum().backward(), repeat=repeat, device=device)
        ref = time_it(lambda: ours(x, need_weights=True)[0].sum().backward(), repeat=repeat, device=device)
        tor = time_it(
            lambda: theirs(x, x, x, attn_mask=mask, need_weights=False)[0].sum().backward(),
            repeat=repeat,
            device=device,
        )
        rows.append(_row(f"attention fwd+bwd T={t} d=64", "ms", fast * 1e3, tor * 1e3, "torch MultiheadAttention"))
        rows[-1]["ratio"] = tor / fast  # ms: lower is better, ratio = speed-up
        rows.append(_row(f"attention fwd+bwd T={t} d=64", "ms", fast * 1e3, ref * 1e3, "attnlab reference path"))
        rows[-1]["ratio"] = ref / fast
    return rows


def gpt_rows(device, dtypes, peaks, quick, compile_) -> list[dict]:
    import torch.nn.functional as F
    import torch

    import transformers

    from .models import GPT, GPTConfig

    rows = []
    shapes = [("4/4/128 T=64 B=12", dict(layers=4, heads=4, dim=128, context=64), 12)]
    if not quick:
        shapes.append(("6/6/384 T=256 B=16", dict(layers=6, heads=6, dim=384, context=256), 16))
    for name, shape, b in shapes:
        cfg = GPTConfig(vocab_size=65, **shape)
        for dtype in dtypes:
            torch.manual_seed(0)
            ours = GPT(cfg).to(device)
            hf = transformers.GPT2LMHeadModel(
                transformers.GPT2Config(
                    vocab_size=65,
                    n_positions=cfg.context,
                    n_embd=cfg.dim,
                    n_layer=cfg.layers,
                    n_head=cfg.heads,
                    resid_pdrop=0.0,
                    embd_pdrop=0.0,
                    attn_pdrop=0.0,
                    activation_function="gelu",
                    bos_token_id=0,
                    eos_token_id=0,
                    attn_implementation="sdpa",
                )
            ).to(device)
            x = torch.randint(0, 65, (b, cfg.context), device=device)
            y = torch.randint(0, 65, (b, cfg.context), device=device)

            from .training.devices import autocast

            def loss_of(m, is_hf):
                def f():
                    with autocast(device, dtype):
                        logits = m(x).logits if is_hf else m(x)
                    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())

                return f

            rep = 3 if quick else 8
            t_ours = min(time_it(_train_step(ours, loss_of(ours, False)), repeat=rep, device=device) for _ in range(2))
            t_hf = min(time_it(_train_step(hf, loss_of(hf, True)), repeat=rep, device=device) for _ in range(2))
            n = sum(p.numel() for p in ours.parameters()) - ours.pos_emb.weight.numel()
            fpt = 6 * n + 12 * cfg.layers * cfg.dim * cfg.context
            tok = b * cfg.context
            dn = str(dtype).replace("torch.", "")
            rows.append(
                _row(
                    f"GPT train {name} {dn}",
                    "tokens/s",
                    tok / t_ours,
                    tok / t_hf,
                    "HF GPT2LMHeadModel",
                    MFU=tok / t_ours * fpt / peaks[dtype],
                    **{"baseline MFU": tok / t_hf * fpt / peaks[dtype]},
                )
            )
            if compile_:
                comp = torch.compile(GPT(cfg).to(device))
                t_c = time_it(_train_step(comp, loss_of(comp, False)), warmup=2, repeat=rep, device=device)
                rows.append(
                    _row(
                        f"GPT train {name} {dn}",
                        "tokens/s",
                        tok / t_c,
                        tok / t_ours,
                        "attnlab eager",
                        MFU=tok / t_c * fpt / peaks[dtype],
                    )
                )
            print(f"  {rows[-1]['row']}", file=sys.stderr, flush=True)
    return rows


def generation_rows(device, quick) -> list[dict]:
    import torch

    import transformers

    from .generate import generate
    from .interop import export_hf
    from .models import GPT, GPTConfig

    cfg = (
        GPTConfig(layers=4, heads=4, dim=256, context=256, activation="gelu_tanh")
        if quick
        else GPTConfig(layers=12, heads=12, dim=768, activation="gelu_tanh")
    )
    new = 64 if quick else 256
    torch.manual_seed(0)
    ours = GPT(cfg).to(device).eval()
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        export_hf(ours, d)
        hf = transformers.GPT2LMHeadModel.from_pretrained(d).to(device).eval()
    prompt = torch.randint(0, cfg.vocab_size, (1, 16), device=device)
    t_ours = time_it(lambda: generate(ours, prompt.tolist(), new, temperature=0), warmup=1, repeat=3, device=device)

    def hf_gen():
        with torch.no_grad():
            hf.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    t_hf = time_it(hf_gen, warmup=1, repeat=3, device=device)
    shape = f"{cfg.layers}/{cfg.heads}/{cfg.dim}"
    rows = [_row(f"GPT generate {new} tokens {shape} greedy", "tokens/s", new / t_ours, new / t_hf, "HF generate")]
    if device.type == "cpu":  # int8 weights: a quarter of the bytes each token reads (attnlab.generate.quantize)
        from .generate.quantize import QUANTIZE_CHOICES, quantized_copy

        for how in QUANTIZE_CHOICES:
            small = quantized_copy(ours, how)
            t = time_it(lambda: generate(small, prompt.tolist(), new, temperature=0), warmup=1, repeat=3)
            rows.append(
                _row(
                    f"GPT generate {new} tokens {shape} greedy, --quantize {how}",
                    "tokens/s",
                    new / t,
                    new / t_hf,
                    "HF generate (fp32)",
                )
            )
    return rows


def serving_workload(n: int, vocab: int, context: int, seed: int = 0) -> tuple[list[list[int]], list[int]]:
    """``n`` requests as a server meets them: prompts of 8 … 64 tokens, each wanting 16 … 128 new
    tokens (uniform, seeded), all fitting the context."""
    import random

    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(8, 64))] for _ in range(n)]
    return prompts, [min(rng.randint(16, 128), context - len(p)) for p in prompts]


def time_serving(model, prompts, budgets, slots: int) -> dict[str, dict]:
    """The same requests (all arriving at once), served three ways, greedy: one at a time
    (:func:`~attnlab.generate.generate`), in fixed batches of ``slots`` (each batch runs until its
    longest request is done, as a batched ``generate`` call does) and by the
    :class:`~attnlab.generate.batching.ContinuousBatcher` with ``slots`` rows. For each: wall seconds, the
    requested tokens per second and the mean time until a request is done."""
    from .generate.batching import ContinuousBatcher, Request
    from .generate import generate

    def serve_one_by_one(done):
        for i, (p, m) in enumerate(zip(prompts, budgets)):
            generate(model, [p], m, temperature=0)
            done[i] = time.perf_counter()

    def serve_fixed_batches(done):
        for lo in range(0, len(prompts), slots):
            group = range(lo, min(lo + slots, len(prompts)))
            generate(model, [prompts[i] for i in group], max(budgets[i] for i in group), temperature=0)
            for i in group:
                done[i] = time.perf_counter()

    batcher = ContinuousBatcher(model, slots)

    def serve_continuously(done):
        index = {batcher.submit(Request(p, m, temperature=0)): i for i, (p, m) in enumerate(zip(prompts, budgets))}
        while batcher.busy:
            for r in batcher.step():
                done[index[r]] = time.perf_counter()

    generate(model, [prompts[0]], 4, temperature=0)  # warm-up
    out = {}
    ways = {"one by one": serve_one_by_one, "fixed batches": serve_fixed_batches, "continuous": serve_continuously}
    for name, serve in ways.items():
        done = [0.0] * len(prompts)
        start = time.perf_counter()
        serve(done)
        wall = time.perf_counter() - start
        out[name] = {
            "s": wall,
            "tokens/s": sum(budgets) / wall,
            "mean latency s": statistics.mean(d - start for d in done),
        }
    # the most continuous batching can gain on this workload if every forward cost the same: one at a
    # time runs a forward per token (the prompt's, then one per further token), the batcher a prefill
    # per request and one forward per step for all its rows
    out["continuous"]["ceiling"] = sum(budgets) / (len(prompts) + batcher.steps)
    return out


def serving_rows(device, quick) -> list[dict]:
    """A server's load: many greedy requests of different lengths at a GPT shape, continuous
    batching (8 rows) against one request at a time and against fixed batches of 8. The rows name
    the workload's ceiling: the speed-up over one at a time if every forward cost the same (64
    requests on a GPU, whose forwards cost about the same up to 8 rows; 32 on a CPU)."""
    import torch

    from .models import GPT, GPTConfig

    cfg = (
        GPTConfig(layers=4, heads=4, dim=256, context=256, activation="gelu_tanh")
        if quick
        else GPTConfig(layers=12, heads=12, dim=768, activation="gelu_tanh")
    )
    torch.manual_seed(0)
    model = GPT(cfg).to(device).eval()
    n, slots = (16, 8) if quick else (64 if device.type == "cuda" else 32, 8)
    prompts, budgets = serving_workload(n, cfg.vocab_size, cfg.context)
    t = time_serving(model, prompts, budgets, slots)
    name = (
        f"GPT serve {n} requests {cfg.layers}/{cfg.heads}/{cfg.dim} greedy, continuous batching ({slots} rows; "
        f"ceiling {t['continuous']['ceiling']:.1f}x one at a time)"
    )
    ours = t["continuous"]["tokens/s"]
    latency = t["continuous"]["mean latency s"]
    return [
        _row(name, "tokens/s", ours, t["one by one"]["tokens/s"], "one request at a time"),
        _row(name, "tokens/s", ours, t["fixed batches"]["tokens/s"], f"fixed batches of {slots}"),
        _row(name, "s until done, mean", latency, t["fixed batches"]["mean latency s"], f"fixed batches of {slots}"),
    ]


def vit_rows(device, quick) -> list[dict]:
    import torch.nn.functional as F
    import torch

    import transformers

    from .models import ViT, ViTConfig

    cfg = ViTConfig(image_size=32, patch_size=4, in_chans=3, num_classes=10, dim=192, layers=6, heads=3, mlp_ratio=2.0)
    b = 64 if quick else 128
    ours = ViT(cfg).to(device)
    hf = transformers.ViTForImageClassification(
        transformers.ViTConfig(
            image_size=32,
            patch_size=4,
            num_channels=3,
            hidden_size=192,
            num_hidden_layers=6,
            num_attention_heads=3,
            intermediate_size=384,
            num_labels=10,
            hidden_dropout_prob=0.0,
            attention_probs_dropout_prob=0.0,
            attn_implementation="sdpa",
        )
    ).to(device)
    x, y = torch.randn(b, 3, 32, 32, device=device), torch.randint(0, 10, (b,), device=device)
    t_ours = time_it(_train_step(ours, lambda: F.cross_entropy(ours(x), y)), repeat=3, device=device)
    t_hf = time_it(_train_step(hf, lambda: F.cross_entropy(hf(pixel_values=x).logits, y)), repeat=3, device=device)
    return [_row(f"ViT train 32px p4 192w 6L B={b}", "images/s", b / t_ours, b / t_hf, "HF ViTForImageClassification")]


def encdec_rows(device, quick) -> list[dict]:
    import torch.nn.functional as F
    import torch

    from torch import nn

    from .models import Transformer, TransformerConfig

    d, v, s_len, b = 256, 8000, 32, (32 if quick else 64)
    cfg = TransformerConfig(
        src_vocab=v, tgt_vocab=v, dim=d, heads=8, enc_layers=3, dec_layers=3, mlp_dim=512, dropout=0.0, context=128
    )
    ours = Transformer(cfg).to(device)
    emb = nn.Embedding(v, d).to(device)
    ref = nn.Transformer(d, 8, 3, 3, 512, dropout=0.0, batch_first=True).to(device)
    head = nn.Linear(d, v).to(device)
    gen = torch.Generator().manual_seed(0)

    def padded_batch():  # sentences of random length, right-padded with id 0, as real batches are
        ids = torch.randint(4, v, (b, s_len), generator=gen)
        lengths = torch.randint(s_len // 2, s_len + 1, (b, 1), generator=gen)
        return ids.masked_fill(torch.arange(s_len) >= lengths, 0).to(device)

    src, tgt = padded_batch(), padded_batch()
    src_pad, tgt_pad = src == 0, tgt == 0  # True = padding, torch's convention
    causal = torch.ones(s_len, s_len, dtype=torch.bool, device=device).triu(1)  # True = may not attend

    def ref_loss():  # both models mask the same padding and ignore it in the loss
        out = ref(
            emb(src),
            emb(tgt),
            tgt_mask=causal,
            tgt_is_causal=True,
            src_key_padding_mask=src_pad,
            tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad,
        )
        return F.cross_entropy(head(out).flatten(0, 1), tgt.flatten(), ignore_index=ours.config.pad_id)

    def our_loss():
        return F.cross_entropy(ours(src, tgt).flatten(0, 1), tgt.flatten(), ignore_index=ours.config.pad_id)

    ref_params = [*ref.parameters(), *emb.parameters(), *head.parameters()]
    ref_model = nn.ModuleList([ref, emb, head])
    repeat = 3 if quick else 10
    t_ours = time_it(_train_step(ours, our_loss), repeat=repeat, device=device)
    t_ref = time_it(_train_step(ref_model, ref_loss, ref_params), repeat=repeat, device=device)
    tok = int((~src_pad).sum() + (~tgt_pad).sum()) // 2  # real tokens per side
    return [
        _row(f"enc-dec train 3+3L d=256 T={s_len} B={b}", "tokens/s", tok / t_ours, tok / t_ref, "torch.nn.Transformer")
    ]


def _train_gpt_argv(corpus: Path, steps: int, device: str) -> list[str]:
    """``-m attnlab train gpt …`` for the rows that time whole trainings: shakespeare-cpu on
    ``corpus`` for ``steps`` steps, one short evaluation at the end, no sample, eager, fp32."""
    return [
        *("-m", "attnlab", "train", "gpt", "--preset", "shakespeare-cpu", "--data", str(corpus)),
        *("--max-iters", str(steps), "--eval-interval", str(steps), "--eval-iters", "1", "--no-progress"),
        *("--sample-chars", "0", "--no-compile", "--dtype", "fp32", "--device", device),
    ]


def distributed_rows(device, quick) -> list[dict]:
    """GPT training throughput of 2 processes under torchrun (DDP, and FSDP2) against 1 process
    with the same global batch, from each run's own tokens/s (``metrics.jsonl``, after warm-up).
    On 2 CPU cores two processes are not faster: the rows exist to catch regressions in the
    distributed paths and run unchanged on 2 GPUs."""
    import torch

    import subprocess
    import tempfile

    from .data.text import embedded_corpus

    procs = 2
    if device.type == "cuda" and torch.cuda.device_count() < procs:
        print("distributed rows: skipped (they need 2 GPUs)", file=sys.stderr)
        return []
    steps, batch = (30, 16) if quick else (80, 32)
    env = {**os.environ, "OMP_NUM_THREADS": str(max(1, (os.cpu_count() or 2) // procs))}
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(embedded_corpus())
        speeds = {}
        launch = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={procs}"]
        for name, cmd, b in (
            ("one", [sys.executable], batch),
            ("ddp", launch, batch // procs),
            ("fsdp", launch, batch // procs),
        ):
            out = Path(tmp) / name
            extra = ["--fsdp"] if name == "fsdp" else []
            argv = [*cmd, *_train_gpt_argv(corpus, steps, device.type), "--log-interval", "5"]
            argv += ["--out", str(out), "--batch-size", str(b), *extra]
            r = subprocess.run(argv, capture_output=True, text=True, env=env if name != "one" else os.environ)
            if r.returncode != 0:
                raise RuntimeError(f"bench {name} run failed: {r.stderr.strip().splitlines()[-1]}")
            records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
            # the median logging window after the first (each window's rate leaves out evaluations)
            speeds[name] = statistics.median(r["items_per_s"] for r in records[1:] if "items_per_s" in r)
    shape = f"GPT shakespeare-cpu, global batch {batch}"
    return [
        _row(f"{shape}: DDP, {procs} processes", "tokens/s", speeds["ddp"], speeds["one"], "1 process"),
        _row(f"{shape}: FSDP2, {procs} processes", "tokens/s", speeds["fsdp"], speeds["one"], "1 process"),
    ]


def sharing_rows(device, quick) -> list[dict]:
    """Two GPT trainings started together on this machine's cores, against one alone: wall time
    each, with the thread count chosen while running (the default) and with every core's thread
    kept (``--threads N``, attnlab's behaviour before: the two runs' spinning OpenMP threads steal
    each other's cores). Each run a separate process, as users start them."""
    import subprocess
    import tempfile

    from .data.text import embedded_corpus
    from .training.threads import our_cores

    if device.type != "cpu":
        return []
    cores = len(our_cores())
    steps = 60 if quick else 150
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    with tempfile.TemporaryDirectory(prefix="attnlab-bench-") as tmp:
        corpus = Path(tmp) / "corpus.txt"
        corpus.write_text(embedded_corpus())

        def argv(threads):
            cmd = [sys.executable, *_train_gpt_argv(corpus, steps, "cpu"), "--out", tempfile.mkdtemp(dir=tmp)]
            return cmd + (["--threads", str(threads)] if threads else [])

        def wall(threads, together: int) -> float:
            start = time.perf_counter()
            procs = [
                subprocess.Popen(argv(threads), env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
                for _ in range(together)
            ]
            for p in procs:
                _, err = p.communicate()
                if p.returncode != 0:
                    raise RuntimeError(f"bench sharing run failed: {err.decode().strip().splitlines()[-1]}")
            return time.perf_counter() - start  # (the pair: until both are done)

        fixed_alone, auto_alone = wall(cores, 1), wall(None, 1)
        fixed_pair, auto_pair = wall(cores, 2), wall(None, 2)
    shape = f"GPT shakespeare-cpu training, {steps} steps"
    return [
        _row(f"{shape}: alone, threads auto", "s", auto_alone, fixed_alone, f"--threads {cores}"),
        _row(f"{shape}: two together, threads auto", "s", auto_pair, auto_alone, "one alone"),
        _row(f"{shape}: two together, --threads {cores}", "s", fixed_pair, fixed_alone, "one alone"),
    ]


ROW_GROUP = Literal["attention", "gpt", "generate", "serving", "vit", "encdec", "distributed", "sharing"]
ROW_GROUPS = get_args(ROW_GROUP)


@checked
def run(
    quick: Annotated[bool, Arg("small shapes: about a minute on 2 CPU cores")] = False,
    compile: Annotated[
        bool | None, Arg("add torch.compile rows (default: on with CUDA, off on CPU where compiling takes minutes)")
    ] = None,
    json_path: Annotated[
        str | None, Arg("write the table as JSON to this file", flags=("--json",), metavar="JSON")
    ] = None,
    markdown_path: Annotated[
        str | None, Arg("write the table as Markdown to this file", flags=("--markdown",), metavar="MARKDOWN")
    ] = None,
    device: Device = "auto",
    only: Annotated[list[ROW_GROUP] | None, Arg("run only these row groups (default: all)", nargs="+")] = None,
) -> list[dict]:
    """The benchmark table (``attnlab bench``): ``only``: some of the row groups (:data:`ROW_GROUPS`;
    default all); ``json_path`` / ``markdown_path``: files to write it to as well."""
    import torch

    from .outputs import output_file
    from .training.devices import cpu_has_fast_bf16, pick_device

    # checked before minutes of benchmarking, not after
    json_path = str(output_file(json_path, ".json", "--json")) if json_path else None
    markdown_path = str(output_file(markdown_path, ".md", "--markdown")) if markdown_path else None

    dev = pick_device(device)
    fast_bf16 = torch.cuda.is_bf16_supported() if dev.type == "cuda" else cpu_has_fast_bf16()
    dtypes = [torch.float32] + ([torch.bfloat16] if fast_bf16 else [])
    peaks = {dt: matmul_peak(dt, device=dev) for dt in dtypes}
    head = (
        f"device {dev} ({torch.get_num_threads()} threads), torch {torch.__version__}; measured matmul peak: "
        + ", ".join(f"{str(dt).replace('torch.', '')} {p / 1e9:,.0f} GFLOP/s" for dt, p in peaks.items())
    )
    print(head, file=sys.stderr, flush=True)
    compile_ = (dev.type == "cuda") if compile is None else compile
    groups = {
        "attention": lambda: attention_rows(dev, [256, 1024] if quick else [256, 1024, 4096], 3 if quick else 5),
        "gpt": lambda: gpt_rows(dev, dtypes, peaks, quick, compile_ and not quick),
        "generate": lambda: generation_rows(dev, quick),
        "serving": lambda: serving_rows(dev, quick),
        "vit": lambda: vit_rows(dev, quick),
        "encdec": lambda: encdec_rows(dev, quick),
        "distributed": lambda: distributed_rows(dev, quick),
        "sharing": lambda: sharing_rows(dev, quick),
    }
    rows = [row for name in (only or groups) for row in groups[name]()]
    table = markdown_table(rows, COLUMNS)
    print(head + "\n\n" + table)
    if json_path:
        Path(json_path).write_text(json.dumps({"header": head, "rows": rows}, indent=1))
    if markdown_path:
        Path(markdown_path).write_text(head + "\n\n" + table + "\n")
    return rows
