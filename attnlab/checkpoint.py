"""Checkpoints: safetensors for tensors, JSON for everything else, written atomically.

A run folder holds ``last/`` and ``best/`` checkpoints. Each is written as ``<name>.tmp``
and swapped in with renames, so a crash leaves the previous checkpoint intact.
Nothing is ever unpickled.

    run/
      last/  config.json  model.safetensors  trainer.json  trainer.safetensors
      best/  config.json  model.safetensors
      metrics.jsonl  loss.png  data/
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file, save_model as st_save_model
from torch import nn

from . import __version__
from .errors import CheckpointError, a, one_line

CONFIG = "config.json"
WEIGHTS = "model.safetensors"
TRAINER_JSON = "trainer.json"
TRAINER_TENSORS = "trainer.safetensors"
SHARDED = "sharded"  # an FSDP run's model and optimizer shards (torch.distributed.checkpoint), in last/


def unwrap_model(model: nn.Module) -> nn.Module:
    """The plain model inside ``torch.compile`` and DDP/FSDP wrappers."""
    model = getattr(model, "_orig_mod", model)
    while isinstance(getattr(model, "module", None), nn.Module):
        model = model.module
    return model


def model_config_dict(model: nn.Module) -> dict:
    return {"attnlab_version": __version__, "model_type": model.model_type, "model": model.config.to_dict()}


def write_checkpoint(
    path: Path,
    model: nn.Module,
    meta: dict,
    trainer_state: dict | None = None,
    trainer_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """Write a complete checkpoint folder at ``path`` atomically (old one kept until the new is whole)."""
    path = Path(path)
    tmp = path.with_name(path.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        write_checkpoint_files(tmp, model, meta, trainer_state, trainer_tensors)
    except (OSError, SafetensorError) as e:
        shutil.rmtree(tmp, ignore_errors=True)
        full = getattr(e, "errno", None) == 28 or "written" in str(e) or "No space" in str(e)
        why = "the disk is full" if full else f"{type(e).__name__}: {str(e).splitlines()[0][:100]}"
        raise CheckpointError(
            f"cannot write the checkpoint {path} ({why}); the previous checkpoint there is intact: free space "
            "or choose another --out, then --resume"
        ) from None
    commit_checkpoint(tmp, path)


def write_checkpoint_files(
    folder: Path,
    model: nn.Module,
    meta: dict,
    trainer_state: dict | None = None,
    trainer_tensors: dict[str, torch.Tensor] | None = None,
) -> None:
    """The files of a checkpoint, into ``folder`` (a ``<name>.tmp`` that :func:`commit_checkpoint`
    then swaps in; other writers, such as FSDP's ranks, may have added files to it)."""
    raw = unwrap_model(model)
    st_save_model(raw, str(folder / WEIGHTS))
    if trainer_tensors is not None:
        save_file({k: v.detach().cpu().contiguous() for k, v in trainer_tensors.items()}, str(folder / TRAINER_TENSORS))
    if trainer_state is not None:
        (folder / TRAINER_JSON).write_text(json.dumps(trainer_state, indent=1))
    (folder / CONFIG).write_text(json.dumps({**model_config_dict(raw), **meta}, indent=1, ensure_ascii=False))


def commit_checkpoint(tmp: Path, path: Path) -> None:
    """Make the finished ``tmp`` folder the checkpoint ``path``: every file synced to disk, then
    the old folder renamed aside, the new one into place, the old one removed (a crash between
    the renames is repaired by :func:`recover_run`)."""
    old = path.with_name(path.name + ".old")
    for f in sorted(tmp.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    if path.exists():
        shutil.rmtree(old, ignore_errors=True)
        os.replace(path, old)
    os.replace(tmp, path)
    _fsync_dir(path.parent)  # the renames themselves survive a power cut
    shutil.rmtree(old, ignore_errors=True)


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def find_checkpoint(path: str | Path, prefer: str = "best") -> Path:
    """The checkpoint folder for ``path``: itself, or ``best/``/``last/`` inside a run folder.

    A ``<name>.old`` folder is a complete checkpoint left by a swap that a crash interrupted;
    it stands in for ``<name>`` (``recover_run`` puts it back in place)."""
    path = Path(path)
    if not path.exists():
        raise CheckpointError(f"checkpoint {path} does not exist; give a run folder written by `attnlab train`")
    if path.is_file():
        raise CheckpointError(f"{path} is a file; give the run folder (or checkpoint folder) that holds config.json")
    if (path / CONFIG).is_file():
        return path
    other = "last" if prefer == "best" else "best"
    for name in (prefer, f"{prefer}.old", other, f"{other}.old"):
        if (path / name / CONFIG).is_file() and (path / name / WEIGHTS).is_file():
            return path / name
    raise CheckpointError(f"{path} holds no checkpoint (no config.json in it, in best/ or in last/)")


def pick_checkpoint(path: str | Path, which: str | None) -> Path:
    """``eval --which best|last``: that checkpoint of the run ``path`` (a run folder, or one of its
    checkpoint folders); ``None`` keeps ``path`` as given."""
    path = Path(path)
    if which is None:
        return path
    run = path.parent if (path / CONFIG).is_file() and path.name in ("best", "last") else path
    for name in (which, f"{which}.old"):
        if (run / name / CONFIG).is_file():
            return run / name
    raise CheckpointError(f"{run} has no {which}/ checkpoint; give a run folder written by `attnlab train`")


def recover_run(out: Path) -> None:
    """Finish what a crash interrupted in ``out``: a swap stopped between its two renames leaves
    a complete ``<name>.old`` and no ``<name>`` (put it back); a stopped write leaves a partial
    ``<name>.tmp`` (remove it); a swap stopped just before cleaning up leaves both (drop the old)."""
    for name in ("last", "best"):
        cur, old, tmp = out / name, out / f"{name}.old", out / f"{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        if old.is_dir():
            if (cur / CONFIG).is_file():
                shutil.rmtree(old, ignore_errors=True)
            elif (old / CONFIG).is_file():
                shutil.rmtree(cur, ignore_errors=True)
                os.replace(old, cur)


def ensure_new_run(out: Path) -> None:
    """Refuse to start a run where one already is: never overwrite the user's checkpoints."""
    if any((Path(out) / n / CONFIG).is_file() for n in ("last", "best", "last.old", "best.old")):
        raise CheckpointError(
            f"{out} already holds a checkpoint; pass --resume to continue it, or choose another --out"
        )


def check_writable(out: Path) -> None:
    """A clear error before any work when ``out`` cannot hold a run (a file, read-only, ...)."""
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise CheckpointError(f"--out {out} is an existing file, not a folder; choose another --out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        probe = out / f".write-test-{os.getpid()}"
        probe.write_bytes(b"x")
        probe.unlink()
    except OSError as e:
        raise CheckpointError(f"cannot write to --out {out} ({e.strerror or e}); choose a writable folder") from None


class RunLock:
    """An exclusive lock on a run folder (``<out>/.lock``), held while one training writes to it.

    It is an advisory ``flock``: the kernel drops it when the process ends, however it ends, so a
    lock left by a crash is never in the way. The file keeps the holder's PID for the message."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / ".lock"
        self._fh = None

    def acquire(self) -> "RunLock":
        try:
            import fcntl
        except ImportError:  # no flock (Windows): no lock
            return self
        fh = open(self.path, "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            fh.seek(0)
            holder = fh.read().strip() or "?"
            fh.close()
            raise CheckpointError(
                f"another training (pid {holder}) is writing to {self.path.parent}; wait for it to "
                "finish or choose another --out"
            ) from None
        fh.seek(0)
        fh.truncate()
        fh.write(str(os.getpid()))
        fh.flush()
        self._fh = fh
        return self

    def release(self) -> None:
        if self._fh is not None:
            self._fh.close()  # closing the file drops the flock
            self._fh = None


_held_locks: dict[str, RunLock] = {}


def run_config(out: Path, resume: bool, kinds: tuple[str, ...]) -> dict | None:
    """Claim ``out`` for a training run and return the saved config of the run to resume
    (checked to be one of ``kinds``), or None for a new run.

    Before anything is written: ``out`` must be a writable folder, no other training may hold
    it (the lock is kept until the process exits), a crash's leftovers are repaired, and a new
    run never overwrites an existing one."""
    out = Path(out)
    created = not out.exists()
    check_writable(out)
    if int(os.environ.get("RANK", "0")) == 0:  # under torchrun only rank 0 writes, so only it locks
        key = str(out.resolve())
        if key not in _held_locks:
            _held_locks[key] = RunLock(out).acquire()
            _held_locks[key].created = created
    recover_run(out)
    if not resume:
        ensure_new_run(out)
        return None
    if not any((out / n / CONFIG).is_file() for n in ("last", "best")):
        raise CheckpointError(f"{out} holds no checkpoint to resume; run again without --resume to start it")
    ckpt = find_checkpoint(out, prefer="last")
    if ckpt.name != "last":
        raise CheckpointError(
            f"{out} has no last/ checkpoint with trainer state (only {ckpt.name}/); start a new "
            "run, or train from its weights in another --out"
        )
    saved = read_config(ckpt)
    if saved.get("model_type") not in kinds:
        raise CheckpointError(f"{out} holds {a(saved.get('model_type'))} run, not a {' or '.join(kinds)} run")
    return saved


def abandon_new_runs() -> None:
    """After an error: remove run folders this process created that hold no checkpoint yet, so
    that a refused command leaves nothing behind."""
    for key, lock in list(_held_locks.items()):
        out = Path(key)
        lock.release()
        del _held_locks[key]
        if getattr(lock, "created", False) and not any((out / n).exists() for n in ("last", "best", "last.old")):
            shutil.rmtree(out, ignore_errors=True)


def release_runs() -> None:
    """Drop every run lock this process holds (the process exiting does the same)."""
    for key in list(_held_locks):
        _held_locks.pop(key).release()


def read_config(ckpt: Path) -> dict:
    try:
        cfg = json.loads((ckpt / CONFIG).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError(f"{ckpt / CONFIG} is unreadable or corrupt ({e}); use another checkpoint") from None
    if not isinstance(cfg, dict):
        raise CheckpointError(
            f"{ckpt / CONFIG} holds a JSON {type(cfg).__name__}, not an object; it is not an "
            "attnlab or HuggingFace config"
        )
    return cfg


def upgrade_weights(model: nn.Module, tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Weights saved under names an older attnlab used, renamed for ``model``. A model lists
    its renames in ``RENAMED_WEIGHTS``: {old name: new name, or (new name, convert)}; names
    ending in "." rename every key under that prefix."""
    out = dict(tensors)
    for old, new in getattr(model, "RENAMED_WEIGHTS", {}).items():
        new, convert = new if isinstance(new, tuple) else (new, None)
        for key in [k for k in out if k == old or (old.endswith(".") and k.startswith(old))]:
            t = out.pop(key)
            out[new + key[len(old) :] if old.endswith(".") else new] = convert(t) if convert else t
    return out


def load_weights(model: nn.Module, ckpt: Path) -> None:
    """Load ``model.safetensors`` into ``model``, after checking that the file is whole, that its
    tensors have the shapes the config implies, and that every value is finite."""
    f = ckpt / WEIGHTS
    if not f.is_file():
        raise CheckpointError(f"{f} is missing; the checkpoint is incomplete, use another one")
    try:
        tensors = upgrade_weights(model, load_file(str(f)))
    except (SafetensorError, OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(
            f"{f} is truncated or corrupt ({str(e).splitlines()[0]}); use another checkpoint"
        ) from None
    expected = model.state_dict()
    wrong = [
        (k, tuple(t.shape), tuple(expected[k].shape))
        for k, t in tensors.items()
        if k in expected and t.shape != expected[k].shape
    ]
    if wrong:
        k, got, want = wrong[0]
        raise CheckpointError(
            f"{f} does not match its config: {k} has shape {list(got)} but the config implies "
            f"{list(want)} ({len(wrong)} tensor(s) differ); the config.json belongs to another model"
        )
    missing, unexpected = model.load_state_dict(tensors, strict=False)
    # tied weights (an output head sharing the embedding) are saved once: missing names that share
    # storage with a loaded one are fine
    loaded = {expected[k].data_ptr() for k in tensors if k in expected}
    missing = [k for k in missing if expected[k].data_ptr() not in loaded]
    if missing or unexpected:
        raise CheckpointError(
            f"{f} does not match its config: missing {sorted(missing)[:3]}, unexpected {sorted(unexpected)[:3]}"
        )
    bad = next(
        (n for n, t in model.state_dict().items() if t.is_floating_point() and not torch.isfinite(t).all()), None
    )
    if bad is not None:
        raise CheckpointError(
            f"{f} holds NaN or infinite values (first in {bad}): the run diverged before it was "
            "saved; use an earlier checkpoint"
        )


def load_trainer_state(ckpt: Path) -> tuple[dict, dict[str, torch.Tensor]]:
    try:
        state = json.loads((ckpt / TRAINER_JSON).read_text())
        tensors = load_file(str(ckpt / TRAINER_TENSORS))
    except FileNotFoundError:
        raise CheckpointError(f"{ckpt} has no trainer state (it is a weights-only checkpoint); cannot resume") from None
    except (SafetensorError, OSError, ValueError) as e:  # (JSON that is not, bytes that are not UTF-8)
        raise CheckpointError(f"trainer state in {ckpt} is corrupt ({one_line(e)}); cannot resume from it") from None
    numbers = [state.get(k) for k in ("step", "best_val")] if isinstance(state, dict) else [None]
    if not isinstance(numbers[0], int) or any(
        isinstance(v, bool) or not isinstance(v, (int, float, type(None))) for v in numbers
    ):
        raise CheckpointError(
            f"trainer state in {ckpt / TRAINER_JSON} is corrupt (its step or best value is not a number); cannot resume from it"
        )
    return state, tensors
