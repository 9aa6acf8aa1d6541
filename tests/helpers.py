"""Helpers shared by the tests."""

import torch

from attnlab.attention import MultiHeadAttention


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
