"""`attnlab serve`: the explorer page served locally, with an input box that recomputes it.

Bound to 127.0.0.1 by default. Requests must name this machine as their Host (against DNS
rebinding) and, when they carry an Origin, come from this server's own pages; others get 403.
"""

from __future__ import annotations

import base64
import json
import tempfile
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


def make_handler(model, kind: str, port_ref: list):
    """``model``: loaded by :func:`attnlab.load` (its ``explore`` recomputes the views)."""
    name = Path(model.checkpoint).name

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
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):  # noqa: N802 (http.server's naming)
            if not self._allowed():
                return self._send(403, "forbidden: requests must come from this machine's own pages")
            if self.path not in ("/", "/index.html"):
                return self._send(404, "not found")
            what, fields = FIELDS[kind]
            self._send(200, FORM.format(name=name, what=what, fields=fields, kind=json.dumps(kind)))

        def do_POST(self):  # noqa: N802
            from ..errors import one_line

            if not self._allowed():
                return self._send(403, "forbidden: requests must come from this machine's own pages")
            if self.path != "/explore":
                return self._send(404, "not found")
            try:
                size = int(self.headers.get("Content-Length", "0"))
                if size > 20_000_000:
                    raise ValueError("the request is larger than 20 MB")
                body = json.loads(self.rfile.read(size) or b"{}")
                inputs = {k: body.get(k) for k in ("text", "src", "tgt")}
                with tempfile.TemporaryDirectory() as tmp:
                    if body.get("image"):
                        inputs["image"] = Path(tmp) / "upload"
                        inputs["image"].write_bytes(base64.b64decode(body["image"]))
                    html = model.explore(**inputs).html()
            except Exception as e:  # noqa: BLE001 - a bad input is the user's to fix: say what, keep serving
                return self._send(400, f"error: {one_line(e)}", "text/plain; charset=utf-8")
            self._send(200, html)

    return Handler


def serve(model, kind: str, host: str = "127.0.0.1", port: int = 8000, ready=None) -> None:
    """Serve until interrupted. ``ready(server)`` is called once listening (tests use port 0)."""
    port_ref = [port]
    try:
        server = ThreadingHTTPServer((host, port), make_handler(model, kind, port_ref))
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
