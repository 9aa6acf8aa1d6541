"""`attnlab serve`: the explorer page served locally, with an input box that recomputes it, and,
for a GPT run, text generation at ``POST /generate`` (continuous batching: requests that arrive
together are decoded in one batch, each leaving as soon as it is done).

Bound to 127.0.0.1 by default. Requests must name this machine as their Host (against DNS
rebinding) and, when they carry an Origin, come from this server's own pages; others get 403.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import queue
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FORM = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>attnlab serve: {name}</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px}}textarea{{width:40em;height:5em}}</style></head>
<body><h1>attnlab explorer: {name}</h1><p>{what}</p>
<form id="f">{fields}<p><button type="submit">explore</button> <span id="msg"></span></p></form>
{generate}<script>
"use strict";
const kind = {kind};
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

FIELDS = {
    "text": (
        "Type a text: the page shows its attention.",
        '<textarea data-field="text" placeholder="some text"></textarea>',
    ),
    "image": (
        "Choose an image: the page shows where each patch attends.",
        '<input type="file" accept="image/*" data-field="image">',
    ),
    "cross": (
        "Type a source sentence (and, if you like, its translation).",
        '<p><input size="60" data-field="src" placeholder="source"></p><p><input size="60" data-field="tgt" '
        'placeholder="target (default: the model\'s translation)"></p>',
    ),
}


MAX_BODY = 20_000_000  # bytes: an uploaded image, base64-encoded, with room to spare
INPUTS = {"text": ("text",), "image": ("image",), "cross": ("src", "tgt")}  # the JSON fields each kind reads
# /generate's JSON fields: the types each accepts and its default (None: required or unset)
GENERATE_INPUTS = {
    "prompt": ((str,), None),
    "max_new_tokens": ((int,), 100),
    "temperature": ((int, float), 0.8),
    "top_k": ((int,), 200),
    "top_p": ((int, float), None),
    "stop": ((str, list), ()),
    "seed": ((int,), None),
}
GENERATE_TIMEOUT_S = 600  # a request waits this long for its text, then gets 503


class RequestError(Exception):
    """A request to refuse: its HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


@dataclass
class GenerationJob:
    request: object  # attnlab.batching.Request
    stop: list
    finished: threading.Event = field(default_factory=threading.Event)
    error: str | None = None


class GenerationWorker:
    """One thread decodes every /generate request through a :class:`~attnlab.batching.ContinuousBatcher`;
    the request threads hand it their prompts and wait. Each step holds ``lock`` (the explorer's:
    its hook points are the model's state), so explorations run between steps."""

    def __init__(self, model, lock: threading.Lock, slots: int = 8):
        from ..batching import ContinuousBatcher

        self.model, self.lock, self.slots = model, lock, slots
        self.batcher = ContinuousBatcher(model, slots)
        self.inbox: queue.Queue[GenerationJob | None] = queue.Queue()  # None: stop
        threading.Thread(target=self._loop, daemon=True, name="attnlab-generate").start()

    def generate(self, body: dict) -> dict:
        """The checked JSON ``body`` of a /generate request -> its answer: the continuation's
        ``text``, its ``tokens`` and ``finish_reason`` ("length", "eos" or "stop")."""
        from ..batching import request_text

        job = self._job(body)
        self.inbox.put(job)
        if not job.finished.wait(GENERATE_TIMEOUT_S):
            raise RequestError(503, f"no answer within {GENERATE_TIMEOUT_S} s; the server is busy, try again later")
        if job.error is not None:
            raise RequestError(500, job.error)
        r = job.request
        return {
            "text": request_text(self.model.tokenizer, r, job.stop),
            "tokens": len(r.tokens),
            "finish_reason": r.finish_reason,
        }

    def _job(self, body: dict) -> GenerationJob:
        from ..batching import text_request
        from ..errors import one_line
        from ..recipes.gpt import default_prompt

        values = {}
        for name, (types, default) in GENERATE_INPUTS.items():
            v = body.get(name)
            if v is None:  # (absent, or JSON null)
                v = default
            elif isinstance(v, bool) or not isinstance(v, types) or (isinstance(v, float) and not math.isfinite(v)):
                want = " or ".join(
                    {"str": "a string", "int": "an integer", "float": "a finite number", "list": "a list"}[t.__name__]
                    for t in types
                )
                raise RequestError(400, f"field {name!r} must be {want}, not {json.dumps(v)[:40]}")
            values[name] = v
        stop = [values["stop"]] if isinstance(values["stop"], str) else list(values["stop"])
        if not all(isinstance(x, str) and x for x in stop):
            raise RequestError(400, "field 'stop' must be a non-empty string or a list of them")
        tok = self.model.tokenizer
        try:
            request = text_request(
                tok,
                values["prompt"] or default_prompt(tok),
                values["max_new_tokens"],
                stop=stop,
                seed=values["seed"],
                device=next(self.model.parameters()).device,
                temperature=values["temperature"],
                top_k=values["top_k"] or None,
                top_p=values["top_p"],
            )
        except Exception as e:  # noqa: BLE001 - characters the tokenizer does not know: the user's to fix
            raise RequestError(400, one_line(e)) from None
        try:
            self.batcher.check(request)  # (the counts and sampling settings too)
        except ValueError as e:
            raise RequestError(400, str(e)) from None
        return GenerationJob(request, stop)

    def close(self) -> None:
        """Stop the thread after the step it is in; requests still waiting are answered with an error."""
        self.inbox.put(None)

    def _loop(self) -> None:
        from ..batching import ContinuousBatcher
        from ..errors import one_line

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
                    self.batcher.submit(job.request)  # (checked by _job already)
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


def make_handler(model, kind: str, port_ref: list, worker: GenerationWorker | None = None):
    """``model``: loaded by :func:`attnlab.load` (its ``explore`` recomputes the views). One
    computation at a time: hook points are the model's state, and the CPU is shared anyway.
    ``worker``: answers /generate (GPT runs), sharing the same lock."""
    name = Path(model.checkpoint).name
    lock = worker.lock if worker is not None else threading.Lock()
    generate_form = "" if worker is None else GENERATE_FORM.format(slots=worker.slots)

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, fmt, *args):  # quiet: one line per request on stderr is noise here
            pass

        def _allowed(self) -> bool:
            port = port_ref[0]
            hosts = {f"127.0.0.1:{port}", f"localhost:{port}", f"[::1]:{port}"}
            if self.headers.get("Host") not in hosts:
                return False
            origin = self.headers.get("Origin")
            return origin is None or origin in {f"http://{h}" for h in hosts}

        def _send(self, code: int, body: str, ctype: str = "text/html; charset=utf-8") -> None:
            data = body.encode("utf-8")
            self.send_response(code)
            self.send_header("Content-Type", ctype)
            self.send_header("Content-Length", str(len(data)))
            self.send_header("Content-Security-Policy", "default-src 'self' 'unsafe-inline' data: blob:")
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if not self._allowed():
                return self._send(403, "forbidden: requests must come from this machine's own pages")
            if self.path not in ("/", "/index.html"):
                return self._send(404, "not found")
            what, fields = FIELDS[kind]
            page = FORM.format(name=name, what=what, fields=fields, kind=json.dumps(kind), generate=generate_form)
            self._send(200, page)

        def _inputs(self, fields) -> dict:
            """The JSON body, read only when its declared length is sound, holding only ``fields``."""
            length = self.headers.get("Content-Length")
            if length is None:
                raise RequestError(411, "the request has no Content-Length; send the JSON body with its length")
            if not length.isdigit():
                raise RequestError(400, f"Content-Length {length!r} is not a byte count")
            if int(length) > MAX_BODY:
                raise RequestError(413, f"the request is {int(length):,} bytes; the limit is {MAX_BODY:,}")
            try:
                body = json.loads(self.rfile.read(int(length)) or b"{}")
            except (json.JSONDecodeError, UnicodeDecodeError) as e:
                raise RequestError(400, f"the body is not JSON ({e.msg if hasattr(e, 'msg') else e})") from None
            if not isinstance(body, dict):
                raise RequestError(
                    400, f"the body must be a JSON object with {', '.join(fields)}, not a {type(body).__name__}"
                )
            unknown = sorted(set(body) - set(fields))
            if unknown:
                raise RequestError(400, f"unknown field {unknown[0]!r}; this request reads {', '.join(fields)}")
            return body

        def do_POST(self):  # noqa: N802
            from ..errors import one_line

            if not self._allowed():
                self.close_connection = True  # its body is not read
                return self._send(403, "forbidden: requests must come from this machine's own pages")
            if self.path == "/generate":
                return self._generate()
            if self.path != "/explore":
                self.close_connection = True
                return self._send(404, "not found")
            try:
                body = self._inputs(INPUTS[kind])
                for field_name, value in body.items():
                    if not isinstance(value, str):
                        raise RequestError(400, f"field {field_name!r} must be a string, not {type(value).__name__}")
                inputs = {k: body.get(k) for k in ("text", "src", "tgt")}
                with tempfile.TemporaryDirectory() as tmp:
                    if body.get("image"):
                        inputs["image"] = Path(tmp) / "upload"
                        try:
                            inputs["image"].write_bytes(base64.b64decode(body["image"], validate=True))
                        except (ValueError, binascii.Error):
                            raise RequestError(400, "field 'image' is not base64") from None
                    with lock:
                        html = model.explore(**inputs).html()
            except RequestError as e:
                if e.status != 400:
                    self.close_connection = True  # the body was left unread
                return self._send(e.status, f"error: {e}", "text/plain; charset=utf-8")
            except Exception as e:  # noqa: BLE001 - a bad input is the user's to fix: say what, keep serving
                return self._send(400, f"error: {one_line(e)}", "text/plain; charset=utf-8")
            self._send(200, html)

        def _generate(self) -> None:
            if worker is None:
                self.close_connection = True
                return self._send(404, f"not found: /generate needs a GPT run, and {name} is not one")
            try:
                answer = worker.generate(self._inputs(GENERATE_INPUTS))
            except RequestError as e:
                self.close_connection = True  # (the body may be unread)
                return self._send(e.status, f"error: {e}", "text/plain; charset=utf-8")
            self._send(200, json.dumps(answer), "application/json")

    return Handler


class ExplorerServer(ThreadingHTTPServer):
    """A thread per request, a listen queue deep enough for a burst of them, and a dropped
    connection reported in one line instead of a traceback."""

    request_queue_size = 256
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        from ..errors import one_line

        err = sys.exc_info()[1]
        print(
            f"serve: request from {client_address[0]} failed: {type(err).__name__}: {one_line(err)}",
            file=sys.stderr,
            flush=True,
        )


def serve(model, kind: str, host: str = "127.0.0.1", port: int = 8000, ready=None, slots: int = 8) -> None:
    """Serve until interrupted. ``ready(server)`` is called once listening (tests use port 0).
    A model that generates text (a GPT) also answers /generate, ``slots`` requests at a time."""
    port_ref = [port]
    worker = None
    if callable(getattr(model, "generate", None)) and getattr(model, "tokenizer", None) is not None:
        worker = GenerationWorker(model, threading.Lock(), slots)
    try:
        server = ExplorerServer((host, port), make_handler(model, kind, port_ref, worker))
    except OSError as e:
        if e.errno in (98, 48, 10048):  # address in use (Linux, macOS, Windows)
            raise OSError(f"port {port} on {host} is taken; choose another with --port") from None
        raise
    port_ref[0] = server.server_address[1]
    if ready is not None:
        ready(server)
    try:
        server.serve_forever()
    finally:
        server.server_close()
        if worker is not None:
            worker.close()
