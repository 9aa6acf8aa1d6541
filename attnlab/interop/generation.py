"""What a checkpoint says about generating from it, besides its weights: the end-of-sequence ids
generation stops at, the sampling defaults of ``generation_config.json`` and the chat template.

Read from a HuggingFace folder (``config.json``, ``generation_config.json``,
``tokenizer_config.json``, ``special_tokens_map.json``, ``chat_template.jinja`` /
``chat_template.json``), kept in an attnlab run's config.json (``"generation"``) when a run starts
from such a checkpoint (``--init``), and written back by :func:`attnlab.interop.export_hf`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..errors import CheckpointError
from ..tokens.chat import SPECIAL_TOKEN_NAMES, ChatTemplate

# generation_config.json's sampling entries attnlab honours (its chat), by attnlab's names
SAMPLING_KEYS = ("temperature", "top_k", "top_p")


@dataclass(frozen=True)
class GenerationSettings:
    """``eos_ids``: the tokens that end a generation (none: it runs to its length); ``bos_id`` and
    ``pad_id`` as the checkpoint names them; ``sampling``: generation_config.json's temperature /
    top_k / top_p (temperature 0 where it says ``do_sample: false``); ``chat_template``: the
    template and its special tokens, or None."""

    eos_ids: tuple[int, ...] = ()
    bos_id: int | None = None
    pad_id: int | None = None
    sampling: dict[str, Any] = field(default_factory=dict)
    chat_template: ChatTemplate | None = None

    def to_dict(self) -> dict:
        return {
            "eos_token_id": list(self.eos_ids),
            "bos_token_id": self.bos_id,
            "pad_token_id": self.pad_id,
            "sampling": dict(self.sampling),
            "chat_template": self.chat_template.to_dict() if self.chat_template else None,
        }

    @classmethod
    def from_dict(cls, d: dict | None) -> "GenerationSettings":
        if not d:
            return cls()
        template = d.get("chat_template")
        return cls(
            eos_ids=_ids(d.get("eos_token_id")),
            bos_id=d.get("bos_token_id"),
            pad_id=d.get("pad_token_id"),
            sampling=dict(d.get("sampling") or {}),
            chat_template=ChatTemplate.from_dict(template) if template else None,
        )

    def __bool__(self) -> bool:
        return bool(self.eos_ids or self.sampling or self.chat_template or self.bos_id is not None)


def _ids(value: Any) -> tuple[int, ...]:
    """A config's token id entry (an id, a list of them, or null) as a tuple."""
    if value is None:
        return ()
    items = value if isinstance(value, list) else [value]
    if any(isinstance(i, bool) or not isinstance(i, int) for i in items):
        raise CheckpointError(f"eos_token_id {value!r} is not a token id or a list of them")
    return tuple(items)


def _json(path: Path) -> dict:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path} is not valid JSON ({e})") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: its text, or an AddedToken's dict."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def read_chat_template(folder: Path, tokenizer_config: dict) -> str | None:
    """The folder's chat template: chat_template.jinja, chat_template.json, or tokenizer_config.json's
    ``chat_template`` (a string, or a list of named templates: the one named "default")."""
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    source = _json(folder / "chat_template.json").get("chat_template") or tokenizer_config.get("chat_template")
    if isinstance(source, list):
        named = {t.get("name"): t.get("template") for t in source if isinstance(t, dict)}
        source = named.get("default")
    return source if isinstance(source, str) and source.strip() else None


def read_generation(folder: str | Path) -> GenerationSettings:
    """The generation settings of HuggingFace folder ``folder``: its end-of-sequence ids
    (generation_config.json's, else config.json's, as ``transformers``' ``generate`` reads them), its
    sampling defaults and its chat template with the tokenizer's special tokens."""
    d = Path(folder)
    config, generation = _json(d / "config.json"), _json(d / "generation_config.json")
    text_config = config.get("text_config") if isinstance(config.get("text_config"), dict) else {}

    def entry(name: str):
        for source in (generation, config, text_config):
            if source.get(name) is not None:
                return source[name]
        return None

    sampling: dict[str, Any] = {}
    if generation:  # (transformers samples only where do_sample is true; otherwise it is greedy)
        if generation.get("do_sample") is True:
            sampling.update({k: generation[k] for k in SAMPLING_KEYS if generation.get(k) is not None})
        else:
            sampling["temperature"] = 0.0
    tokenizer_config = {**_json(d / "special_tokens_map.json"), **_json(d / "tokenizer_config.json")}
    special = {n: _token_text(tokenizer_config.get(n)) for n in SPECIAL_TOKEN_NAMES}
    source = read_chat_template(d, tokenizer_config)
    return GenerationSettings(
        eos_ids=_ids(entry("eos_token_id")),
        bos_id=entry("bos_token_id") if isinstance(entry("bos_token_id"), int) else None,
        pad_id=entry("pad_token_id") if isinstance(entry("pad_token_id"), int) else None,
        sampling=sampling,
        chat_template=ChatTemplate(source, {k: v for k, v in special.items() if v}) if source else None,
    )


def write_generation(settings: GenerationSettings, folder: str | Path, config: dict) -> None:
    """``settings`` into the HuggingFace folder ``folder`` being written: the end, start and padding
    ids into ``config`` (config.json's entries, updated in place) and generation_config.json, the
    chat template into chat_template.jinja and its special tokens into tokenizer_config.json."""
    d = Path(folder)
    ids = {"bos_token_id": settings.bos_id, "pad_token_id": settings.pad_id}
    if settings.eos_ids:
        ids["eos_token_id"] = settings.eos_ids[0] if len(settings.eos_ids) == 1 else list(settings.eos_ids)
    ids = {k: v for k, v in ids.items() if v is not None}
    config.update(ids)
    generation: dict[str, Any] = dict(ids)
    temperature = settings.sampling.get("temperature")
    if temperature == 0:
        generation["do_sample"] = False
    elif settings.sampling:
        generation.update(do_sample=True, **settings.sampling)
    if generation:
        (d / "generation_config.json").write_text(json.dumps(generation, indent=1))
    if settings.chat_template is not None:
        (d / "chat_template.jinja").write_text(settings.chat_template.source, encoding="utf-8")
        path = d / "tokenizer_config.json"
        tokenizer_config = _json(path)
        tokenizer_config.update(settings.chat_template.special_tokens)
        path.write_text(json.dumps(tokenizer_config, indent=1))
