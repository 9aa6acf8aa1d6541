"""The attention explorer, driven in a real browser (Debian's chromium through Playwright, with
every network request blocked): it opens from disk without errors, switching layer and head
changes the view, and what it highlights is what the Python API computes."""

import os
import shutil
from pathlib import Path

import json

import numpy as np
import pytest

import attnlab
from attnlab.cli import main
from attnlab.inspect.explorer import DENSE_MAX, encode_head, write_page

RUNS = Path(__file__).parent / "fixtures" / "runs_v0_1"
INSTALL = (
    "install the browser with `apt-get install chromium` (Debian; .ci/run does it as root) and "
    "`pip install playwright`, or point ATTNLAB_CHROMIUM at a Chromium binary"
)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.fail(f"Playwright for Python is missing: {INSTALL}")
    path = os.environ.get("ATTNLAB_CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
    if not path:
        pytest.fail(f"no Chromium found: {INSTALL}")
    with sync_playwright() as p:
        try:
            b = p.chromium.launch(executable_path=path, args=["--no-sandbox"])
        except Exception as e:  # noqa: BLE001 - any launch failure gets the same instructions
            pytest.fail(f"Chromium at {path} did not start ({str(e).splitlines()[0]}): {INSTALL}")
        yield b
        b.close()


def _open(browser, html: Path):
    page = browser.new_page(viewport={"width": 1400, "height": 900})
    errors, requests = [], []
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))

    def only_local(route):
        url = route.request.url
        if url.startswith(("file:", "data:", "blob:")):
            route.continue_()
        else:
            requests.append(url)
            route.abort()

    page.route("**/*", only_local)
    page.goto(html.as_uri())
    page.wait_for_function("window.explorerReady === true", timeout=10_000)
    return page, errors, requests


def _status(page) -> dict:
    return page.evaluate("Object.assign({}, document.getElementById('status').dataset)")


def _top(page) -> list[int]:
    s = _status(page)["top"]
    return [int(i) for i in s.split(",")] if s else []


def _view(page) -> str:
    return page.evaluate("document.getElementById('view').toDataURL()")


def _not_blank(png: bytes) -> bool:
    import io

    from PIL import Image

    img = np.asarray(Image.open(io.BytesIO(png)).convert("L"))
    return img.std() > 5


def _argmax(row: np.ndarray) -> int:
    q = np.rint(row * 65535)  # the page sees 16-bit weights: ties break to the lower index
    return int(np.flatnonzero(q == q.max())[0])


def test_text_page(browser, tmp_path):
    from attnlab.inspect.explorer import text_attention

    html = tmp_path / "gpt.html"
    text = "The attention"
    assert main(["explore", "--ckpt", str(RUNS / "gpt"), "--text", text, "--out", str(html)]) == 0
    model = attnlab.load(RUNS / "gpt")
    data = text_attention(model, model.tokenizer, text)  # the Python API: the same numbers as the page
    page, errors, requests = _open(browser, html)
    assert page.locator("#thumbs canvas").count() == data["attention"].shape[0] * data["attention"].shape[1]
    first = page.locator("#thumbs canvas").first  # head-detector scores on the thumbnails
    assert f"previous-token {data['detectors']['previous_token'][0, 0]:.2f}" in first.get_attribute("title")
    before = _view(page)
    page.select_option("#head", "1")
    assert _status(page)["head"] == "1" and _view(page) != before
    box = page.locator("#view").bounding_box()
    for q in (3, 7):  # hover query token q on the left: its row of layer 0, head 1
        page.mouse.move(box["x"] + 100, box["y"] + 5 + q * 18 + 9)
        assert _status(page)["query"] == str(q)
        assert _top(page)[0] == _argmax(data["attention"][0, 1, q])
    assert page.locator("#next tr").count() == 10  # the next-token distribution at the hovered position
    rows = page.locator("#neuron tr")  # the neuron view of layer 0, head 1, query 7: q·k/√d_k and the softmax
    assert rows.count() > 2 and "q·k" in rows.first.inner_text()
    cells = rows.nth(1).locator("td")
    j = int(cells.nth(0).inner_text().rsplit("(", 1)[1].rstrip(")"))
    assert abs(float(cells.nth(4).inner_text()) - data["attention"][0, 1, 7, j]) < 1e-3
    assert abs(float(cells.nth(2).inner_text()) - data["scores"][0, 1, 7, j]) < 2e-3  # no position bias here
    lens = page.locator("#lens tr")  # the logit lens there: embeddings + each block; the last is the model's top
    assert lens.count() == data["attention"].shape[0] + 1 == len(data["lens_tokens"])
    assert lens.last.locator("td").nth(1).inner_text() == json.dumps(data["next_tokens"][7][0])
    page.check("#show-values")  # (moving to the checkbox leaves the view: hover again)
    page.mouse.move(box["x"] + 100, box["y"] + 5 + 7 * 18 + 9)
    assert page.locator("#values").inner_text().strip().startswith(str(_argmax(data["attention"][0, 1, 7])))
    page.mouse.move(box["x"] + 2 * 160 + 220 - 40, box["y"] + 5 + 2 * 18 + 9)  # a key on the right: its column
    col = data["attention"][0, 1, :, 2]
    assert _status(page)["key"] == "2" and _top(page)[0] == _argmax(col)
    page.locator("#thumbs canvas").nth(1).click()  # layer 0, head 1 -> the model view selects a head
    assert _not_blank(page.screenshot()) and not errors and not requests


def test_image_page(browser, tmp_path):
    from PIL import Image

    from attnlab.data.images import load_image
    from attnlab.inspect.explorer import image_attention

    img_path = tmp_path / "digit.png"
    Image.fromarray((np.arange(64).reshape(8, 8) * 4).astype(np.uint8)).save(img_path)
    html = tmp_path / "vit.html"
    assert main(["explore", "--ckpt", str(RUNS / "vit"), "--image", str(img_path), "--out", str(html)]) == 0
    model = attnlab.load(RUNS / "vit")
    img, _ = load_image(img_path, 1, 8)
    data = image_attention(model, img, model.mean, model.std)
    page, errors, requests = _open(browser, html)
    box = page.locator("#view").bounding_box()
    gh, gw = data["grid"]
    cell = box["width"] / gw
    for patch in (0, 5, gh * gw - 1):  # click a patch: its attention over the patches
        r, c = divmod(patch, gw)
        page.mouse.click(box["x"] + (c + 0.5) * cell, box["y"] + (r + 0.5) * cell)
        q = data["n_prefix"] + patch
        assert _status(page)["query"] == str(q)
        assert _top(page)[0] == _argmax(data["attention"][0, 0, q, data["n_prefix"] :])
    page.click("#cls")
    assert _status(page)["query"] == "0"
    before = _view(page)
    page.select_option("#fusion", "max")
    assert _view(page) != before and _top(page)[0] == int(np.argmax(data["rollout"]["max/0.0"]))
    shown = _view(page)  # the heat map's opacity: at 0 only the image is left
    page.evaluate(
        "(() => { const o = document.getElementById('opacity'); o.value = 0; o.dispatchEvent(new Event('input')); })()"
    )
    assert _view(page) != shown and _top(page)[0] == int(np.argmax(data["rollout"]["max/0.0"]))
    assert page.locator("#distance").count() == 1
    assert _not_blank(page.screenshot()) and not errors and not requests


def test_cross_page(browser, tmp_path):
    from attnlab.inspect.explorer import cross_attention

    html = tmp_path / "s2s.html"
    assert main(["explore", "--ckpt", str(RUNS / "s2s"), "--src", "abcdef", "--tgt", "fedcba", "--out", str(html)]) == 0
    model = attnlab.load(RUNS / "s2s")
    data = cross_attention(model, model.src_vocab, model.tgt_vocab, "abcdef", "fedcba")
    page, errors, requests = _open(browser, html)
    page.select_option("#head", "avg")
    box = page.locator("#view").bounding_box()
    cell = 22
    for t in (0, 3):  # hover target word t: the source words it looks at
        page.mouse.move(box["x"] + 60, box["y"] + 90 + t * cell + cell / 2)
        assert _status(page)["query"] == str(t)
        assert _top(page)[0] == _argmax(data["attention"][0, :, t].mean(0))
    with page.expect_download() as dl:
        page.click("#save-json")
    assert b'"kind":"cross"' in Path(dl.value.path()).read_bytes()
    for which, key in (("encoder_self", "encoder_self"), ("decoder_self", "decoder_self")):  # the model view
        page.select_option("#which", which)
        page.select_option("#head", "avg")
        assert which.split("_")[0] in page.locator("#view-title").inner_text()
        assert page.locator("#thumbs canvas").count() == data[key].shape[0] * data[key].shape[1]
        page.mouse.move(box["x"] + 60, box["y"] + 90 + 2 * cell + cell / 2)
        assert _status(page)["query"] == "2" and _top(page)[0] == _argmax(data[key][0, :, 2].mean(0))
    assert _not_blank(page.screenshot()) and not errors and not requests


def test_long_inputs_are_stored_sparsely_and_stay_usable(browser, tmp_path):
    """1,024 tokens: each row keeps its 32 largest weights; the page opens and answers a hover."""
    rng = np.random.default_rng(0)
    t, layers, heads = 1024, 2, 2
    att = rng.random((layers, heads, t, t)).astype(np.float32) ** 8
    att /= att.sum(-1, keepdims=True)
    data = {"kind": "text", "tokens": [f"w{i}" for i in range(t)], "attention": att}
    assert "topk" in encode_head(att[0, 0]) and t > DENSE_MAX
    html = write_page(data, tmp_path / "long.html", "long")
    assert html.stat().st_size < 3e6  # bounded: L·H·T·32·4 bytes before base64
    page, errors, _ = _open(browser, html)
    load_ms = page.evaluate("performance.now()")
    page.evaluate("window.scrollTo(0, 500 * 18 - 300)")  # the page scrolls; the view stays one canvas
    box = page.locator("#view").bounding_box()  # (relative to the scrolled viewport)
    page.mouse.move(box["x"] + 100, box["y"] + 5 + 500 * 18 + 9)
    assert _status(page)["query"] == "500" and _top(page)[0] == _argmax(att[0, 0, 500])
    print(f"1,024-token page: ready after {load_ms:.0f} ms")  # recorded in benchmarks/README.md, not asserted
    assert "keeps its 32 largest weights" in page.locator("#sparse").inner_text()  # said, not hidden
    with page.expect_download() as dl:  # (clicked in place: moving the mouse there would leave row 500)
        page.evaluate("document.getElementById('save-json').click()")
    saved = json.loads(Path(dl.value.path()).read_bytes())
    kept = np.sort(att[0, 0, 500])[-32:].sum()
    assert saved["top_k"] == 32 and abs(saved["dropped"] - (1 - kept)) < 1e-3
    assert not errors


def _serve_in_thread(ckpt):
    import threading

    from attnlab.serve import serve
    from attnlab.recipes import checkpoint_recipe

    started = threading.Event()
    box = {}

    def ready(server):
        box["server"] = server
        started.set()

    recipe = checkpoint_recipe(ckpt)
    threading.Thread(
        target=serve, args=(attnlab.load(ckpt), recipe.explore_kind, "127.0.0.1", 0, ready), daemon=True
    ).start()
    assert started.wait(10)
    return box["server"]


def test_serve_recomputes_and_refuses_other_origins(browser):
    import http.client
    import json as _json

    server = _serve_in_thread(str(RUNS / "gpt"))
    port = server.server_address[1]
    try:

        def request(method, path, body=None, headers=None):
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
            c.request(method, path, body=body, headers=headers or {})
            r = c.getresponse()
            return r.status, r.read().decode()

        assert request("GET", "/")[0] == 200
        status, html = request("POST", "/explore", _json.dumps({"text": "The"}), {"Content-Type": "application/json"})
        assert status == 200 and "explorerReady" in html
        assert request("POST", "/explore", "{}", {"Origin": "http://evil.example"})[0] == 403
        assert request("GET", "/", headers={"Host": "evil.example"})[0] == 403
        status, err = request("POST", "/explore", _json.dumps({"text": "é" * 40}))
        assert status == 400 and err.startswith("error:")
        page = browser.new_page(bypass_csp=True)  # (lets Playwright evaluate its checks); type, submit, see
        page.goto(f"http://127.0.0.1:{port}/")
        page.fill("textarea", "The ")
        page.click("button")
        page.wait_for_function("window.explorerReady === true", timeout=10_000)
        assert page.locator("#thumbs canvas").count() > 0
        page.close()
    finally:
        server.shutdown()


def test_serve_says_when_the_port_is_taken(capsys):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    try:
        assert main(["serve", "--ckpt", str(RUNS / "gpt"), "--port", str(s.getsockname()[1])]) == 2
        assert "is taken" in capsys.readouterr().err
    finally:
        s.close()


def test_explore_generated_tokens(browser, tmp_path, capsys):
    """--generate N: the text continued greedily, the generated tokens marked, and each one's row
    the attention it had when it was produced (causal: later tokens cannot change it)."""
    from attnlab.inspect.explorer import text_attention

    model = attnlab.load(RUNS / "gpt")
    tok = model.tokenizer
    data = text_attention(model, tok, "The ca", generate=5)
    assert len(data["tokens"]) == 11 and data["generated_from"] == 6
    longer = text_attention(model, tok, "The ca", generate=7)
    assert np.allclose(longer["attention"][..., :11, :11], data["attention"], atol=1e-6)
    assert longer["tokens"][:11] == data["tokens"]
    page = attnlab.load(RUNS / "gpt").explore(text="The ca", generate=5)
    assert "generated_from" in page.html()
    html = tmp_path / "g.html"
    assert (
        main(["explore", "--ckpt", str(RUNS / "gpt"), "--text", "The ca", "--generate", "5", "--out", str(html)]) == 0
    )
    p, errors, _ = _open(browser, html)
    assert "generated" in p.locator("#view-title").inner_text() and not errors
    assert (
        main(["explore", "--ckpt", str(RUNS / "gpt"), "--text", "The ca", "--generate", "99", "--out", str(html)]) == 2
    )
    assert "exceed the model's context" in capsys.readouterr().err


def test_the_explorer_lists_an_saes_active_latents(browser, tmp_path):
    """`explore --sae`: hovering a position shows the SAE's most active latents there, the same
    (latent, activation) pairs as the SAE computes on the cached stream."""
    import torch

    from attnlab.inspect.sae import SAEConfig, SparseAutoencoder

    model = attnlab.load(RUNS / "gpt")
    torch.manual_seed(0)
    sae = SparseAutoencoder(SAEConfig(d_in=model.config.dim, d_sae=64, hook="blocks.0.hook_resid_post"))
    sae.save(tmp_path / "sae")
    html = tmp_path / "page.html"
    text = "The attention"
    argv = ["explore", "--ckpt", str(RUNS / "gpt"), "--text", text, "--sae", str(tmp_path / "sae"), "--out", str(html)]
    assert main(argv) == 0
    _, cache = model.run_with_cache(model.token_ids(text))
    latents = sae.encode(cache["blocks.0.hook_resid_post"][0]).detach()
    page, errors, _ = _open(browser, html)
    box = page.locator("#view").bounding_box()
    page.mouse.move(box["x"] + 100, box["y"] + 5 + 3 * 18 + 9)  # position 3
    assert _status(page)["query"] == "3"
    rows = page.locator("#sae tr")
    shown = [
        (int(r.locator("td").nth(0).inner_text().split()[1]), float(r.locator("td").nth(1).inner_text()))
        for r in rows.all()
    ]
    active = int((latents[3] > 0).sum())
    assert len(shown) == min(8, active) and shown[0][0] == int(latents[3].argmax())
    assert all(abs(float(latents[3, i]) - v) < 2e-3 for i, v in shown)
    assert not errors
