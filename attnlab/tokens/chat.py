"""Chat templates: a conversation (a list of ``{"role": ..., "content": ...}`` messages) as the
text an instruct model was trained on, rendered by the checkpoint's own Jinja template.

The template is rendered as HuggingFace ``transformers``' ``apply_chat_template`` renders it, so
the ids are the same: jinja2's immutable sandbox (a template from the Hub is untrusted code),
``trim_blocks`` and ``lstrip_blocks``, the loop-controls extension, a ``tojson`` that keeps
non-ASCII text, the ``raise_exception`` and ``strftime_now`` globals, the ``{% generation %}``
block (rendered as its body), and the tokenizer's named special tokens (``bos_token``,
``eos_token`` …) as variables. The text is then encoded without adding special tokens: the
template writes them.
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from ..errors import OptionError

# the tokenizer's named special tokens transformers passes to a template (its special_tokens_map)
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# the roles chat models are trained with (OpenAI's and HuggingFace's)
ROLES = ("system", "developer", "user", "assistant", "tool")


class ChatTemplateError(OptionError):
    """A template that cannot be read, or refuses the conversation (its own ``raise_exception``)."""


def check_messages(messages: Any) -> list[dict]:
    """``messages`` as a list of plain dicts, or one line saying what is wrong with them: a list of
    ``{"role": one of ROLES, "content": text}`` (an assistant message may carry ``tool_calls``
    instead of text; other keys, which some templates read, are kept)."""
    if not isinstance(messages, (list, tuple)) or not messages:
        raise OptionError(
            'messages must be a non-empty list of {"role": ..., "content": ...} dicts, '
            f"got {type(messages).__name__ if not isinstance(messages, (list, tuple)) else 'an empty list'}"
        )
    checked = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise OptionError(f'message {i} must be a {{"role": ..., "content": ...}} dict, got {type(m).__name__}')
        role = m.get("role")
        if role not in ROLES:
            raise OptionError(f"message {i} has role {role!r}; a role is one of {', '.join(ROLES)}")
        content = m.get("content")
        if not isinstance(content, str) and not (content is None and role == "assistant" and m.get("tool_calls")):
            raise OptionError(f"message {i} ({role}) needs its content as text, got {type(content).__name__}")
        checked.append(dict(m))
    return checked


class ChatTemplate:
    """A checkpoint's chat template (Jinja source) and the special tokens it is rendered with."""

    def __init__(self, source: str, special_tokens: dict[str, str] | None = None) -> None:
        if not isinstance(source, str) or not source.strip():
            raise ChatTemplateError("a chat template must be non-empty Jinja text")
        self.source = source
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if k in SPECIAL_TOKEN_NAMES and v}
        _compiled(source)  # (a template that does not parse is refused when read, not at the first chat)

    def render(
        self, messages: Any, *, add_generation_prompt: bool = True, continue_final_message: bool = False, **variables
    ) -> str:
        """The conversation as text: ``add_generation_prompt`` ends it with the start of the
        assistant's turn (what a model continues); ``continue_final_message`` leaves the last
        message open for the model to go on writing. ``variables``: what the template reads besides
        (``tools``, ``documents``, ``enable_thinking`` …)."""
        import jinja2

        chat = check_messages(messages)
        if add_generation_prompt and continue_final_message:
            raise OptionError("add_generation_prompt and continue_final_message exclude each other; choose one")
        tag = "\x00attnlab-continue\x00"
        if continue_final_message:
            if not isinstance(chat[-1].get("content"), str):
                raise OptionError("continue_final_message needs the last message's content as text")
            chat[-1]["content"] += tag
        context = {"tools": None, "documents": None, **self.special_tokens, **variables}
        try:
            text = _compiled(self.source).render(messages=chat, add_generation_prompt=add_generation_prompt, **context)
        except jinja2.TemplateError as e:
            raise ChatTemplateError(f"the chat template refuses these messages: {e}") from None
        except Exception as e:  # noqa: BLE001 - a template is a program: its failure is said in one line
            raise ChatTemplateError(f"the chat template failed to render ({type(e).__name__}: {e})") from None
        if continue_final_message:
            if tag not in text:
                raise ChatTemplateError("continue_final_message: the template does not write the last message")
            text = text[: text.rindex(tag)]
        return text

    def assistant_tokens(self, messages: Any, tokenizer, **variables) -> tuple[list[int], list[bool]]:
        """The ids of the whole conversation (``apply_chat_template``'s, without a generation prompt)
        and, for each, whether the assistant wrote it: its turns' text and what ends each turn
        (the end token), what chat fine-tuning learns; the system and user turns and the template's
        own words are context. A token is the assistant's where it starts inside a span that the
        assistant's message adds to the text rendered up to the start of its turn."""
        chat = check_messages(messages)
        if chat[0]["role"] == "assistant":
            raise OptionError("a conversation to learn from starts with a system or user message, not the assistant's")
        if not any(m["role"] == "assistant" for m in chat):
            raise OptionError("a conversation to learn from needs at least one assistant message")
        if not hasattr(tokenizer, "encode_with_offsets"):
            raise OptionError(
                f"chat fine-tuning needs a subword tokenizer with offsets, not {type(tokenizer).__name__}"
            )
        text = self.render(chat, add_generation_prompt=False, **variables)
        spans = []
        for i, m in enumerate(chat):
            if m["role"] != "assistant":
                continue
            before = self.render(chat[:i], add_generation_prompt=True, **variables)
            through = self.render(chat[: i + 1], add_generation_prompt=False, **variables)
            if not (text.startswith(through) and through.startswith(before)):
                raise ChatTemplateError(
                    f"the chat template does not render message {i} after the turns before it (it rewrites earlier "
                    "turns); chat fine-tuning needs one that renders a conversation turn by turn"
                )
            spans.append((len(before), len(through)))
        ids, offsets = tokenizer.encode_with_offsets(text)
        mask = [any(s <= start < e for s, e in spans) for start, _ in offsets]
        return ids, mask

    def to_dict(self) -> dict:
        return {"template": self.source, "special_tokens": dict(self.special_tokens)}

    @classmethod
    def from_dict(cls, d: dict) -> "ChatTemplate":
        return cls(d["template"], d.get("special_tokens"))


@functools.lru_cache(maxsize=16)
def _compiled(source: str):
    import jinja2
    import jinja2.ext
    import jinja2.nodes
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Generation(jinja2.ext.Extension):
        """``{% generation %} … {% endgeneration %}``: marks the assistant's text (what a template
        declares for training masks); rendered as its body."""

        tags = {"generation"}

        def parse(self, parser):
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

        def _body(self, caller):
            return caller()

    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        # (jinja's own tojson escapes HTML characters, which would change the prompt)
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[Generation, jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise ChatTemplateError(f"the chat template is not valid Jinja (line {e.lineno}: {e.message})") from None
