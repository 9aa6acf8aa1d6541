"""What a run trained on, recorded so that ``--resume`` can tell when the data is not the same:
for a file or folder, its files' count, bytes and a SHA-256 over their names and contents; for a
named or generated dataset, its name (its content comes with attnlab or a checked download)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from ..errors import CheckpointError


def fingerprint(spec: str | None) -> dict | None:
    """The record of ``spec`` (None: the family's default data, nothing to compare)."""
    if spec is None:
        return None
    from .shards import is_shard_folder, shards_fingerprint

    if is_shard_folder(spec):  # (its index holds every shard's SHA-256: the shards are not read again)
        return shards_fingerprint(spec)
    path = Path(str(spec)).expanduser()
    if not path.exists():
        return {"name": str(spec)}
    files = (
        sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith(".")) if path.is_dir() else [path]
    )
    digest, size = hashlib.sha256(), 0
    for f in files:
        digest.update(str(f.relative_to(path) if path.is_dir() else f.name).encode() + b"\0")
        with open(f, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
                size += len(block)
    return {"path": str(spec), "files": len(files), "bytes": size, "sha256": digest.hexdigest()}


def describe(record: dict) -> str:
    if "sha256" in record:
        return (
            f"{record['path']} ({record['files']} file(s), {record['bytes']:,} bytes, sha256 {record['sha256'][:12]})"
        )
    return record["name"]


def check_same_data(out, saved: dict | None, now: dict | None) -> None:
    """On --resume: refuse data that is not what the run trained on (another corpus given with
    --data, or the run's own files changed since), naming both."""
    if not saved or not now:
        return
    key = "sha256" if "sha256" in saved and "sha256" in now else "name"
    if key == "name" and ("sha256" in saved) != ("sha256" in now):
        same = False
    else:
        same = saved.get(key) == now.get(key)
    if not same:
        changed = saved.get("path") == now.get("path") and "sha256" in now
        why = "its data changed since it started" if changed else "this is not the data it trained on"
        raise CheckpointError(
            f"--resume {out}: {why}: it trained on {describe(saved)}, now {describe(now)}; resume on the same "
            "data, or start a new run in another --out"
        )
