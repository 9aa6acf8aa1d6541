"""What the named hook points cost when nothing is hooked, and what hooking the pattern costs.

    python benchmarks/hooks.py

Rows, all in one process (so a ratio compares like with like on this noisy machine):
* one unhooked HookPoint call, in ns, and the calls per GPT forward;
* a GPT training step (shakespeare-cpu shape, batch 12) and a KV-cached decoding step, with the
  hook points as they are against the same model with every hook point's call replaced by a bare
  identity (the floor: what the model cost before hook points existed), interleaved, medians;
* the same training step with every attention pattern cached (the reference attention path).
"""

from __future__ import annotations

import time
import timeit

import torch

from attnlab.hooks import HookPoint
from attnlab.models import GPT, GPTConfig


def median_ms(fn, n: int) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return 1000 * sorted(ts)[n // 2]


def main() -> None:
    torch.manual_seed(0)
    torch.set_num_threads(2)
    hp, x = HookPoint(), torch.zeros(1)
    n = 200_000
    call_ns = 1e9 * (timeit.timeit(lambda: hp(x), number=n) - timeit.timeit(lambda: x, number=n)) / n
    model = GPT(GPTConfig(vocab_size=65, layers=4, heads=4, dim=128, context=64))
    print(f"unhooked HookPoint call: {call_ns:.0f} ns; {len(model.hook_points())} hook points per forward")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    batch = torch.randint(0, 65, (12, 64))

    def train_step():
        loss = torch.nn.functional.cross_entropy(model(batch).flatten(0, 1), batch.flatten())
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    def decode_steps():
        caches = model.new_caches(1, 64)
        with torch.no_grad():
            for t in range(48):
                model(torch.tensor([[t % 65]]), caches=caches)

    real_call = HookPoint.__call__
    rows = {"train step": ([], [], train_step, 5), "48 cached decoding steps": ([], [], decode_steps, 5)}
    for _ in range(3):
        train_step()
    for _round in range(4):  # interleaved: with hook points, then with bare identities
        for with_hooks, without, fn, reps in rows.values():
            with_hooks.append(median_ms(fn, reps))
            HookPoint.__call__ = lambda self, v: v
            without.append(median_ms(fn, reps))
            HookPoint.__call__ = real_call
    for name, (with_hooks, without, _, _) in rows.items():
        a, b = sorted(with_hooks)[2], sorted(without)[2]
        print(f"{name}: {a:.1f} ms with hook points, {b:.1f} ms with bare identities: ratio {a / b:.3f}")
    with model.caching("*.attn.hook_pattern"):
        cached = median_ms(train_step, 9)
    plain = median_ms(train_step, 9)
    print(
        f"train step with every attention pattern cached (reference path): {cached:.1f} ms vs {plain:.1f} ms "
        f"fused: {cached / plain:.2f}x"
    )


if __name__ == "__main__":
    main()
