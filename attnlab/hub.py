"""Models by name: a HuggingFace hub id (``gpt2``, ``google/vit-base-patch16-224``,
``bert-base-uncased``) wherever a run folder is taken (``attnlab.load``, ``--ckpt``, ``--init``),
read from the HuggingFace cache (``~/.cache/huggingface/hub``, or ``HF_HUB_CACHE``).

A name that is not a folder here is looked up in the cache first; if the cache lacks it, it is
downloaded once (config, safetensors weights and tokenizer files only: never a pickle; the hub
client checks each file's hash), unless ``HF_HUB_OFFLINE=1``, where the error says how to fetch it.
attnlab converts GPT-2, Llama, Qwen2, Qwen3, Mistral, Phi-3, Gemma 2 and 3, GPT-NeoX (Pythia), ViT
and BERT checkpoints (:mod:`attnlab.interop`).
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from .errors import CheckpointError

# what a checkpoint folder needs, and nothing that would be unpickled
HUB_FILES = [
    "config.json",
    "*.safetensors",
    "*.safetensors.index.json",  # (a sharded checkpoint's map of which shard holds which tensor)
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "vocab.json",
    "merges.txt",
    "vocab.txt",
    "preprocessor_config.json",
]
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?$")


def is_hub_id(text: str) -> bool:
    """Whether ``text`` reads as a hub id (``name`` or ``owner/name``) rather than a path: not a
    path to a file, and ``owner/`` is not a folder here (``runs/gpt`` names a run that is missing)."""
    if not _HUB_ID.match(text) or ".." in text or text.endswith((".json", ".safetensors")):
        return False
    return "/" not in text or not Path(text.split("/")[0]).is_dir()


def resolve(path: str | Path) -> Path:
    """``path`` itself when it exists here (or cannot be a hub id), else the local folder of the
    hub model of that name, from the cache or downloaded into it."""
    local = Path(path)
    if local.exists() or not is_hub_id(str(path)):
        return local
    name = str(path)
    try:
        import huggingface_hub
        from huggingface_hub.errors import LocalEntryNotFoundError
    except ImportError:
        raise CheckpointError(
            f"{name} is not a folder here; to read it from the HuggingFace hub, pip install 'attnlab[hub]' "
            "(huggingface_hub and datasets)"
        ) from None
    try:
        return Path(huggingface_hub.snapshot_download(name, allow_patterns=HUB_FILES, local_files_only=True))
    except LocalEntryNotFoundError:
        pass
    fetch = (
        f"hf download {name} --include config.json '*.safetensors' '*.safetensors.index.json' 'tokenizer*' "
        "vocab.json merges.txt vocab.txt"
    )
    if _offline():
        raise CheckpointError(
            f"{name} does not exist here, nor in the HuggingFace cache ({_cache()}); give a run folder, or "
            f"with a network fetch the hub model once: {fetch} (or unset HF_HUB_OFFLINE: attnlab downloads it)"
        )
    try:
        return Path(huggingface_hub.snapshot_download(name, allow_patterns=HUB_FILES))
    except Exception as e:  # (no network, no such repository, a gated one: the hub client's own reasons)
        reason = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
        raise CheckpointError(
            f"{name} does not exist here, and the HuggingFace hub did not give it ({reason}); give a run "
            "folder, or check the hub name"
        ) from None


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _cache() -> str:
    try:
        from huggingface_hub import constants

        return str(constants.HF_HUB_CACHE)
    except ImportError:
        return "~/.cache/huggingface/hub"
