"""Conversations to fine-tune a chat model on: a JSONL file, one conversation per line, in
OpenAI's fine-tuning format (``{"messages": [{"role": ..., "content": ...}, ...]}``, or the bare
list), each rendered with the model's chat template into token ids and the mask of the tokens the
assistant wrote (:meth:`attnlab.tokens.chat.ChatTemplate.assistant_tokens`)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from ..errors import DataError, OptionError

VAL_EVERY = 10  # every 10th conversation is a validation one (at least one)


@dataclass
class ChatData:
    """``train`` / ``val``: (ids, assistant mask) per conversation, cut to the model's context + 1."""

    train: list[tuple[list[int], list[bool]]]
    val: list[tuple[list[int], list[bool]]]
    tokenizer: object
    name: str
    notes: tuple[str, ...] = ()


def read_conversations(path: str | Path) -> list[list[dict]]:
    """The conversations of a JSONL file, refused in one line naming the line that is wrong."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DataError(f"--data {path}: no such file; chat fine-tuning reads a JSONL file of conversations")
    conversations = []
    with p.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                item = json.loads(line)
            except json.JSONDecodeError as e:
                raise DataError(f"{p}:{n}: not JSON ({e.msg}); each line is one conversation") from None
            messages = item.get("messages") if isinstance(item, dict) else item
            if not isinstance(messages, list):
                raise DataError(
                    f'{p}:{n}: a line is {{"messages": [{{"role": ..., "content": ...}}, ...]}} or that list'
                )
            conversations.append(messages)
    if len(conversations) < 2:
        raise DataError(f"{p} holds {len(conversations)} conversation(s); give at least 2 (one is kept to validate)")
    return conversations


def chat_data(path: str | Path, template, tokenizer, context: int) -> ChatData:
    """The conversations of ``path`` as training examples for a model of ``context`` tokens:
    every 10th one for validation; a conversation longer than the context is cut (said in
    ``notes``), one left with no assistant token is dropped."""
    examples, cut, dropped = [], 0, 0
    for n, messages in enumerate(read_conversations(path), 1):
        try:
            ids, mask = template.assistant_tokens(messages, tokenizer)
        except OptionError as e:
            raise DataError(f"{path}: conversation {n}: {e}") from None
        if len(ids) > context + 1:
            ids, mask, cut = ids[: context + 1], mask[: context + 1], cut + 1
        if not any(mask[1:]):
            dropped += 1
            continue
        examples.append((ids, mask))
    if len(examples) < 2:
        raise DataError(f"{path}: {len(examples)} conversation(s) keep an assistant turn within the context")
    held = set(range(VAL_EVERY - 1, len(examples), VAL_EVERY)) or {len(examples) - 1}
    train = [e for i, e in enumerate(examples) if i not in held]
    val = [e for i, e in enumerate(examples) if i in held]
    notes = []
    if cut:
        notes.append(f"{cut} conversation(s) longer than the context of {context} tokens were cut to it")
    if dropped:
        notes.append(f"{dropped} conversation(s) whose assistant turns lie past the context were dropped")
    return ChatData(train, val, tokenizer, Path(path).name, tuple(notes))
