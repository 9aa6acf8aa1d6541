"""`attnlab serve` on its ASGI stack: OpenAI's /v1/completions (plain and streamed), load (100
concurrent requests, 200 slow clients), hostile bodies, a poisoned request among good ones, and
/reload."""

import json
import re
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

import attnlab
from attnlab.recipes import recipes
from helpers import image_png

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
httpx = pytest.importorskip("httpx")

RUN = Path(__file__).parent / "fixtures" / "runs_v0_1" / "gpt"


@pytest.fixture(scope="module")
def server():
    from attnlab import serve as serving

    model = attnlab.load(RUN)
    started, box = threading.Event(), {}

    def ready(s):
        box["server"] = s
        started.set()

    thread = threading.Thread(
        target=serving.serve, args=(model, "text", "127.0.0.1", 0, ready), kwargs={"slots": 4}, daemon=True
    )
    thread.start()
    assert started.wait(20)
    port = box["server"].server_address[1]
    yield model, f"http://127.0.0.1:{port}", port
    box["server"].shutdown()
    thread.join(10)


def test_openai_completions_plain_and_streamed(server):
    model, url, _ = server
    with httpx.Client(base_url=url, timeout=60) as c:
        assert c.get("/v1/models").json()["data"][0]["id"] == "gpt"
        r = c.post("/v1/completions", json={"model": "gpt", "prompt": "to", "max_tokens": 12, "temperature": 0})
        assert r.status_code == 200, r.text
        body = r.json()
        want = model.generate("to", 12, temperature=0)
        assert body["object"] == "text_completion" and body["choices"][0]["text"] == want
        assert body["choices"][0]["finish_reason"] == "length"
        assert (
            body["usage"]["completion_tokens"] == 12
            and body["usage"]["total_tokens"] == body["usage"]["prompt_tokens"] + 12
        )
        two = c.post("/v1/completions", json={"prompt": ["to", "be"], "max_tokens": 5, "temperature": 0}).json()
        assert [ch["text"] for ch in two["choices"]] == [model.generate(p, 5, temperature=0) for p in ("to", "be")]
        # streamed: server-sent events whose pieces make the same text, then [DONE]
        events = []
        with c.stream(
            "POST", "/v1/completions", json={"prompt": "to", "max_tokens": 12, "temperature": 0, "stream": True}
        ) as s:
            assert s.headers["content-type"].startswith("text/event-stream")
            for line in s.iter_lines():
                if line.startswith("data: "):
                    events.append(line[len("data: ") :])
        assert events[-1] == "[DONE]"
        chunks = [json.loads(e) for e in events[:-1]]
        # (at least one piece of text and the finish: tokens that come faster than the events are sent
        # share one, so how many there are depends on the machine's load, never the text they make)
        assert "".join(ch["choices"][0]["text"] for ch in chunks) == want and len(chunks) >= 2
        assert chunks[-1]["choices"][0]["finish_reason"] == "length"
        # errors in OpenAI's shape, one line each
        for bad, says in [
            ({"prompt": "to", "n": 17}, "'n' must be at most 16"),
            ({"prompt": "to", "max_tokens": -1}, "'max_tokens' must be at least 0"),
            ({"prompt": "to", "logprobs": 21}, "must be at most 20"),
            ({"prompt": [5, 99999]}, "token id 99999 is outside the vocabulary"),
            ({"prompt": ["to"] * 5, "n": 16}, "80 completions; one request may ask for 64"),
            ({"prompt": "to", "stream": True, "echo": True}, "stream: one prompt, n 1, without echo"),
            ({"prompt": "to", "frequency_penalty": 1}, "unknown field 'frequency_penalty'"),
            ({"prompt": "to", "max_tokens": 5000}, "and max_tokens 5000 exceed the model's context"),  # (its own name)
        ]:
            r = c.post("/v1/completions", json=bad)
            err = r.json()["error"]
            assert r.status_code == 400 and says in err["message"] and err["type"] == "invalid_request_error", r.text


def test_chat_and_a_missing_extra_point_to_what_works(server, monkeypatch):
    """A chat request to a model without a chat template is sent to /v1/completions, a count the
    context cannot hold is named by the request's own field, and a missing extra names the
    packages it installs (issue 81)."""
    import sys

    from attnlab.errors import OptionError
    from attnlab.serve import serve

    model, url, _ = server
    with httpx.Client(base_url=url, timeout=60) as c:
        chat = {"messages": [{"role": "user", "content": "to"}]}
        r = c.post("/v1/chat/completions", json=chat)
        assert r.status_code == 400 and r.json()["error"]["message"] == (
            "gpt has no chat template: it continues text; POST the text to /v1/completions"
        )
        r = c.post("/generate", json={"prompt": "to", "max_new_tokens": 5000})
        assert r.status_code == 400 and "max_new_tokens 5000 exceed the model's context" in r.text
    monkeypatch.setitem(sys.modules, "uvicorn", None)  # (not installed)
    with pytest.raises(OptionError, match=r"runs on Starlette, uvicorn and pydantic: pip install 'attnlab\[serve\]'"):
        serve(model, "text", "127.0.0.1", 0)


def test_a_hundred_requests_at_once_and_a_poisoned_one(server):
    model, url, _ = server
    prompts = ["to be", "or not", "that is", "to the"]

    def post(i):
        body = {"prompt": prompts[i % 4], "max_new_tokens": 6, "temperature": 0}
        if i == 50:  # a temperature float32 cannot hold (0 after the cast): its own answer, nobody else's
            body = {"prompt": "to", "max_new_tokens": 6, "temperature": 1e-300}
        r = httpx.post(url + "/generate", json=body, timeout=120)
        return i, r.status_code, r.text

    with ThreadPoolExecutor(100) as pool:
        results = list(pool.map(post, range(100)))
    wants = {p: model.generate(p, 6, temperature=0) for p in prompts}
    for i, status, text in results:
        assert status == 200, (i, text)
        if i != 50:
            assert json.loads(text)["text"] == wants[prompts[i % 4]]


def _stall(port: int) -> socket.socket:
    """A client that sends its headers and part of its body, then nothing."""
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    s.sendall(
        f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n"
        f'Content-Length: 100\r\n\r\n{{"prompt": '.encode()
    )
    return s


def test_slow_clients_do_not_hold_the_server_and_are_cut_off(server, monkeypatch):
    from attnlab import serve as serving

    model, url, port = server
    # 200 stalled clients, each allowed a minute for its body: a good request is answered while
    # they all still wait (none has been answered yet: the order shows it, not a clock)
    monkeypatch.setattr(serving, "BODY_TIMEOUT_S", 60.0)
    slow = [_stall(port) for _ in range(200)]
    r = httpx.post(url + "/generate", json={"prompt": "to", "max_new_tokens": 4, "temperature": 0}, timeout=55)
    assert r.status_code == 200 and json.loads(r.text)["tokens"] == 4
    for s in slow:
        s.setblocking(False)
        with pytest.raises(BlockingIOError):  # still waiting for its body, unanswered
            s.recv(1)
        s.close()
    # clients that stall past the limit are answered 408 and let go
    monkeypatch.setattr(serving, "BODY_TIMEOUT_S", 0.5)
    answers = []
    for s in [_stall(port) for _ in range(20)]:
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        s.close()
        answers.append(data.split(b" ", 2)[1])
    assert answers == [b"408"] * 20


@pytest.mark.parametrize(
    "raw, status, says",
    [
        ("[" * 100_000, 400, "nested too deeply"),
        ('{"prompt": "to", "max_new_tokens": ' + "9" * 5001 + "}", 400, "value Python refuses"),
        ('{"prompt": 3}', 400, "'prompt' must be a string"),
        ('{"prompt": "to", "seed": 99999999999999999999999}', 400, "'seed' must be at most"),
        ('{"prompt": "to", "stop": [""]}', 400, "non-empty string"),
        ("\xff\xfe", 400, "not JSON"),
    ],
)
def test_hostile_bodies_get_one_line(server, raw, status, says):
    _, url, _ = server
    r = httpx.post(url + "/generate", content=raw.encode("latin-1"), timeout=30)
    assert r.status_code == status and r.text.startswith("error:") and says in r.text, r.text
    assert len(r.text.splitlines()) == 1


def _answer(port: int, raw: bytes, end_sending: bool = False) -> tuple[bytes, bytes]:
    """(status, body) of what the server says to ``raw`` sent as is (``end_sending``: then the
    client's side shut, as a client that sent all it had does)."""
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(raw)
        if end_sending:
            s.shutdown(socket.SHUT_WR)
        data = b""
        while chunk := s.recv(4096):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return head.split(b" ", 2)[1], body


@pytest.mark.parametrize("length", ["abc", "-5", "1e3", "12, 13"])
def test_a_content_length_that_is_no_byte_count_is_named(server, length):
    _, _, port = server
    status, body = _answer(port, f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {length}"
                           '\r\n\r\n{"prompt": "to"}'.encode())  # fmt: skip
    assert status == b"400" and body.startswith(b"error: the request's Content-Length is not a byte count"), body
    assert len(body.splitlines()) == 1


def test_a_body_cut_short_is_answered_with_how_much_came(server):
    _, _, port = server
    raw = f'POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 100\r\n\r\n{{"prompt": '.encode()
    status, body = _answer(port, raw, end_sending=True)
    assert status == b"400" and b"the request body ended early" in body and b"received 11 bytes, expected 100" in body


def test_a_head_that_stops_arriving_is_answered_408_and_closed(server, monkeypatch):
    from attnlab import serve as serving

    _, _, port = server
    monkeypatch.setattr(serving, "HEAD_TIMEOUT_S", 0.5)
    status, body = _answer(port, f"POST /generate HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Ty".encode())
    assert status == b"408" and body == b"error: the request's head did not arrive within 0.5 s"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:  # connected, nothing sent: let go
        assert s.recv(1) == b""


def test_limits_host_check_and_reload(server):
    _, url, port = server
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:  # a length declared, no body sent
        s.sendall(f"POST /explore HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: 30000000\r\n\r\n".encode())
        assert s.recv(4096).split(b" ", 2)[1] == b"413"
    r = httpx.get(url + "/", headers={"Host": "evil.example"}, timeout=30)
    assert r.status_code == 403
    r = httpx.post(url + "/explore", json={"text": "to be"}, headers={"Origin": "http://evil.example"}, timeout=30)
    assert r.status_code == 403
    assert httpx.post(url + "/explore", json={"text": "to be"}, timeout=60).status_code == 200
    r = httpx.post(url + "/reload", content=b"{}", timeout=60)
    assert r.status_code == 200 and r.json()["reloaded"].endswith("gpt")
    assert httpx.post(url + "/generate", json={"prompt": "to", "max_new_tokens": 3}, timeout=60).status_code == 200


def test_a_bad_host_is_named(capsys):
    from attnlab.cli import main

    assert main(["serve", "--ckpt", str(RUN), "--host", "999.1.1.1"]) == 2
    err = capsys.readouterr().err
    assert "cannot listen on --host 999.1.1.1" in err and len(err.strip().splitlines()) == 1


def test_server_bodies_are_checked_by_the_sample_commands_own_specs(server):
    """One declaration for both surfaces: a value `attnlab sample` refuses, /generate refuses, with
    the bound the spec declares."""
    from attnlab.errors import OptionError
    from attnlab.recipes import recipe_for

    _, url, _ = server
    specs = next(c for c in recipe_for("gpt").commands() if c.name == "sample").options
    for name, bad in (
        ("max_new_tokens", 2_000_000),
        ("temperature", -0.5),
        ("top_p", 1.5),
        ("seed", 2**64),
        ("top_k", -3),
    ):
        with pytest.raises(OptionError):
            specs.check(name, bad)
        r = httpx.post(url + "/generate", json={"prompt": "to", name: bad}, timeout=30)
        assert r.status_code == 400 and f"field '{name}'" in r.text, (name, r.text)


@pytest.mark.parametrize("dtype, quantize", [("bf16", "packed"), ("fp32", "int8")])
def test_serve_decodes_in_the_form_dtype_and_quantize_ask_for(tmp_path, monkeypatch, dtype, quantize):
    """`attnlab serve --dtype --quantize` (declared once with `sample`'s): the served model is the
    loaded one in that dtype with those layers."""
    import torch

    import attnlab.serve
    from attnlab.cli import main
    from attnlab.generate.quantize import Int8Linear, PackedLinear, why_not_packed

    if quantize == "packed" and why_not_packed(torch.bfloat16) is not None:
        pytest.skip(why_not_packed(torch.bfloat16))
    served = {}
    monkeypatch.setattr(attnlab.serve, "serve", lambda model, *a, **kw: served.update(model=model))
    assert main(["serve", "--ckpt", str(RUN), "--dtype", dtype, "--quantize", quantize]) == 0
    model = served["model"]
    assert isinstance(model.blocks[0].attn.qkv, PackedLinear if quantize == "packed" else Int8Linear)
    assert model.tok_emb.weight.dtype == (torch.bfloat16 if dtype == "bf16" else torch.float32)


EXPLORED = [r.name for r in recipes() if r.explorer_form() is not None]


@pytest.mark.parametrize("family", EXPLORED)
def test_the_served_page_and_explore_read_the_inputs_the_family_declares(family, tiny_run, tmp_path):
    """The server keeps no table of families: its page shows a box for each input the family's
    ``explorer_form()`` declares, ``POST /explore`` reads those fields (an image as base64) and
    refuses any other, for every family with an explorer."""
    import asyncio
    import base64

    from attnlab.serve import create_app

    model = tiny_run(family).load()
    form = model.family_recipe().explorer_form()
    first = form.inputs[0]  # (what every family's explorer needs; the others are optional)
    given = {"text": "ab ab", "line": "abc"}.get(first.box)
    if first.box == "image":
        given = base64.b64encode(image_png(model)).decode()
    app = create_app(model, port_ref=[8000])

    async def ask():
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1:8000", timeout=60) as client:
            page = await client.get("/")
            explored = await client.post("/explore", json={first.name: given})
            refused = await client.post("/explore", json={"colour": "red"})
            return page, explored, refused

    try:
        page, explored, refused = asyncio.run(ask())
    finally:
        if app.app.state.worker is not None:
            app.app.state.worker.close()
    assert form.hint in page.text and all(f'data-field="{i.name}"' in page.text for i in form.inputs)
    assert ('type="file"' in page.text) == any(i.box == "image" for i in form.inputs)
    assert explored.status_code == 200 and "explorerReady" in explored.text, explored.text
    assert refused.status_code == 400 and "unknown field 'colour'" in refused.text, refused.text


def test_serve_help_names_every_endpoint_the_app_serves(server):
    """`attnlab serve --help` described only the explorer page (issue 81): it names each route of
    the application, with its method."""
    from attnlab.cli import commands
    from attnlab.serve import create_app

    shown = " ".join(commands()["serve"].description.split())
    app = create_app(server[0]).app
    for route in app.routes:
        if route.path != "/index.html":  # (the page again)
            method = next(m for m in route.methods if m != "HEAD")
            assert re.search(rf"{method} {re.escape(route.path)}(?![\w/])", shown), route.path
