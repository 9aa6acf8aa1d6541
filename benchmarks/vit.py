"""ViT quality, speed and the lecture's figures.

1. digits (embedded): `attnlab train vit` with its defaults; test accuracy and wall time.
2. MNIST (the 10k test set: train on images 0-7999, test on 8000-9999): ViT and the CNN
   baseline; test accuracy and wall time.
3. Training throughput (images/s): attnlab ViT vs HuggingFace ViTForImageClassification of
   the same shape and batch, measured in the same run.
4. The figures regenerated from the trained MNIST models into docs/figures/: patch-embedding
   PCs, position similarity, mean attention distance, rollout on test images, CKA ViT vs CNN.

    ATTNLAB_DATA=../shared/data python benchmarks/vit.py [--skip-mnist] [--mnist-iters N]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(__file__))
from common import print_table, time_it  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def attnlab(*args: str) -> tuple[float, str]:
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "attnlab", *args], check=True, capture_output=True, text=True)
    return time.perf_counter() - t0, r.stdout + r.stderr


def train_and_eval(name: str, out: Path, *args: str) -> dict:
    wall, log = attnlab("train", *args, "--out", str(out), "--no-progress")
    _, res = attnlab("eval", "--ckpt", str(out), "--json")
    res = json.loads(res.strip().splitlines()[-1])
    print(f"  {name}: accuracy {res['accuracy']:.4f} in {wall:.0f}s", file=sys.stderr, flush=True)
    return {
        "run": name,
        "test accuracy": res["accuracy"],
        "test images": res["images"],
        "wall s (train)": wall,
        "command": "attnlab train " + " ".join(args),
    }


def throughput(batch: int = 128) -> list[dict]:
    import transformers

    from attnlab.models import ViT, ViTConfig
    from attnlab.training.optim import adamw

    rows = []
    for name, kw in (
        (
            "mnist shape 28px p4 64w 6L",
            dict(image_size=28, patch_size=4, in_chans=1, dim=64, layers=6, heads=4, mlp_ratio=2.0),
        ),
        (
            "cifar shape 32px p4 192w 6L",
            dict(image_size=32, patch_size=4, in_chans=3, dim=192, layers=6, heads=3, mlp_ratio=2.0),
        ),
    ):
        cfg = ViTConfig(num_classes=10, **kw)
        ours = ViT(cfg)
        hf = transformers.ViTForImageClassification(
            transformers.ViTConfig(
                image_size=cfg.image_size,
                patch_size=cfg.patch_size,
                num_channels=cfg.in_chans,
                hidden_size=cfg.dim,
                num_hidden_layers=cfg.layers,
                num_attention_heads=cfg.heads,
                intermediate_size=int(cfg.dim * cfg.mlp_ratio),
                num_labels=10,
                hidden_dropout_prob=0.0,
                attention_probs_dropout_prob=0.0,
                attn_implementation="sdpa",
            )
        )
        x = torch.randn(batch, cfg.in_chans, cfg.image_size, cfg.image_size)
        y = torch.randint(0, 10, (batch,))

        def step_fn(model, hf_model: bool):
            opt = adamw(model, 1e-4, 0.05)
            model.train()

            def step():
                logits = model(pixel_values=x).logits if hf_model else model(x)
                F.cross_entropy(logits, y).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            return step

        ta = min(time_it(step_fn(ours, False), repeat=5) for _ in range(2))
        tb = min(time_it(step_fn(hf, True), repeat=5) for _ in range(2))
        rows.append(
            {
                "row": f"train {name} B={batch}",
                "unit": "images/s",
                "attnlab": batch / ta,
                "baseline": batch / tb,
                "baseline is": "HF ViTForImageClassification",
                "ratio": tb / ta,
            }
        )
    return rows


def figures(vit_run: Path, cnn_run: Path, fig_dir: Path) -> None:
    from attnlab.data.images import mnist
    from PIL import Image

    fig_dir.mkdir(parents=True, exist_ok=True)
    for what in ("embeddings", "positions", "distance"):
        attnlab("inspect", what, "--ckpt", str(vit_run), "--out", str(fig_dir / f"mnist_{what}.png"))
    attnlab(
        "inspect",
        "cka",
        "--ckpt",
        str(vit_run),
        "--compare",
        str(cnn_run),
        "--out",
        str(fig_dir / "mnist_cka_vit_vs_cnn.png"),
    )
    attnlab("inspect", "cka", "--ckpt", str(vit_run), "--out", str(fig_dir / "mnist_cka_vit_layers.png"))
    test_x = mnist().test[0]
    for i in (0, 1, 2):
        img = fig_dir / f"mnist_test_{i}.png"
        Image.fromarray((test_x[i, 0].numpy() * 255).astype("uint8"), mode="L").save(img)
        attnlab(
            "inspect",
            "rollout",
            "--ckpt",
            str(vit_run),
            "--image",
            str(img),
            "--out",
            str(fig_dir / f"mnist_rollout_{i}.png"),
        )
        img.unlink()
    for f in fig_dir.glob("*.npz"):
        f.unlink()  # the raw numbers stay out of git; rerun to get them


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--skip-mnist", action="store_true")
    ap.add_argument("--speed-only", action="store_true", help="only the throughput rows")
    ap.add_argument(
        "--seeds",
        type=int,
        default=1,
        help="train the digits default with this many seeds (1337, 1, 2, ...) and add a mean row",
    )
    ap.add_argument(
        "--mnist-iters", type=int, default=None, help="default: the recipe's (attnlab train vit --data mnist)"
    )
    ap.add_argument("--figures", default=str(ROOT / "docs" / "figures"))
    ap.add_argument("--out", default=None, help="folder for the runs (default: a temp folder)")
    args = ap.parse_args()
    if args.speed_only:
        print_table(throughput(), ["row", "unit", "attnlab", "baseline", "baseline is", "ratio"])
        return
    work = Path(args.out or tempfile.mkdtemp(prefix="attnlab-vit-"))
    seeds = [1337, *range(1, args.seeds)]
    rows = [
        train_and_eval(f"digits ViT (defaults, seed {s})", work / f"digits{s}", "vit", "--seed", str(s)) for s in seeds
    ]
    if len(rows) > 1:
        accs = [r["test accuracy"] for r in rows]
        rows.append(
            {
                "run": f"digits ViT, mean of {len(rows)} seeds (min, max)",
                "test accuracy": f"{sum(accs) / len(accs):.4f} ({min(accs):.4f}, {max(accs):.4f})",
                "test images": rows[0]["test images"],
                "wall s (train)": sum(r["wall s (train)"] for r in rows) / len(rows),
            }
        )
    if not args.skip_mnist:
        it = ["--max-iters", str(args.mnist_iters)] if args.mnist_iters else []
        rows.append(train_and_eval("mnist ViT", work / "mnist_vit", "vit", "--data", "mnist", *it))
        rows.append(
            train_and_eval(
                "mnist CNN",
                work / "mnist_cnn",
                "cnn",
                "--data",
                "mnist",
                "--max-iters",
                "1000",
                "--eval-interval",
                "500",
            )
        )
    print()
    print_table(rows, ["run", "test accuracy", "test images", "wall s (train)", "command"])
    print()
    print_table(throughput(), ["row", "unit", "attnlab", "baseline", "baseline is", "ratio"])
    if not args.skip_mnist:
        figures(work / "mnist_vit", work / "mnist_cnn", Path(args.figures))
        print(f"\nfigures in {args.figures}")


if __name__ == "__main__":
    main()
