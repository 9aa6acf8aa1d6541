"""Shared helpers for the benchmark scripts (the same ones `attnlab bench` uses)."""

from __future__ import annotations

import json

from attnlab.bench import markdown_table, matmul_peak, sync, time_it  # noqa: F401


def print_table(rows: list[dict], columns: list[str]) -> str:
    text = markdown_table(rows, columns)
    print(text, flush=True)
    return text


def print_row(row: dict) -> None:
    """One measured row, printed at once (a part stopped at its time limit keeps what it printed)."""
    print("row: " + " | ".join(f"{k}: {v}" for k, v in row.items()), flush=True)


def save_json(rows, path: str | None) -> None:
    if path:
        with open(path, "w") as f:
            json.dump(rows, f, indent=1)


def compile_eagerly() -> None:
    """For a --smoke run (a check of the code paths on a CPU, not a measurement): ``torch.compile``
    with dynamo's eager backend. Dynamo still captures every graph, so the graph, break and recompile
    counts a smoke run prints are those of the real run; only inductor's code generation, most of a
    CPU smoke run's time, is left out."""
    import functools

    import torch

    real = torch.compile

    @functools.wraps(real)
    def compile(model=None, **options):
        kept = {k: v for k, v in options.items() if k in ("fullgraph", "dynamic", "disable")}
        if model is None:  # (used as a decorator factory: @torch.compile(...))
            return lambda fn: real(fn, backend="eager", **kept)
        return real(model, backend="eager", **kept)

    torch.compile = compile
