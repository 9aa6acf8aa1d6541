"""Streaming preparation into token shards (issue 50): peak memory against the corpus's size, and
throughput against the tokenizer alone, in one run.

    python benchmarks/prepare_shards.py --work /tmp/shards-bench            # 0.5 GB and 4 GB, chars; BPE on 200 MB
    python benchmarks/prepare_shards.py --work /tmp/b --sizes 0.05 0.2 --bpe-mb 20   # a quick look

For each size a corpus of random English-like lines is generated (files of 64 MB), then prepared
by `attnlab data prepare` in a child process, whose peak resident memory is read from the kernel
(its own ``VmHWM`` in /proc/self/status at its end: ``wait4``'s ru_maxrss would also count the
memory this process held when it forked the child) and its wall time from the clock (process start and imports included);
then a one-step `attnlab train gpt --data SHARDS` is timed whole, which bounds when its first step
starts. BPE: the preparation against
``tokenizers``' own batch encoding of the same documents (the same batches of 8 MiB, the same
tokenizer, timed on the encoding calls alone) in the same run.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

WORDS = (
    "the of and to in is was that for it with as his on be at by had are but from or have an they which one you "
    "were her all she there would their we him been has when who will more no if out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over"
).split()


def make_corpus(folder: Path, gigabytes: float, seed: int = 0) -> int:
    """Files of 64 MB of random lines of 6 to 14 words (one block, drawn once and written again for
    each file: the preparation's work does not depend on repeats) until ``gigabytes`` GB: its bytes."""
    marker = folder.parent / f"{folder.name}.bytes"  # (beside it: the corpus is every file inside)
    if marker.is_file():
        return int(marker.read_text())
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    rng, vocab = np.random.default_rng(seed), np.array(WORDS)
    words = vocab[rng.integers(0, len(vocab), 12_000_000)]
    cuts = np.cumsum(rng.integers(6, 15, 1_200_000))
    cuts = cuts[cuts < len(words)]
    block = "\n".join(" ".join(words[a:b]) for a, b in zip(np.r_[0, cuts[:-1]], cuts))
    block = block[:64_000_000].rsplit("\n", 1)[0] + "\n"
    total, target, n = 0, int(gigabytes * 1e9), 0
    while total < target:
        data = block if target - total >= len(block) else block[: target - total].rsplit("\n", 1)[0] + "\n"
        (folder / f"part{n:04d}.txt").write_text(data, encoding="ascii")
        total += len(data)
        n += 1
    marker.write_text(str(total))
    return total


PREPARE = """
import sys, json
from attnlab.data.shards import prepare
args = json.loads(sys.argv[1])
prepare(args.pop("source"), args.pop("out"), progress=True, **args)
print(next(line for line in open("/proc/self/status") if line.startswith("VmHWM")), file=sys.stderr)
"""


def measured_preparation(source: Path, out: Path, **options) -> dict:
    """Prepare ``source`` in a child process: its wall seconds, those of its tokenising and writing
    alone (after the vocabulary), and its peak resident memory (MB)."""
    import re

    shutil.rmtree(out, ignore_errors=True)
    start = time.perf_counter()
    argv = [sys.executable, "-c", PREPARE, json.dumps({"source": str(source), "out": str(out), **options})]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    log = proc.stderr.read()
    status = proc.wait()
    seconds = time.perf_counter() - start
    if status != 0:
        raise SystemExit(f"the preparation of {source} failed (status {status})")
    index = json.loads((out / "index.json").read_text())
    tokens = sum(s["tokens"] for split in index["splits"].values() for s in split["shards"])
    tokenising = float(re.search(r"done in ([\d,.]+) s", log).group(1).replace(",", ""))
    peak_kb = int(re.search(r"VmHWM:\s+(\d+) kB", log).group(1))
    return {"seconds": seconds, "tokenising_s": tokenising, "peak_mb": peak_kb / 1024, "tokens": tokens}


def first_step_seconds(shards: Path, work: Path) -> float:
    """Wall seconds of a whole one-step `attnlab train gpt --data SHARDS` (start, the first step,
    its evaluation and checkpoint): an upper bound on when its first step starts."""
    run = work / "first_step_run"
    shutil.rmtree(run, ignore_errors=True)
    argv = [sys.executable, "-m", "attnlab", "train", "gpt", "--data", str(shards), "--out", str(run), "--preset",
            "nano", "--max-iters", "1", "--eval-iters", "1", "--sample-chars", "0", "--no-progress", "--device",
            "cpu", "--no-compile"]  # fmt: skip
    start = time.perf_counter()
    subprocess.run(argv, check=True, capture_output=True)
    seconds = time.perf_counter() - start
    shutil.rmtree(run)
    return seconds


def tokenizer_alone(source: Path, tokenizer_dict: dict) -> float:
    """Seconds ``tokenizers``' own batch encoding takes over the documents of ``source`` (the
    preparation's batches of 8 MiB), counting the encoding calls only."""
    from attnlab.data.shards import document_batches
    from attnlab.tokens import tokenizer_from_dict

    tok = tokenizer_from_dict(tokenizer_dict).hf_tokenizer()
    seconds = 0.0
    for batch in document_batches(str(source)):
        texts = [text for _, text, _ in batch]
        start = time.perf_counter()
        tok.encode_batch(texts, add_special_tokens=False)
        seconds += time.perf_counter() - start
    return seconds


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work", type=Path, required=True, help="folder for the corpora and shards (about 14 GB)")
    p.add_argument("--sizes", type=float, nargs="+", default=[0.5, 4.0], help="corpus sizes in GB (characters)")
    p.add_argument("--bpe-mb", type=float, default=200, help="the BPE corpus's size in MB (default 200)")
    p.add_argument("--json", type=Path, default=None, help="also write the rows as JSON")
    args = p.parse_args()
    rows = []
    for gb in args.sizes:
        source = args.work / f"corpus_{gb:g}GB"
        n_bytes = make_corpus(source, gb)
        r = measured_preparation(source, args.work / f"shards_{gb:g}GB", tokenizer="char")
        first = first_step_seconds(args.work / f"shards_{gb:g}GB", args.work)
        r.update(kind="char", bytes=n_bytes, mb_per_s=n_bytes / 1e6 / r["seconds"], one_step_run_s=first)
        rows.append(r)
        print(f"char {n_bytes / 1e9:.2f} GB: {r['seconds']:.1f} s, {r['mb_per_s']:.0f} MB/s, peak RSS "
              f"{r['peak_mb']:.0f} MB, {r['tokens']:,} tokens; a one-step training run on the shards "
              f"{first:.1f} s", flush=True)  # fmt: skip
        shutil.rmtree(args.work / f"shards_{gb:g}GB")
    if len(rows) > 1:
        low, high = rows[0]["peak_mb"], rows[-1]["peak_mb"]
        print(f"peak RSS {high:.0f} MB at {args.sizes[-1]:g} GB against {low:.0f} MB at {args.sizes[0]:g} GB: "
              f"{100 * (high - low) / low:+.1f} %", flush=True)  # fmt: skip
    source = args.work / f"corpus_bpe_{args.bpe_mb:g}MB"
    n_bytes = make_corpus(source, args.bpe_mb / 1000, seed=1)
    out = args.work / "shards_bpe"
    r = measured_preparation(source, out, tokenizer="bpe", vocab_size=8192, sample_mb=min(64.0, args.bpe_mb / 4))
    index = json.loads((out / "index.json").read_text())
    alone = tokenizer_alone(source, index["tokenizer"])
    r.update(kind="bpe", bytes=n_bytes, mb_per_s=n_bytes / 1e6 / r["seconds"], tokenizer_alone_s=alone,
             tokenizer_mb_per_s=n_bytes / 1e6 / alone)  # fmt: skip
    rows.append(r)
    print(f"bpe {n_bytes / 1e6:.0f} MB (8,192 tokens, trained on the first {min(64.0, args.bpe_mb / 4):g} MB): "
          f"{r['seconds']:.1f} s with the vocabulary, {r['tokenising_s']:.1f} s tokenising and writing "
          f"({n_bytes / 1e6 / r['tokenising_s']:.1f} MB/s); tokenizers' batch encoding alone {alone:.1f} s "
          f"({r['tokenizer_mb_per_s']:.1f} MB/s): the pipeline keeps {100 * alone / r['tokenising_s']:.0f} % of its "
          f"throughput; peak RSS {r['peak_mb']:.0f} MB", flush=True)  # fmt: skip
    shutil.rmtree(out)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
