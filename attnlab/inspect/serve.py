"""`attnlab serve`: the explorer page served locally, with an input box that recomputes it.

Bound to 127.0.0.1 by default. Requests must name this machine as their Host (against DNS
rebinding) and, when they carry an Origin, come from this server's own pages; others get 403.
"""

from __future__ import annotations

import base64
import binascii
import json
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FORM = """<!doctype html><html lang="en"><head><meta charset="utf-8"><title>attnlab serve: {name}</title>
<style>body{{font:14px system-ui,sans-serif;margin:24px}}textarea{{width:40em;height:5em}}</style></head>
<body><h1>attnlab explorer: {name}</h1><p>{what}</p>
<form id="f">{fields}<p><button type="submit">explore</button> <span id="msg"></span></p></form>
<script>
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


class RequestError(Exception):
    """A request to refuse: its HTTP status and a one-line reason."""

    def __init__(self, status: int, reason: str):
        super().__init__(reason)
        self.status = status


def make_handler(model, kind: str, port_ref: list):
    """``model``: loaded by :func:`attnlab.load` (its ``explore`` recomputes the views). One
    computation at a time: hook points are the model's state, and the CPU is shared anyway."""
    name = Path(model.checkpoint).name
    lock = threading.Lock()

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
            self._send(200, FORM.format(name=name, what=what, fields=fields, kind=json.dumps(kind)))

        def _inputs(self) -> dict:
            """The checked JSON body, read only when its declared length is sound."""
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
                    400, f"the body must be a JSON object with {', '.join(INPUTS[kind])}, not a {type(body).__name__}"
                )
            unknown = sorted(set(body) - set(INPUTS[kind]))
            if unknown:
                raise RequestError(400, f"unknown field {unknown[0]!r}; this model reads {', '.join(INPUTS[kind])}")
            for field, value in body.items():
                if not isinstance(value, str):
                    raise RequestError(400, f"field {field!r} must be a string, not {type(value).__name__}")
            return body

        def do_POST(self):  # noqa: N802
            from ..errors import one_line

            if not self._allowed():
                self.close_connection = True  # its body is not read
                return self._send(403, "forbidden: requests must come from this machine's own pages")
            if self.path != "/explore":
                self.close_connection = True
                return self._send(404, "not found")
            try:
                body = self._inputs()
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


def serve(model, kind: str, host: str = "127.0.0.1", port: int = 8000, ready=None) -> None:
    """Serve until interrupted. ``ready(server)`` is called once listening (tests use port 0)."""
    port_ref = [port]
    try:
        server = ExplorerServer((host, port), make_handler(model, kind, port_ref))
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
