"""`attnlab serve`: the explorer page served locally, with an input box that recomputes it, and,
for a GPT run, text generation: ``POST /generate``, OpenAI's ``POST /v1/completions`` (with
``"stream": true``: server-sent events; ``echo``, ``logprobs``, ``n``, prompts as token ids,
``max_tokens: 0``: what lm-evaluation-harness scores with) and, for a checkpoint with a chat
template, ``POST /v1/chat/completions``; ``POST /tokenize`` and ``/detokenize``, so that existing
clients work. Generation ends at the checkpoint's end-of-sequence token (``finish_reason: "stop"``)
unless a request says ``"ignore_eos": true``. Requests that arrive
together are decoded in one batch (continuous batching), each leaving as soon as it is done; a
request whose settings cannot run is refused alone, the others go on.

An ASGI application (Starlette, request bodies validated by pydantic) served by uvicorn: one
loaded model shared by every endpoint (``POST /reload`` reads the checkpoint again), bodies
bounded in size and in time (a client that stalls mid-head or mid-body gets 408; a body cut short,
400 saying how short; a Content-Length that is not a byte count, 400 naming it), JSON nesting
bounded, open connections bounded (beyond: 503). ``pip install 'attnlab[serve]'``.

Bound to 127.0.0.1 by default. Requests must name this machine as their Host (against DNS
rebinding) and, when they carry an Origin, come from this server's own pages; others get 403.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

from .options import Arg, checked, declared, number, positive_int

FORM = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>attnlab serve: {name}</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px}}textarea{{width:40em;height:5em}}</style></head>
<body><h1>attnlab explorer: {name}</h1><p>{what}</p>
<form id="f">{fields}<p><button type="submit">explore</button> <span id="msg"></span></p></form>
{generate}<script>
"use strict";
document.getElementById("f").addEventListener("submit", async (e) => {{
  e.preventDefault();
  const body = {{}};
  for (const el of document.querySelectorAll("[data-field]")) {{
    if (el.type === "file") {{
      if (!el.files.length) continue;
      const buf = new Uint8Array(await el.files[0].arrayBuffer());
      let s = ""; for (let i = 0; i < buf.length; i++) s += String.fromCharCode(buf[i]);
      body[el.dataset.field] = btoa(s);
    }} else if (el.value) body[el.dataset.field] = el.value;
  }}
  document.getElementById("msg").textContent = "computing…";
  const r = await fetch("/explore", {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: JSON.stringify(body)}});
  const html = await r.text();
  if (!r.ok) {{ document.getElementById("msg").textContent = html; return; }}
  document.open(); document.write(html); document.close();
}});
</script></body></html>"""

GENERATE_FORM = """<h2>generate</h2><p>Continue a text ({slots} requests at a time; also
<code>POST /generate</code> with JSON <code>{{"prompt": ..., "max_new_tokens": ..., "temperature": ...}}</code>).</p>
<form id="g"><textarea id="gp" placeholder="a prompt"></textarea><p>new tokens <input id="gn" type="number"
value="100" min="1"> temperature <input id="gt" value="0.8" size="4"> <button type="submit">generate</button>
<span id="gm"></span></p></form><pre id="go"></pre>
<script>
"use strict";
document.getElementById("g").addEventListener("submit", async (e) => {{
  e.preventDefault();
  const prompt = document.getElementById("gp").value;
  const body = {{prompt, max_new_tokens: Number(document.getElementById("gn").value),
                temperature: Number(document.getElementById("gt").value)}};
  document.getElementById("gm").textContent = "generating…";
  const r = await fetch("/generate", {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: JSON.stringify(body)}});
  if (!r.ok) {{ document.getElementById("gm").textContent = await r.text(); return; }}
  const out = await r.json();
  document.getElementById("gm").textContent = out.tokens + " tokens (" + out.finish_reason + ")";
  document.getElementById("go").textContent = prompt + out.text;
}});
</script>"""

MAX_BODY = 20_000_000  # bytes: an uploaded image, base64-encoded, with room to spare
BODY_TIMEOUT_S = 15.0  # a client has this long to send its whole body (slow clients get 408)
MISSING_EXTRA = "attnlab serve runs on Starlette, uvicorn and pydantic: pip install 'attnlab[serve]'"
HEAD_TIMEOUT_S = 15.0  # and this long to send a request's head once it began (or, connected, to begin one)
GENERATE_TIMEOUT_S = 600  # a request waits this long for its text, then gets 503
MAX_CONNECTIONS = 512  # open connections beyond this are answered 503 at once (uvicorn's limit_concurrency)
MAX_LOGPROBS = 20  # the most likely tokens a completion may ask for at each position (vLLM's limit)
MAX_N = 16  # completions per prompt
MAX_CHOICES = 64  # completions one request may queue (prompts x n): more waits on a busy server for minutes


class RequestError(Exception):
    """A request to refuse: its HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


@dataclass
class GenerationJob:
    request: object  # attnlab.generate.batching.Request
    stop: list
    finished: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class GenerationWorker:
    """One thread decodes every generation request through a :class:`~attnlab.generate.batching.ContinuousBatcher`;
    the requests hand it their prompts and wait. Each step holds ``lock`` (the explorer's: its
    hook points are the model's state), so explorations run between steps."""

    def __init__(self, model, lock: threading.Lock, slots: int = 8):
        from .generate.batching import ContinuousBatcher

        self.model, self.lock, self.slots = model, lock, slots
        self.batcher = ContinuousBatcher(model, slots)
        self.inbox: queue.Queue[GenerationJob | None] = queue.Queue()  # None: stop
        threading.Thread(target=self._loop, daemon=True, name="attnlab-generate").start()

    def job(
        self,
        prompt: str | list[int] | None,
        max_new_tokens: int | None,
        *,
        stop=(),
        seed=None,
        on_token=None,
        ignore_eos: bool = False,
        field: str = "max_new_tokens",
        **sampling,
    ):
        """A checked :class:`GenerationJob` (RequestError 400 for one that cannot run, naming the
        request's own ``field`` for the token count), queued. ``prompt``: text (empty: a new line) or
        token ids. ``max_new_tokens`` None: ``generate()``'s default, or what the context leaves after
        the prompt. It ends at the model's end-of-sequence ids unless ``ignore_eos``."""
        from .generate.batching import text_request
        from .errors import one_line
        from .generate import default_prompt

        stop = [stop] if isinstance(stop, str) else list(stop or ())
        if not all(isinstance(x, str) and x for x in stop):
            raise RequestError(400, "field 'stop' must be a non-empty string or a list of them")
        tok = self.model.tokenizer
        eos = None if ignore_eos else (getattr(self.model, "eos_ids", ()) or None)
        try:
            text = self.prompt_ids(prompt) if isinstance(prompt, list) else prompt or default_prompt(tok)
            if max_new_tokens is None:
                most, used = default_new_tokens(), len(text) if isinstance(text, list) else len(tok.encode(text))
                max_new_tokens = max(1, min(most, self.model.config.context - used))
            request = text_request(tok, text, max_new_tokens, stop=stop, seed=seed, eos_id=eos,
                                   device=next(self.model.parameters()).device, **sampling)  # fmt: skip
        except Exception as e:  # noqa: BLE001 - characters the tokenizer does not know: the user's to fix
            raise RequestError(400, one_line(e)) from None
        try:
            self.batcher.check(request)  # (the counts and sampling settings too)
        except ValueError as e:
            raise RequestError(400, str(e).replace("max_new_tokens", field)) from None
        request.on_token = on_token
        job = GenerationJob(request, stop)
        self.inbox.put(job)
        return job

    def prompt_ids(self, ids: list[int]) -> list[int]:
        """A prompt given as token ids, refused (400) when empty or outside the vocabulary."""
        from .errors import UnknownTokenError
        from .tokens.ids import checked_token_ids

        if not ids:
            raise RequestError(400, "a prompt of token ids needs at least one id")
        try:
            return checked_token_ids(ids, self.model.config.vocab_size)
        except UnknownTokenError as e:
            raise RequestError(400, f"prompt {e}") from None

    def encoded(self, prompt: str | list[int]) -> list[int]:
        """A prompt's token ids (text encoded; an empty text: a new line), refused in one line (400)."""
        from .errors import one_line
        from .generate import default_prompt

        if isinstance(prompt, list):
            return self.prompt_ids(prompt)
        try:
            return self.model.tokenizer.encode(prompt or default_prompt(self.model.tokenizer))
        except Exception as e:  # noqa: BLE001 - characters the tokenizer does not know: the user's to fix
            raise RequestError(400, one_line(e)) from None

    def logprobs(self, ids: list[int], top: int):
        """:func:`attnlab.generate.token_logprobs` of ``ids`` (in a worker thread, between decoding steps)."""
        from .generate import token_logprobs

        if len(ids) > self.model.config.context:
            raise RequestError(
                400, f"the prompt and completion are {len(ids)} tokens, more than the model's context of "
                f"{self.model.config.context}; shorten the prompt or ask for fewer tokens"
            )  # fmt: skip
        with self.lock:
            return token_logprobs(self.model, ids, top)

    def answer(self, job: GenerationJob) -> dict:
        """Wait for ``job`` (in a worker thread) -> its ``text``, ``tokens``, ``finish_reason``
        (and the ids of its prompt and of what it generated, the end token left out)."""
        from .generate.batching import request_text

        if not job.finished.wait(GENERATE_TIMEOUT_S):
            raise RequestError(503, f"no answer within {GENERATE_TIMEOUT_S} s; the server is busy, try again later")
        if job.error is not None:
            raise RequestError(500, job.error)
        r = job.request
        text = request_text(self.model.tokenizer, r, job.stop)
        new = r.new_tokens
        if r.finish_reason == "stop" and job.stop:  # (the tokens that make up the text kept, the stop string's cut)
            while new and len(self.model.tokenizer.decode(new)) > len(text):
                new = new[:-1]
        return {"text": text, "tokens": len(r.tokens), "finish_reason": r.finish_reason,
                "prompt_ids": list(r.prompt), "ids": list(new)}  # fmt: skip

    def replace_model(self, model) -> None:
        """Serve ``model`` from the next step on (``POST /reload``); requests in flight finish on the old one."""
        from .generate.batching import ContinuousBatcher

        with self.lock:
            self.model, self.batcher = model, ContinuousBatcher(model, self.slots)

    def close(self) -> None:
        """Stop the thread after the step it is in; requests still waiting are answered with an error."""
        self.inbox.put(None)

    def _loop(self) -> None:
        from .generate.batching import ContinuousBatcher
        from .errors import one_line

        running: list[GenerationJob] = []
        while True:
            arrived = [] if self.batcher.busy else [self.inbox.get()]  # idle: sleep until a request comes
            while True:
                try:
                    arrived.append(self.inbox.get_nowait())
                except queue.Empty:
                    break
            if None in arrived:  # close(): answer whoever still waits
                for job in running + [j for j in arrived if j is not None]:
                    job.error = "the server is stopping; send the request again once it runs"
                    job.finished.set()
                return
            for job in arrived:
                try:
                    self.batcher.submit(job.request)  # (checked already)
                except ValueError as e:
                    job.error = one_line(e)
                    job.finished.set()
                    continue
                running.append(job)
            try:
                with self.lock:
                    finished = self.batcher.step()
            except Exception as e:  # noqa: BLE001 - a failure inside the model: answer everyone, start afresh
                for job in running:
                    job.error = f"generation failed: {type(e).__name__}: {one_line(e)}"
                    job.finished.set()
                running = []
                self.batcher = ContinuousBatcher(self.model, self.slots)
                continue
            for job in running:
                if job.request in finished:
                    job.finished.set()
            running = [job for job in running if job.request not in finished]


# ---- request bodies, validated (pydantic: strict types, no unknown fields) ---------------------------
def spec_type(spec):
    """The pydantic type of a declared option (:mod:`attnlab.options`): its checker's bounds as
    constraints, its choices as a Literal, so that a server body is checked as the command line
    checks the same option."""
    from typing import Annotated, Literal

    from pydantic import Field

    if spec.choices is not None:
        return Literal[tuple(spec.choices)]
    if spec.kind == "append":
        return str | list[str]
    bounds = getattr(spec.type, "bounds", None)
    if bounds is None:
        return str
    kind, low, low_ok, high, high_ok = bounds
    limits = {"ge" if low_ok else "gt": low} if low is not None else {}
    if high is not None:
        limits["le" if high_ok else "lt"] = high
    return Annotated[kind, Field(**limits, **({"allow_inf_nan": False} if kind is float else {}))]


def explore_model(form):
    """The request model of ``POST /explore``: the inputs ``form`` (the family's
    :class:`~attnlab.recipes.base.ExplorerForm`) declares, each optional (a file as base64)."""
    from pydantic import ConfigDict, create_model

    fields: dict = {i.name: (str | None, None) for i in form.inputs}
    return create_model("Explore", __config__=ConfigDict(extra="forbid", strict=True), **fields)


def default_new_tokens() -> int:
    """``max_new_tokens``'s default in :meth:`attnlab.recipes.gpt.GPTVerbs.generate`'s signature."""
    from .recipes.gpt import GPTVerbs

    return declared(GPTVerbs.generate).specs["max_new_tokens"].default


def generation_models():
    """The request models of ``/generate``, ``/v1/completions``, ``/v1/chat/completions``,
    ``/tokenize`` and ``/detokenize`` (pydantic is imported with the server, not with attnlab),
    their sampling fields typed from the signature of
    :meth:`attnlab.recipes.gpt.GPTVerbs.generate`, and ``/generate``'s defaults its defaults: one
    declaration for the command line, Python and the server. (``/v1/completions`` keeps OpenAI's
    own defaults: 16 tokens at temperature 1, what its clients expect.)"""
    from typing import Literal

    from pydantic import BaseModel, ConfigDict, Field, create_model

    from .options import MAX_NEW_TOKENS
    from .recipes.gpt import GPTVerbs

    sample = declared(GPTVerbs.generate).specs
    strict = ConfigDict(extra="forbid", strict=True)
    Tokens, Temperature = spec_type(sample["max_new_tokens"]), spec_type(sample["temperature"])
    TopP, Seed, Stop = spec_type(sample["top_p"]), spec_type(sample["seed"]), spec_type(sample["stop"])

    # /generate: generate()'s sampling options, each field typed, bounded and defaulted by its declaration;
    # max_new_tokens None: generate()'s default, or what the context leaves
    served = {n: spec_type(sample[n]) for n in ("temperature", "top_k", "top_p", "stop", "seed")}
    Generate = create_model(
        "Generate",
        __config__=strict,
        prompt=(str | None, None),
        max_new_tokens=(Tokens | None, None),
        **{n: (t | None if sample[n].default is None else t, sample[n].default) for n, t in served.items()},
    )

    Count = Annotated[int, Field(ge=0, le=MAX_NEW_TOKENS)]
    Choices = Annotated[int, Field(ge=1, le=MAX_N)]
    TopLogprobs = Annotated[int, Field(ge=0, le=MAX_LOGPROBS)]
    Id = Annotated[int, Field(ge=0)]

    class Completion(BaseModel):  # OpenAI's /v1/completions (the fields attnlab can honour)
        model_config = ConfigDict(extra="forbid", strict=True)
        prompt: str | list[str] | list[Id] | list[list[Id]] = ""
        model: str | None = None
        max_tokens: Count = 16  # 0: no new token (with echo and logprobs: the prompt's log-probabilities)
        temperature: Temperature = 1.0
        top_p: TopP = 1.0
        n: Choices = 1
        stream: bool = False
        stop: Stop | None = None
        seed: Seed | None = None
        user: str | None = None
        echo: bool = False
        logprobs: TopLogprobs | None = None
        ignore_eos: bool = False  # (vLLM's: go on past the end-of-sequence token)

    class Message(BaseModel):
        model_config = ConfigDict(extra="forbid", strict=True)
        role: str
        content: str | list[dict] | None = None
        name: str | None = None

    class ChatCompletion(BaseModel):  # OpenAI's /v1/chat/completions (the fields attnlab can honour)
        model_config = ConfigDict(extra="forbid", strict=True)
        messages: list[Message]
        model: str | None = None
        max_tokens: Tokens | None = None
        max_completion_tokens: Tokens | None = None
        temperature: Temperature | None = None  # None: the checkpoint's generation_config.json, else 1
        top_p: TopP | None = None
        n: Literal[1] = 1
        stream: bool = False
        stream_options: dict | None = None
        stop: Stop | None = None
        seed: Seed | None = None
        user: str | None = None
        logprobs: Literal[False] = False
        ignore_eos: bool = False

    class Tokenize(BaseModel):  # vLLM's /tokenize
        model_config = ConfigDict(extra="forbid", strict=True)
        prompt: str | None = None
        messages: list[Message] | None = None
        add_generation_prompt: bool = True
        add_special_tokens: bool = False  # (the template writes them; a text is encoded as attnlab encodes it)
        model: str | None = None

    class Detokenize(BaseModel):  # vLLM's /detokenize
        model_config = ConfigDict(extra="forbid", strict=True)
        tokens: list[Id]
        model: str | None = None

    return Generate, Completion, ChatCompletion, Tokenize, Detokenize


def message_text(content, i: int) -> str:
    """A chat message's content as text: a string, or OpenAI's list of ``{"type": "text", "text": ...}``
    parts (joined); other parts (images, audio) are refused in one line."""
    if isinstance(content, str):
        return content
    parts = []
    for part in content or []:
        if part.get("type") != "text" or not isinstance(part.get("text"), str):
            raise RequestError(400, f"message {i}: attnlab's models read text parts only, got {part.get('type')!r}")
        parts.append(part["text"])
    return "".join(parts)


def parse_body(raw: bytes, model_cls):
    """``raw`` JSON as a validated ``model_cls``, or RequestError 400 in one line."""
    from pydantic import ValidationError

    try:
        data = json.loads(raw or b"{}")
    except RecursionError:
        raise RequestError(400, "the body is JSON nested too deeply") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise RequestError(400, f"the body is not JSON ({getattr(e, 'msg', e)})") from None
    except ValueError as e:  # (an integer of thousands of digits)
        raise RequestError(400, f"the body holds a value Python refuses ({str(e).splitlines()[0][:80]})") from None
    if not isinstance(data, dict):
        fields = ", ".join(model_cls.model_fields)
        raise RequestError(400, f"the body must be a JSON object with {fields}, not a {type(data).__name__}")
    try:
        return model_cls.model_validate(data)
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"]) or "body"
        if first["type"] == "extra_forbidden":
            raise RequestError(
                400, f"unknown field {where!r}; this request reads {', '.join(model_cls.model_fields)}"
            ) from None
        got = json.dumps(first.get("input"))[:40] if first.get("input") is not None else "null"
        raise RequestError(400, f"field {where!r} {_says(first)}, not {got}") from None


def _says(error: dict) -> str:
    """A pydantic error as the rest of attnlab words it ("must be a string")."""
    ctx = error.get("ctx") or {}
    kind = error["type"]
    words = {
        "string_type": "must be a string",
        "int_type": "must be an integer",
        "int_from_float": "must be an integer",
        "float_type": "must be a number",
        "finite_number": "must be a finite number",
        "bool_type": "must be true or false",
        "list_type": "must be a list",
        "none_required": "must be null (attnlab does not return it)",
    }
    if kind in words:
        return words[kind]
    if kind in ("greater_than_equal", "greater_than", "less_than_equal", "less_than"):
        bound = {
            "greater_than_equal": "at least",
            "greater_than": "more than",
            "less_than_equal": "at most",
            "less_than": "less than",
        }[kind]
        return f"must be {bound} {next(iter(ctx.values()))}"
    if kind == "literal_error":
        return f"must be {ctx.get('expected')} (the only value attnlab serves)"
    return error["msg"].lower()


# ---- the application ------------------------------------------------------------------------------------
class Guard:
    """ASGI middleware in front of every request: the Host / Origin check, and the body read
    here, whole, within ``BODY_TIMEOUT_S`` and ``MAX_BODY`` (a declared or a streamed length
    beyond it: 413; a client that stalls: 408), before any handler runs."""

    def __init__(self, app, port_ref: list):
        self.app, self.port_ref = app, port_ref

    async def __call__(self, scope, receive, send):
        import asyncio

        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        port = self.port_ref[0]
        hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
        origin = headers.get("origin")
        if headers.get("host") not in hosts or (origin is not None and origin not in {f"http://{h}" for h in hosts}):
            return await _plain(send, 403, "forbidden: requests must come from this machine's own pages")
        if scope["method"] != "POST":
            return await self.app(scope, receive, send)
        length = headers.get("content-length")
        chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        if length is None and not chunked:
            return await _plain(send, 411, "the request has no Content-Length; send the JSON body with its length")
        if length is not None and not length.isdigit():
            return await _plain(send, 400, f"Content-Length {length!r} is not a byte count")
        if length is not None and int(length) > MAX_BODY:
            return await _plain(send, 413, f"the request is {int(length):,} bytes; the limit is {MAX_BODY:,}")
        body, deadline = b"", time.monotonic() + BODY_TIMEOUT_S
        while True:
            try:
                message = await asyncio.wait_for(receive(), max(0.0, deadline - time.monotonic()))
            except asyncio.TimeoutError:
                return await _plain(send, 408, f"the body did not arrive within {BODY_TIMEOUT_S:.0f} s")
            if message["type"] == "http.disconnect":
                return
            body += message.get("body", b"")
            if len(body) > MAX_BODY:
                return await _plain(send, 413, f"the request is over {MAX_BODY:,} bytes, the limit")
            if not message.get("more_body", False):
                break
        delivered = False

        async def replay():
            nonlocal delivered
            if not delivered:
                delivered = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        return await self.app(scope, replay, send)


async def _plain(send, status: int, text: str) -> None:
    data = f"error: {text}".encode()
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"text/plain; charset=utf-8"),
                (b"content-length", str(len(data)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": data})


def _box(i) -> str:
    """The page's box for one of the family's explorer inputs (:class:`attnlab.recipes.base.ExploreInput`)."""
    from html import escape

    hint = escape(i.placeholder, quote=True)
    if i.box == "image":
        return f'<p><input type="file" accept="image/*" data-field="{i.name}"></p>'
    if i.box == "line":
        return f'<p><input size="60" data-field="{i.name}" placeholder="{hint}"></p>'
    return f'<textarea data-field="{i.name}" placeholder="{hint}"></textarea>'


class _Routes:
    """The handlers of ``attnlab serve`` for one served model: the page, the explorer's views,
    generation (ours and OpenAI's completions) and reloading the checkpoint."""

    def __init__(self, model, form, slots: int) -> None:
        from starlette import concurrency, responses

        self.http, self.in_thread = responses, concurrency.run_in_threadpool
        self.model, self.form, self.checkpoint = model, form, model.checkpoint
        self.name = Path(model.checkpoint).name
        self.lock = threading.Lock()  # one computation on the model at a time: its hook points are its state
        generates = callable(getattr(model, "generate", None)) and getattr(model, "tokenizer", None) is not None
        self.worker = GenerationWorker(model, self.lock, slots) if generates else None
        self.Explore = explore_model(form)
        self.Generate, self.Completion, self.ChatCompletion, self.Tokenize, self.Detokenize = generation_models()

    def html(self, text: str):
        return self.http.HTMLResponse(
            text, headers={"Content-Security-Policy": "default-src 'self' 'unsafe-inline' data: blob:"}
        )

    async def refused(self, request, e: RequestError):
        if request.url.path.startswith("/v1/"):  # OpenAI's error object
            kind = "invalid_request_error" if e.status < 500 else "server_error"
            body = {"error": {"message": str(e), "type": kind, "code": e.status}}
            return self.http.JSONResponse(body, status_code=e.status)
        return self.http.PlainTextResponse(f"error: {e}", status_code=e.status)

    async def page(self, request):
        generate_form = "" if self.worker is None else GENERATE_FORM.format(slots=self.worker.slots)
        from html import escape

        fields = "".join(_box(i) for i in self.form.inputs)
        what, name = escape(self.form.hint), escape(self.name)
        return self.html(FORM.format(name=name, what=what, fields=fields, generate=generate_form))

    async def explore(self, request):
        import base64
        import binascii
        import tempfile

        from .errors import one_line

        body = parse_body(await request.body(), self.Explore)

        def compute() -> str:
            inputs = body.model_dump()
            with tempfile.TemporaryDirectory() as tmp:
                for i in self.form.inputs:
                    if i.box == "image" and inputs[i.name]:  # an upload: the family reads a file
                        path = inputs[i.name] = Path(tmp) / i.name
                        try:
                            path.write_bytes(base64.b64decode(getattr(body, i.name), validate=True))
                        except (ValueError, binascii.Error):
                            raise RequestError(400, f"field {i.name!r} is not base64") from None
                with self.lock:
                    return self.model.explore(**inputs).html()

        try:
            return self.html(await self.in_thread(compute))
        except RequestError:
            raise
        except Exception as e:  # noqa: BLE001 - a bad input is the user's to fix: say what, keep serving
            raise RequestError(400, one_line(e)) from None

    def generator(self) -> GenerationWorker:
        if self.worker is None:
            raise RequestError(404, f"not found: generation needs a GPT run, and {self.name} is not one")
        return self.worker

    async def generate(self, request):
        w = self.generator()
        b = parse_body(await request.body(), self.Generate)
        sampling = dict(seed=b.seed, temperature=b.temperature, top_k=b.top_k or None, top_p=b.top_p)
        job = w.job(b.prompt, b.max_new_tokens, stop=b.stop, **sampling)
        answer = await self.in_thread(w.answer, job)
        return self.http.JSONResponse({k: answer[k] for k in ("text", "tokens", "finish_reason")})

    async def models(self, request):
        return self.http.JSONResponse(
            {"object": "list", "data": [{"id": self.name, "object": "model", "owned_by": "attnlab"}]}
        )

    async def completions(self, request):
        import uuid

        w = self.generator()
        b = parse_body(await request.body(), self.Completion)
        prompt = b.prompt
        one = isinstance(prompt, str) or (bool(prompt) and isinstance(prompt[0], int))
        prompts = [prompt] if one else list(prompt)
        if not prompts:
            raise RequestError(400, "field 'prompt': give a string, token ids, or a non-empty list of either")
        if len(prompts) * b.n > MAX_CHOICES:
            raise RequestError(
                400, f"{len(prompts)} prompts x n {b.n} = {len(prompts) * b.n} completions; one request may ask for "
                f"{MAX_CHOICES}: send the rest in another"
            )  # fmt: skip
        if b.stream and (len(prompts) != 1 or b.n != 1 or b.echo or b.logprobs is not None or b.max_tokens == 0):
            raise RequestError(400, "stream: one prompt, n 1, without echo or logprobs, at least one token")
        sampling = dict(temperature=b.temperature, top_p=None if b.top_p >= 1 else b.top_p, top_k=None)
        ident, created = f"cmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if b.stream:
            job = w.job(prompts[0], b.max_tokens, stop=b.stop, seed=b.seed, ignore_eos=b.ignore_eos, **sampling,
                        field="max_tokens")  # fmt: skip
            events = _stream_events(w, job, _text_chunk(ident, created, self.name))
            return self.http.StreamingResponse(events, media_type="text/event-stream")
        answers = []
        if b.max_tokens == 0:  # the prompts alone: what scoring with echo and logprobs reads
            for p in prompts:
                answers += [{"text": "", "tokens": 0, "finish_reason": "length", "prompt_ids": w.encoded(p), "ids": []}]
        else:
            seeds = [None if b.seed is None else (b.seed + j) % 2**63 for j in range(b.n)]  # (n different draws)
            jobs = [
                w.job(p, b.max_tokens, stop=b.stop, seed=s, ignore_eos=b.ignore_eos, field="max_tokens", **sampling)
                for p in prompts
                for s in seeds
            ]  # fmt: skip  (all checked before any waits)
            answers = [await self.in_thread(w.answer, j) for j in jobs]
        choices = []
        for i, a in enumerate(answers):
            given = prompts[i // (1 if b.max_tokens == 0 else b.n)]
            prompt_text = given if isinstance(given, str) else w.model.tokenizer.decode(a["prompt_ids"])
            choice = {"text": (prompt_text if b.echo else "") + a["text"], "index": i, "logprobs": None,
                      "finish_reason": _openai_reason(a["finish_reason"])}  # fmt: skip
            if b.logprobs is not None:
                choice["logprobs"] = await self.in_thread(_logprobs, w, a, b.logprobs, b.echo)
            choices.append(choice)
        return self.http.JSONResponse(_completion(self.name, ident, created, answers, choices))

    async def chat_completions(self, request):
        import uuid

        w = self.generator()
        b = parse_body(await request.body(), self.ChatCompletion)
        messages = [{"role": m.role, "content": message_text(m.content, i), **({"name": m.name} if m.name else {})}
                    for i, m in enumerate(b.messages)]  # fmt: skip
        if w.model.chat_template is None:  # (it continues text: the other endpoint serves it)
            raise RequestError(
                400, f"{self.name} has no chat template: it continues text; POST the text to /v1/completions"
            )
        try:
            ids = w.model.chat_ids(messages)
        except ValueError as e:  # (a message the template refuses, too long)
            raise RequestError(400, str(e)) from None
        sampling = w.model.chat_sampling(b.temperature, None, b.top_p, otherwise=1.0)  # (OpenAI has no top_k)
        if sampling["top_p"] is not None and sampling["top_p"] >= 1:
            sampling["top_p"] = None
        most = b.max_completion_tokens or b.max_tokens
        field = "max_completion_tokens" if b.max_completion_tokens else "max_tokens"
        job = w.job(ids, most, stop=b.stop, seed=b.seed, ignore_eos=b.ignore_eos, field=field, **sampling)
        ident, created = f"chatcmpl-{uuid.uuid4().hex[:24]}", int(time.time())
        if b.stream:
            events = _stream_events(w, job, _chat_chunk(ident, created, self.name), first=_chat_chunk(
                ident, created, self.name)(None, None, {"role": "assistant", "content": ""}))  # fmt: skip
            return self.http.StreamingResponse(events, media_type="text/event-stream")
        a = await self.in_thread(w.answer, job)
        choice = {"index": 0, "message": {"role": "assistant", "content": a["text"]}, "logprobs": None,
                  "finish_reason": _openai_reason(a["finish_reason"])}  # fmt: skip
        body = _completion(self.name, ident, created, [a], [choice])
        body["object"] = "chat.completion"
        return self.http.JSONResponse(body)

    async def tokenize(self, request):
        """vLLM's ``/tokenize``: {"prompt": text} or {"messages": [...]} (rendered with the chat
        template) -> {"tokens", "count", "max_model_len"}."""
        w = self.generator()
        b = parse_body(await request.body(), self.Tokenize)
        if (b.prompt is None) == (b.messages is None):
            raise RequestError(400, "give 'prompt' (text) or 'messages' (a chat), one of them")
        if b.prompt is not None:
            ids = w.encoded(b.prompt) if b.prompt else []
        else:
            messages = [{"role": m.role, "content": message_text(m.content, i)} for i, m in enumerate(b.messages)]
            try:
                ids = w.model.chat_ids(messages, add_generation_prompt=b.add_generation_prompt)
            except ValueError as e:
                raise RequestError(400, str(e)) from None
        return self.http.JSONResponse({"tokens": ids, "count": len(ids), "max_model_len": w.model.config.context})

    async def tokenizer_info(self, request):
        """vLLM's ``/tokenizer_info``: the special tokens, the chat template and the context, what a
        client that tokenizes through the server (lm-evaluation-harness's remote tokenizer) reads."""
        w = self.generator()
        model, tok = w.model, w.model.tokenizer
        template = model.chat_template
        special = dict(template.special_tokens) if template else {}
        ends = model.eos_ids
        if ends and "eos_token" not in special:
            special["eos_token"] = tok.decode([ends[0]])
        return self.http.JSONResponse({
            "eos_token": special.get("eos_token"), "bos_token": special.get("bos_token"),
            "pad_token": special.get("pad_token"), "chat_template": template.source if template else None,
            "model_max_length": model.config.context, "vocab_size": model.config.vocab_size,
            "tokenizer_class": type(tok).__name__,
        })  # fmt: skip

    async def detokenize(self, request):
        """vLLM's ``/detokenize``: {"tokens": [ids]} -> {"prompt": text}."""
        w = self.generator()
        b = parse_body(await request.body(), self.Detokenize)
        ids = w.prompt_ids(list(b.tokens)) if b.tokens else []
        return self.http.JSONResponse({"prompt": w.model.tokenizer.decode(ids)})

    async def reload(self, request):
        """Read the checkpoint again (after training went on) and serve it from now on."""
        from .api import load

        def read():
            fresh = load(self.checkpoint, device=str(self.model.device))
            with self.lock:
                self.model = fresh
            if self.worker is not None:
                self.worker.replace_model(fresh)
            return {"reloaded": str(self.checkpoint)}

        return self.http.JSONResponse(await self.in_thread(read))


def served_family(model):
    """The family (:class:`~attnlab.recipes.base.Recipe`) of a model from :func:`attnlab.load`: what
    the server asks for its explorer's inputs; any other model is refused in one line."""
    from .errors import OptionError

    if not callable(getattr(model, "family_recipe", None)):
        raise OptionError(
            f"serve takes a model loaded from its run (attnlab.load(run)), not {type(model).__name__!r}: "
            "the server reads the run's family, tokenizer and folder"
        )
    return model.family_recipe()


def create_app(model, *, slots: int = 8, port_ref: list | None = None):
    """The ASGI application of ``attnlab serve`` for ``model`` (loaded by :func:`attnlab.load`): its
    explorer, asking for the inputs its family declares (``explorer_form()``); a GPT also generates,
    ``slots`` requests at a time. ``port_ref``: [the port], for the Host check (filled in once listening)."""
    from .errors import OptionError

    try:
        from starlette.applications import Starlette
        from starlette.routing import Route
    except ImportError:
        raise OptionError(MISSING_EXTRA) from None
    r = _Routes(model, served_family(model).required_explorer_form(model.checkpoint), slots)
    routes = [
        Route("/", r.page, methods=["GET"]),
        Route("/index.html", r.page, methods=["GET"]),
        Route("/explore", r.explore, methods=["POST"]),
        Route("/generate", r.generate, methods=["POST"]),
        Route("/v1/models", r.models, methods=["GET"]),
        Route("/v1/completions", r.completions, methods=["POST"]),
        Route("/v1/chat/completions", r.chat_completions, methods=["POST"]),
        Route("/tokenize", r.tokenize, methods=["POST"]),
        Route("/detokenize", r.detokenize, methods=["POST"]),
        Route("/tokenizer_info", r.tokenizer_info, methods=["GET"]),
        Route("/reload", r.reload, methods=["POST"]),
    ]
    app = Starlette(routes=routes, exception_handlers={RequestError: r.refused})
    app.state.worker = r.worker
    return Guard(app, port_ref if port_ref is not None else [8000])


def _openai_reason(reason: str | None) -> str:
    return {"length": "length", "eos": "stop", "stop": "stop"}.get(reason or "", "stop")


def _completion(name: str, ident: str, created: int, answers: list[dict], choices: list[dict]) -> dict:
    """The body of an OpenAI ``text_completion`` with ``choices``, for ``answers`` (their token counts)."""
    prompt_tokens = sum(len(a["prompt_ids"]) for a in answers)
    completion_tokens = sum(a["tokens"] for a in answers)
    return {
        "id": ident,
        "object": "text_completion",
        "created": created,
        "model": name,
        "choices": choices,
        "usage": {
            "prompt_tokens": prompt_tokens,
            "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
        },
    }


def _logprobs(worker, answer: dict, top: int, echo: bool) -> dict:
    """OpenAI's ``logprobs`` of a completion: each token's text, its log-probability (the model's
    own: log-softmax of its float32 logits), the ``top`` most likely tokens at its place and its
    character offset in the choice's text; the prompt's tokens too with ``echo`` (the first one has
    no log-probability: nothing comes before it)."""
    tok = worker.model.tokenizer

    def text_of(i: int) -> str:
        # a token's text; a piece of a character's bytes (no text alone) as its vocabulary string
        text = tok.decode([i])
        return tok.id_to_token(i) if "\ufffd" in text and hasattr(tok, "id_to_token") else text

    def ranked(ids: list[int], values: list[float]) -> dict:
        out: dict = {}
        for i, v in zip(ids, values):  # (most likely first: two tokens of the same text keep the likelier)
            out.setdefault(text_of(i), v)
        return out

    prompt, new = answer["prompt_ids"], answer["ids"]
    ids = prompt + new
    lp, top_ids, top_lp = worker.logprobs(ids, top)
    lp, top_ids, top_lp = lp.tolist(), top_ids.tolist(), top_lp.tolist()
    start = 0 if echo else len(prompt)
    shown = ids[start:]
    tokens = [text_of(i) for i in shown]
    token_logprobs: list = [None if j == 0 else lp[j - 1] for j in range(start, len(ids))]
    top_logprobs: list = [None if j == 0 else ranked(top_ids[j - 1], top_lp[j - 1]) for j in range(start, len(ids))]
    offsets = [len(tok.decode(shown[:k])) for k in range(len(shown))]
    return {"tokens": tokens, "token_logprobs": token_logprobs, "top_logprobs": top_logprobs, "text_offset": offsets}


def _text_chunk(ident: str, created: int, name: str):
    def chunk(text: str | None, reason: str | None, delta: dict | None = None) -> str:
        choice = {"text": text or "", "index": 0, "logprobs": None, "finish_reason": reason}
        event = {"id": ident, "object": "text_completion", "created": created, "model": name, "choices": [choice]}
        return "data: " + json.dumps(event) + "\n\n"

    return chunk


def _chat_chunk(ident: str, created: int, name: str):
    def chunk(text: str | None, reason: str | None, delta: dict | None = None) -> str:
        delta = delta if delta is not None else ({} if text is None else {"content": text})
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": reason}
        event = {"id": ident, "object": "chat.completion.chunk", "created": created, "model": name, "choices": [choice]}
        return "data: " + json.dumps(event) + "\n\n"

    return chunk


async def _stream_events(w, job, chunk, first: str | None = None):
    """Server-sent events for ``job`` (queued with no ``on_token``; set here): ``first`` if given,
    a ``chunk(text, None)`` per piece of text as the tokens come, then ``chunk(None, finish reason)``,
    then ``data: [DONE]`` (OpenAI's streaming format, completions and chat alike)."""
    import asyncio

    from .generate import cut_at_stop, end_ids

    loop = asyncio.get_running_loop()
    tokens: asyncio.Queue = asyncio.Queue()
    job.request.on_token = lambda t: loop.call_soon_threadsafe(tokens.put_nowait, t)
    done = loop.run_in_executor(None, job.finished.wait, GENERATE_TIMEOUT_S)
    tok, sent = w.model.tokenizer, ""
    if first is not None:
        yield first
    while True:
        getter = asyncio.ensure_future(tokens.get())
        finished, _ = await asyncio.wait({getter, done}, return_when=asyncio.FIRST_COMPLETED)
        if getter not in finished:
            getter.cancel()
        if job.error is not None:
            yield "data: " + json.dumps({"error": {"message": job.error, "type": "server_error"}}) + "\n\n"
            break
        ends = getattr(job.request, "eos_id", None)
        shown = [t for t in job.request.tokens if t not in end_ids(ends)]  # (the end token is never text)
        text = cut_at_stop(tok.decode(shown), job.stop)
        last = done in finished and tokens.empty()
        # (a character still being spelled by its bytes waits for them, unless nothing more comes)
        if text.startswith(sent) and len(text) > len(sent) and (last or not text.endswith("\ufffd")):
            yield chunk(text[len(sent) :], None)
            sent = text
        if last:
            yield chunk(None, _openai_reason(job.request.finish_reason))
            break
    yield "data: [DONE]\n\n"


def http_protocol():
    """uvicorn's HTTP/1.1 protocol (h11) with the refusals in attnlab's words: a Content-Length that
    is not a byte count is named (uvicorn says "Invalid HTTP request received."); a body cut short
    by the client's end of sending is answered 400 with how much came (uvicorn answers nothing);
    and a request head that stops arriving is answered 408 after ``HEAD_TIMEOUT_S`` (uvicorn waits
    for ever). A stalled body is the :class:`Guard`'s: 408 after ``BODY_TIMEOUT_S``."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    class Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            super().connection_made(transport)
            self.refused: str | None = None  # (what h11 found wrong with the request, in its words)
            self.head_timer = None
            parse = self.conn.next_event

            def next_event():
                try:
                    return parse()
                except h11.RemoteProtocolError as e:
                    self.refused = str(e)
                    raise

            self.conn.next_event = next_event
            self.watch_head()

        def data_received(self, data: bytes) -> None:
            super().data_received(data)
            self.watch_head()

        def watch_head(self) -> None:
            """A timer while a request's head is awaited: between requests uvicorn's keep-alive
            timer closes the connection, and a body is the Guard's to time."""
            if self.head_timer is not None:
                self.head_timer.cancel()
                self.head_timer = None
            between = self.cycle is not None and self.conn.their_state is h11.IDLE and not self.conn.trailing_data[0]
            if self.conn.their_state is h11.IDLE and not between and not self.transport.is_closing():
                self.head_timer = self.loop.call_later(HEAD_TIMEOUT_S, self.head_timed_out)

        def head_timed_out(self) -> None:
            self.head_timer = None
            if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
                return
            if self.conn.trailing_data[0]:  # a head begun, never finished
                self.answer(408, f"the request's head did not arrive within {HEAD_TIMEOUT_S:g} s")
            else:  # connected, and nothing sent
                self.transport.close()

        def send_400_response(self, msg: str) -> None:
            why = self.refused or ""
            if "Content-Length" in why:
                text = (
                    f"the request's Content-Length is not a byte count ({why}): send the body's length in bytes, "
                    "a whole number of 0 or more"
                )
            else:
                text = f"not an HTTP/1.1 request attnlab serve can read ({why or msg})"
            self.answer(400, text)

        def eof_received(self) -> None:
            if self.conn.their_state is h11.SEND_BODY and not (self.cycle and self.cycle.response_started):
                self.conn.receive_data(b"")  # (h11 then says how much of the body came)
                try:
                    self.conn.next_event()
                except h11.RemoteProtocolError as e:
                    self.answer(400, f"the request body ended early: {e}; send the whole body")

        def connection_lost(self, exc) -> None:
            if self.head_timer is not None:
                self.head_timer.cancel()
            super().connection_lost(exc)

        def answer(self, status: int, text: str) -> None:
            """``error: text`` with ``status``, then the connection closed."""
            from http import HTTPStatus

            data = f"error: {text}".encode()
            headers = [(b"content-type", b"text/plain; charset=utf-8"), (b"content-length", str(len(data)).encode()),
                       (b"connection", b"close")]  # fmt: skip
            head = h11.Response(status_code=status, headers=headers, reason=HTTPStatus(status).phrase.encode())
            try:
                for event in (head, h11.Data(data=data),
                              h11.EndOfMessage()):  # fmt: skip
                    self.transport.write(self.conn.send(event))
            except h11.LocalProtocolError:  # (a response was already under way: nothing more can be said)
                pass
            self.transport.close()

    return Protocol


@dataclass
class RunningServer:
    """What ``serve``'s ``ready`` callback gets: where it listens, and how to stop it."""

    server_address: tuple
    _server: Any

    def shutdown(self) -> None:
        self._server.should_exit = True


@checked
def serve(
    model,
    kind: str | None = None,
    host: Annotated[str, Arg("address to bind (127.0.0.1: this machine only)")] = "127.0.0.1",
    port: Annotated[int, Arg("TCP port", number(int, 0, True, 65535, what="from 0 to 65535"))] = 8000,
    ready=None,
    batch_size: Annotated[
        int, Arg("GPT: /generate requests decoded together; one that finishes gives its row to the next", positive_int)
    ] = 8,
    slots: int | None = None,
) -> None:
    """Serve the explorer of ``model`` (a model from :func:`attnlab.load`) until interrupted
    (uvicorn); its page asks for what the model's family declares. ``ready(server)`` is called once
    listening, with a :class:`RunningServer` (tests use port 0). A GPT also generates,
    ``batch_size`` requests at a time (``slots``: its old name). ``kind``: the family's
    ``explore_kind``, which older calls gave (another is refused)."""
    import socket

    from .errors import OptionError

    try:
        import uvicorn
    except ImportError:
        raise OptionError(MISSING_EXTRA) from None
    family_kind = served_family(model).explore_kind
    if kind is not None and kind != family_kind:
        raise OptionError(f"kind={kind!r}: this model's explorer is {family_kind!r}; leave kind out")
    if slots is not None:
        batch_size = declared(serve).check("batch_size", slots)
    port_ref = [port]
    app = create_app(model, slots=batch_size, port_ref=port_ref)
    try:
        sock = socket.create_server((host, port), backlog=2048, reuse_port=False)
    except OSError as e:
        if e.errno in (98, 48, 10048):  # address in use (Linux, macOS, Windows)
            raise OSError(f"port {port} on {host} is taken; choose another with --port") from None
        if isinstance(e, socket.gaierror) or e.errno in (99, -2, -3, -5, 49, 11001):
            raise OSError(
                f"cannot listen on --host {host} ({e.strerror or e}); give an address of this machine, such as 127.0.0.1"
            ) from None
        raise
    port_ref[0] = sock.getsockname()[1]
    config = uvicorn.Config(
        app,
        log_level="warning",
        access_log=False,
        limit_concurrency=MAX_CONNECTIONS,
        timeout_keep_alive=5,
        lifespan="off",
        http=http_protocol(),
    )
    server = uvicorn.Server(config)
    if ready is not None:
        original = server.startup

        async def startup(sockets=None):
            await original(sockets=sockets)
            ready(RunningServer(sock.getsockname()[:2], server))

        server.startup = startup
    worker = app.app.state.worker
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        if worker is not None:
            worker.close()
