"""Times the README's first hour, command by command, on this machine: once quiet, once with another
job keeping every core busy (``--busy N`` processes spinning, default: one per core). The README's
ranges and the embedded default runs' banners ("expect 27-54 seconds") come from this table.

    ATTNLAB_DATA=../shared/data python benchmarks/first_hour.py            # about 10 minutes on 2 cores

Runs in a fresh temporary folder; prints a Markdown table (seconds quiet, seconds busy).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time

STEPS = [
    ("make demo's training (train gpt --max-iters 900)", "attnlab train gpt --out runs/demo --sample-chars 0 --max-iters 900"),
    ("train gpt (embedded default)", "attnlab train gpt --out runs/gpt --sample-chars 0"),
    ("train gpt --data shakespeare", "attnlab train gpt --data shakespeare --out runs/shk"),
    ("sample", 'attnlab sample --ckpt runs/shk --prompt "ROMEO:" --temperature 0.6 --seed 1'),
    ("inspect attention", 'attnlab inspect attention --ckpt runs/shk --text "ROMEO: What light" --out out/att.png'),
    ("inspect lens", 'attnlab inspect lens --ckpt runs/shk --text "ROMEO: What light" --out out/lens.png'),
    ("explore", 'attnlab explore --ckpt runs/shk --text "ROMEO: What light through yonder window breaks" --out out/shk.html'),
    ("train vit (embedded default)", "attnlab train vit --out runs/vit"),
    ("inspect distance", "attnlab inspect distance --ckpt runs/vit --out out/dist.png"),
    ("inspect positions", "attnlab inspect positions --ckpt runs/vit --out out/pos.png"),
    ("train seq2seq (embedded default)", "attnlab train seq2seq --out runs/s2s"),
    ("reproduce 3 claims", "attnlab reproduce worked-example scaling permutation --out out/claims"),
]  # fmt: skip


def spin() -> None:
    while True:
        pass


def timed(steps, folder: str) -> list[float]:
    out = []
    for _, command in steps:
        words = shlex.split(command)
        start = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "attnlab", *words[1:]], cwd=folder, capture_output=True, text=True)
        out.append(time.perf_counter() - start)
        if done.returncode != 0:
            raise SystemExit(f"{command} failed: {done.stderr.strip().splitlines()[-1:]}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--busy", type=int, default=os.cpu_count(), help="spinning processes in the busy pass")
    parser.add_argument("--only", help="run only the steps whose label contains this text")
    args = parser.parse_args()
    steps = [s for s in STEPS if not args.only or args.only in s[0]]
    with tempfile.TemporaryDirectory() as quiet_dir:
        quiet = timed(steps, quiet_dir)
    spinners = [multiprocessing.Process(target=spin, daemon=True) for _ in range(args.busy)]
    for p in spinners:
        p.start()
    try:
        with tempfile.TemporaryDirectory() as busy_dir:
            busy = timed(steps, busy_dir)
    finally:
        for p in spinners:
            p.terminate()
    cpu = platform.processor() or platform.machine()
    print(f"{os.cpu_count()} cores ({cpu}), {args.busy} other processes spinning in the busy pass\n")
    print("| step | quiet (s) | busy (s) |\n|---|---:|---:|")
    for (label, _), q, b in zip(steps, quiet, busy):
        print(f"| {label} | {q:.0f} | {b:.0f} |")


if __name__ == "__main__":
    main()
