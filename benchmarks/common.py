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
