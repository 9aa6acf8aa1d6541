"""Shared helpers for the benchmark scripts: timing, peak matmul throughput, tables."""

from __future__ import annotations

import json
import statistics
import time
from collections.abc import Callable

import torch


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def time_it(fn: Callable[[], object], *, warmup: int = 3, repeat: int = 10, device: str = "cpu") -> float:
    """Median seconds per call."""
    for _ in range(warmup):
        fn()
    sync(device)
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        sync(device)
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def matmul_peak(dtype=torch.float32, n: int = 1024, device: str = "cpu", seconds: float = 1.0) -> float:
    """Measured FLOP/s of a square matmul on this machine (the MFU denominator)."""
    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    for _ in range(2):
        a @ b
    sync(device)
    iters, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        a @ b
        iters += 1
    sync(device)
    return 2 * n**3 * iters / (time.perf_counter() - t0)


def print_table(rows: list[dict], columns: list[str]) -> str:
    widths = {c: max(len(c), *(len(_fmt(r.get(c))) for r in rows)) for c in columns}
    lines = ["| " + " | ".join(c.ljust(widths[c]) for c in columns) + " |",
             "|" + "|".join("-" * (widths[c] + 2) for c in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_fmt(r.get(c)).ljust(widths[c]) for c in columns) + " |")
    text = "\n".join(lines)
    print(text, flush=True)
    return text


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.3g}" if abs(v) < 1000 else f"{v:,.0f}"
    return str(v)


def save_json(rows: list[dict], path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)
