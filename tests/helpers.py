"""Helpers shared by the tests."""

import torch

from attnlab.attention import MultiHeadAttention

# What a test that judges a training result (an accuracy, a loss, a ranking of two runs) pins:
# left automatic, the device, the dtype (bf16 where the CPU has fast bf16), the thread count (the
# cores other processes leave free) and --compile auto (from the timed first steps) differ from
# machine to machine, and so does every number such a run reaches. Pinned, the run is the same
# computation everywhere, up to the rounding of the CPU's kernels, which the thresholds must absorb.
PINNED_TRAINING = dict(device="cpu", dtype="fp32", threads=1, compile=False)
PINNED_FLAGS = ["--device", "cpu", "--dtype", "fp32", "--threads", "1", "--no-compile"]


def tiny_run_flags(**over) -> list[str]:
    """The flags of the tiny run every family shares (``attnlab.recipes.base.TINY_RUN``: two steps
    of four examples on the CPU, quietly), with the options ``over`` changed: one declaration for
    the tests' quick command-line runs too."""
    from attnlab.recipes.base import TINY_RUN

    flags = []
    for name, value in {**TINY_RUN, **over}.items():
        flag = "--" + name.replace("_", "-")
        flags += [flag if value else f"--no-{flag[2:]}"] if isinstance(value, bool) else [flag, str(value)]
    return flags


def copy_attention(ours: MultiHeadAttention, theirs: torch.nn.MultiheadAttention) -> None:
    """Copy attnlab attention weights into torch.nn.MultiheadAttention (packed in_proj = [W_Q; W_K; W_V])."""
    with torch.no_grad():
        if ours.cross:
            theirs.in_proj_weight.copy_(torch.cat([ours.q_proj.weight, ours.kv_proj.weight]))
            theirs.in_proj_bias.copy_(torch.cat([ours.q_proj.bias, ours.kv_proj.bias]))
        else:
            theirs.in_proj_weight.copy_(ours.qkv.weight)
            theirs.in_proj_bias.copy_(ours.qkv.bias)
        theirs.out_proj.load_state_dict(ours.out_proj.state_dict())


def train_tiny_gpt(main, tmp_path):
    """A GPT run folder made in a second, for commands that must refuse it."""
    corpus = tmp_path / "c.txt"
    corpus.write_text("abc def ghi " * 200)
    run = tmp_path / "gpt"
    assert (
        main(
            [
                "train",
                "gpt",
                "--data",
                str(corpus),
                "--out",
                str(run),
                "--preset",
                "nano",
                "--block-size",
                "8",
                "--max-iters",
                "2",
                "--eval-interval",
                "2",
                "--eval-iters",
                "1",
                "--no-progress",
                "--sample-chars",
                "0",
            ]
        )
        == 0
    )
    return run


def image_png(model) -> bytes:
    """A random PNG of the size and channels ``model`` (an image model) reads, seeded."""
    import io

    import numpy as np
    from PIL import Image

    c = model.config
    pixels = (np.random.default_rng(0).random((c.image_size, c.image_size)) * 255).astype("uint8")
    out = io.BytesIO()
    Image.fromarray(pixels, "L").convert("L" if c.in_chans == 1 else "RGB").save(out, format="PNG")
    return out.getvalue()
