"""The attention explorer: how long pages take to open, and the README's screenshots.

    python benchmarks/explorer.py [--gpt RUN] [--vit RUN] [--seq2seq RUN] [--shots docs/figures]

Long inputs: a GPT with 1,024 tokens and a ViT with 1,024 patches (random weights: the page's
cost does not depend on training), written by `attnlab.inspect.explorer.write_page`, opened in
headless Chromium (system binary, network blocked); the time is until the page says it is ready
(`window.explorerReady`), and then the time one hover takes to redraw. With run folders given,
screenshots of the three views are saved too.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table  # noqa: E402

import torch  # noqa: E402

from attnlab.inspect.explorer import image_attention, text_attention, write_page  # noqa: E402

FIGURES = Path(__file__).resolve().parents[1] / "docs" / "figures"


class _Chars:
    """A character tokenizer over a fixed alphabet, enough to feed a random-weights GPT."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))

    def encode(self, s):
        return [self.chars.index(c) for c in s]

    def decode(self, ids):
        return "".join(self.chars[i] for i in ids)


def long_pages(root: Path) -> dict[str, Path]:
    from attnlab.models import GPT, GPTConfig, ViT, ViTConfig

    torch.manual_seed(0)
    text = ("to be or not to be that is the question " * 30)[:1024]
    tok = _Chars(text)
    gpt = GPT(GPTConfig(vocab_size=len(tok.chars), context=1024, layers=4, heads=4, dim=64)).eval()
    vit = ViT(ViTConfig(image_size=128, patch_size=4, in_chans=3, num_classes=10, dim=64, layers=4, heads=4)).eval()
    image = torch.rand(3, 128, 128)
    return {
        "GPT, 1,024 tokens, 4 layers × 4 heads": write_page(text_attention(gpt, tok, text), root / "gpt.html", "long"),
        "ViT, 1,024 patches, 4 layers × 4 heads": write_page(
            image_attention(vit, image, [0.5] * 3, [0.5] * 3), root / "vit.html", "long"
        ),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--gpt", default=None, help="a GPT run folder for the text screenshot")
    ap.add_argument("--vit", default=None, help="a ViT run folder for the image screenshot")
    ap.add_argument("--image", default=None, help="the image to show the ViT")
    ap.add_argument("--seq2seq", default=None, help="a seq2seq run folder for the cross-attention screenshot")
    ap.add_argument("--src", default="Ein Mann fährt Fahrrad.")
    ap.add_argument("--shots", default=str(FIGURES))
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    root = Path(tempfile.mkdtemp(prefix="attnlab-explorer-"))
    rows = []
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=os.environ.get("ATTNLAB_CHROMIUM") or shutil.which("chromium"), args=["--no-sandbox"]
        )
        for name, html in long_pages(root).items():
            page = browser.new_page(viewport={"width": 1400, "height": 900})
            page.route("**/*", lambda r: r.continue_() if r.request.url.startswith(("file:", "data:")) else r.abort())
            t0 = time.perf_counter()
            page.goto(html.as_uri())
            page.wait_for_function("window.explorerReady === true")
            ready = time.perf_counter() - t0
            box = page.locator("#view").bounding_box()
            t0 = time.perf_counter()
            page.mouse.click(box["x"] + 100, box["y"] + 200) if "ViT" in name else page.mouse.move(
                box["x"] + 100, box["y"] + 200
            )
            page.wait_for_function("document.getElementById('status').dataset.top !== ''")
            hover = time.perf_counter() - t0
            rows.append({"page": name, "file MB": html.stat().st_size / 1e6, "open s": ready, "first hover s": hover})
            page.close()
        shots = Path(args.shots)
        views = []
        if args.gpt:
            views.append(("explorer_text.png", args.gpt, {"text": "ROMEO:\nWhat light through yonder window"}, "text"))
        if args.vit and args.image:
            views.append(("explorer_image.png", args.vit, {"image": args.image}, "image"))
        if args.seq2seq:
            views.append(("explorer_cross.png", args.seq2seq, {"src": args.src}, "cross"))
        import attnlab

        for fname, run, inputs, kind in views:
            html = root / (kind + ".html")
            attnlab.explore(run, **inputs).save(html)
            page = browser.new_page(viewport={"width": 1300, "height": 760})
            page.goto(html.as_uri())
            page.wait_for_function("window.explorerReady === true")
            box = page.locator("#view").bounding_box()
            if kind == "text":
                page.select_option("#layer", str(page.locator("#layer option").count() - 1))
                page.mouse.move(box["x"] + 100, box["y"] + 5 + 12 * 18 + 9)
            elif kind == "image":
                page.select_option("#fusion", "mean")
            else:
                page.select_option("#layer", str(page.locator("#layer option").count() - 1))
                page.select_option("#head", "avg")
                page.mouse.move(box["x"] + 60, box["y"] + 90 + 2 * 22 + 11)
            page.screenshot(path=str(shots / fname))
            page.close()
        browser.close()
    print_table(rows, list(rows[0]))


if __name__ == "__main__":
    main()
