import math

import pytest
import torch

from attnlab.inspect import analysis as A
from attnlab.models import CNN, ViT, ViTConfig
from attnlab.models.cnn import CNNConfig


def test_shapes_and_patch_count():
    for pool in ("cls", "mean"):
        m = ViT(ViTConfig(image_size=32, patch_size=4, in_chans=3, num_classes=7, dim=48, depth=2, heads=3, pool=pool))
        x = torch.randn(2, 3, 32, 32)
        assert m(x).shape == (2, 7)
        assert m.tokens(x).shape == (2, 64 + (pool == "cls"), 48)
    with pytest.raises(ValueError, match="not divisible by patch size 5"):
        ViTConfig(image_size=32, patch_size=5)
    with pytest.raises(ValueError, match=r"built for 32x32 images, got 28x28"):
        m(torch.randn(1, 3, 28, 28))
    assert CNN(CNNConfig(in_chans=1, num_classes=10)).forward(torch.randn(2, 1, 28, 28)).shape == (2, 10)


def test_sincos_positions_are_fixed():
    m = ViT(ViTConfig(image_size=8, patch_size=2, in_chans=1, dim=16, depth=1, heads=2, pos="sincos"))
    assert "pos_embed" not in dict(m.named_parameters())
    assert m.pos_embed.shape == (1, 17, 16)


def test_rollout_of_identity_attention_is_identity():
    t = 5
    eye = torch.eye(t).expand(2, 3, t, t)
    r = A.rollout([eye, eye, eye])
    assert torch.allclose(r, torch.eye(t).expand(2, t, t))
    # and a uniform layer mixes: rows still sum to one
    uni = torch.full((1, 2, t, t), 1.0 / t)
    r = A.rollout([uni], discard_ratio=0.0)
    assert torch.allclose(r.sum(-1), torch.ones(1, t))
    assert torch.allclose(r[0], 0.5 * torch.eye(t) + 0.5 / t)


def test_rollout_head_fusion_and_discard_hand_computed():
    h0 = [[0.6, 0.3, 0.1], [0.2, 0.5, 0.3], [0.1, 0.2, 0.7]]
    h1 = [[0.4, 0.4, 0.2], [0.4, 0.3, 0.3], [0.3, 0.3, 0.4]]
    a = torch.tensor([h0, h1])[None]  # (1, 2 heads, 3, 3)

    def residual(m):  # 0.5 A + 0.5 I, rows renormalised
        m = 0.5 * torch.tensor(m) + 0.5 * torch.eye(3)
        return m / m.sum(-1, keepdim=True)

    assert torch.allclose(A.rollout([a], "max")[0], residual([[0.6, 0.4, 0.2], [0.4, 0.5, 0.3], [0.3, 0.3, 0.7]]))
    assert torch.allclose(A.rollout([a], "min")[0], residual([[0.4, 0.3, 0.1], [0.2, 0.3, 0.3], [0.1, 0.2, 0.4]]))
    mean = [[0.5, 0.35, 0.15], [0.3, 0.4, 0.3], [0.2, 0.25, 0.55]]
    # discard 1/3: the 3 smallest of the fused 9 are .15, .2, .25; .2 goes into the class token, so it stays
    expected = torch.tensor([[0.75 / 0.925, 0.175 / 0.925, 0], [0.15, 0.7, 0.15], [0.1 / 0.875, 0, 0.775 / 0.875]])
    assert torch.allclose(A.rollout([a], "mean", discard_ratio=0.34)[0], expected, atol=1e-6)
    # two layers multiply: row i of the result mixes the first layer's rows
    assert torch.allclose(A.rollout([a, a], "mean")[0], residual(mean) @ residual(mean), atol=1e-6)
    with pytest.raises(ValueError, match="head fusion"):
        A.rollout([a], "median")


def test_mean_attention_distance_uniform_closed_form():
    # a 2x2 grid of 4-pixel patches: from any patch the others are 4, 4 and 4*sqrt(2) away
    uniform = torch.full((1, 1, 5, 5), 0.2)
    d = A.mean_attention_distance(uniform, (2, 2), 4, n_prefix=1)
    assert d.item() == pytest.approx((0 + 4 + 4 + 4 * math.sqrt(2)) / 4, rel=1e-5)
    # attention to itself only: distance 0
    eye = torch.eye(5)[None, None]
    assert A.mean_attention_distance(eye, (2, 2), 4).item() == pytest.approx(0.0)


def test_cka_properties():
    torch.manual_seed(0)
    x = torch.randn(200, 30)
    assert A.linear_cka(x, x) == pytest.approx(1.0)
    assert A.rbf_cka(x, x) == pytest.approx(1.0)
    q, _ = torch.linalg.qr(torch.randn(30, 30))
    assert A.linear_cka(x, x @ q) == pytest.approx(1.0, abs=1e-6)  # orthogonal transform
    assert A.linear_cka(x, 3.7 * x) == pytest.approx(1.0, abs=1e-6)  # isotropic scaling
    assert A.rbf_cka(x, 3.7 * x @ q) == pytest.approx(1.0, abs=1e-6)
    m = torch.diag(torch.logspace(-2, 2, 30))  # invertible but not orthogonal
    assert A.linear_cka(x, x @ m) < 0.9
    assert A.linear_cka(x, torch.randn(200, 30)) < 0.3
    # minibatch estimator agrees with the full one
    y = x @ torch.randn(30, 20) + 0.5 * torch.randn(200, 20)
    xb, yb = torch.randn(2000, 30), None
    yb = xb @ torch.randn(30, 20) + torch.randn(2000, 20)
    mb = A.MinibatchCKA(1, 1)
    for i in range(0, 2000, 200):
        mb.update([xb[i : i + 200]], [yb[i : i + 200]])
    assert mb.compute()[0, 0].item() == pytest.approx(A.linear_cka(xb, yb), abs=0.03)
    assert 0 < A.linear_cka(x, y) < 1


def test_embedding_components_and_position_similarity():
    w = torch.randn(64, 3, 4, 4)
    comps, var = A.embedding_components(w, 28)
    assert comps.shape == (28, 3, 4, 4) and torch.all(var[:-1] >= var[1:])
    flat = comps.reshape(28, -1)
    assert torch.allclose(flat @ flat.T, torch.eye(28), atol=1e-4)  # orthonormal basis
    sim = A.position_similarity(torch.randn(16, 8))
    assert torch.allclose(sim.diagonal(), torch.ones(16), atol=1e-6)


def test_position_interpolation_there_and_back_keeps_the_predictions(tmp_path):
    """Resizing the learned position grid 4x4 -> 8x8 -> 4x4 (bicubic both ways) leaves a trained
    model nearly intact: the same predicted class for nearly every test image and probabilities
    within a few percent, where shuffling the same grid's positions changes both far more (the
    control that shows the comparison can fail). Judged against the model's own predictions, not an
    accuracy bar: the accuracy a run reaches moves with the CPU's kernels (0.79-0.83 measured),
    what interpolation keeps does not; the run is pinned (helpers.PINNED_TRAINING) all the same."""
    from attnlab.data.images import digits
    from attnlab.training import TrainConfig, Trainer
    from attnlab.training.tasks import ImageClassificationTask
    from helpers import PINNED_TRAINING

    splits = digits()
    torch.manual_seed(0)
    m = ViT(
        ViTConfig(
            image_size=8, patch_size=2, in_chans=1, num_classes=10, dim=48, depth=2, heads=4, mlp_ratio=2, peg=True
        )
    )
    task = ImageClassificationTask(splits, 64, pad=1)
    cfg = TrainConfig(
        max_iters=600, batch_size=64, lr=3e-3, warmup_iters=20, eval_interval=600, eval_iters=1, progress=False
    )
    Trainer(m, task, TrainConfig(**{**cfg.to_dict(), **PINNED_TRAINING}), tmp_path).fit()
    x, y = splits.test
    x = task.normalize(x)
    m.eval()

    def probabilities():
        with torch.no_grad():
            return m(x).softmax(-1)

    before = probabilities()
    assert (before.argmax(-1) == y).float().mean() > 0.5  # a trained model (chance: 0.1)
    table = m.pos.weight.detach().clone()
    m.resize_pos_embed(16)  # 8x8 grid of patches
    assert m.pos.weight.shape[0] == m.n_prefix + 64
    m.resize_pos_embed(8)  # and back
    moved = (m.pos.weight - table).abs().max()
    assert 0 < moved < 0.1 * table.abs().max()  # bicubic there and back is close to, not exactly, the identity
    after = probabilities()
    assert (after.argmax(-1) == before.argmax(-1)).float().mean() > 0.97  # measured 0.99-1.00
    assert (after - before).abs().max() < 0.15  # measured 0.02-0.03
    with torch.no_grad():  # the control: the same positions, shuffled among the patches
        grid = m.pos.weight[m.n_prefix :]
        grid.copy_(grid[torch.randperm(len(grid), generator=torch.Generator().manual_seed(0))])
    shuffled = probabilities()
    assert (shuffled.argmax(-1) == before.argmax(-1)).float().mean() < 0.9  # measured 0.77
    assert (shuffled - before).abs().max() > 0.5  # measured 0.83-0.87


def test_hf_vit_interop(tmp_path):
    transformers = pytest.importorskip("transformers")
    cfg = transformers.ViTConfig(
        image_size=16,
        patch_size=4,
        num_channels=3,
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=48,
        num_labels=5,
    )
    torch.manual_seed(0)
    hf = transformers.ViTForImageClassification(cfg).eval()
    with torch.no_grad():
        for p in hf.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    hf.save_pretrained(tmp_path / "cls")
    import attnlab

    ours = attnlab.load(tmp_path / "cls")
    x = torch.randn(2, 3, 16, 16)
    with torch.no_grad():
        assert torch.allclose(ours(x), hf(pixel_values=x).logits, atol=1e-4)
    base = transformers.ViTModel(cfg, add_pooling_layer=False).eval()
    base.save_pretrained(tmp_path / "base")
    ours = attnlab.load(tmp_path / "base")
    with torch.no_grad():
        assert torch.allclose(ours(x), base(pixel_values=x).last_hidden_state[:, 0], atol=1e-4)


def test_fine_tuning_a_vit_keeps_its_body_and_replaces_a_head_that_does_not_fit(tmp_path, capsys):
    """train vit --init RUN: the pretrained body carries over; on data with other classes the head is
    new; --freeze trains the head alone (the body's weights stay exactly the pretrained ones)."""
    import numpy as np
    from PIL import Image
    from safetensors.torch import load_file

    from attnlab.cli import main
    from attnlab.data.images import load_images

    pytest.importorskip("sklearn")
    x, y = load_images("digits").train
    for label, name in ((7, "seven"), (9, "nine")):  # a two-class folder dataset of other classes
        folder = tmp_path / "pair" / name
        folder.mkdir(parents=True)
        for i, img in enumerate(x[y == label][:30]):
            Image.fromarray((img[0].numpy() * 255).astype(np.uint8)).save(folder / f"{i}.png")
    common = ["--eval-iters", "1", "--no-progress", "--device", "cpu", "--dtype", "fp32", "--no-compile"]
    small = ["--dim", "16", "--layers", "1", "--heads", "2"]
    pre = tmp_path / "pre"
    assert main(["train", "vit", "--max-iters", "20", "--eval-interval", "20", *small, "--out", str(pre), *common]) == 0
    tuned = tmp_path / "tuned"
    argv = ["train", "vit", "--data", str(tmp_path / "pair"), "--init", str(pre), "--freeze", "--max-iters", "5"]
    assert main([*argv, "--eval-interval", "5", "--out", str(tuned), *common]) == 0
    before, after = (
        load_file(str(pre / "last" / "model.safetensors")),
        load_file(str(tuned / "last" / "model.safetensors")),
    )
    body = [k for k in before if not k.startswith("head.")]
    assert body and all(torch.equal(before[k], after[k]) for k in body)  # frozen: exactly the pretrained body
    assert after["head.weight"].shape == (2, 16) and before["head.weight"].shape == (10, 16)
    resume = ["train", "vit", "--resume", "--max-iters", "8", "--eval-interval", "4", "--out", str(tuned), *common]
    assert main(resume) == 0  # a resumed frozen run stays frozen
    again = load_file(str(tuned / "last" / "model.safetensors"))
    assert all(torch.equal(before[k], again[k]) for k in body) and not torch.equal(
        after["head.weight"], again["head.weight"]
    )
    capsys.readouterr()
    cnn = tmp_path / "cnn"
    assert main(["train", "cnn", "--max-iters", "2", "--eval-interval", "2", "--out", str(cnn), *common]) == 0
    capsys.readouterr()
    for extra, words in (
        (["--freeze"], "--freeze keeps a pretrained body fixed"),
        (["--init", str(pre), "--dim", "32"], "--init fixes the model's shape; drop --dim"),
        (["--init", str(cnn)], "fine-tune it with attnlab train cnn"),
    ):
        assert main(["train", "vit", *extra, "--out", str(tmp_path / "bad"), *common]) == 2
        err = capsys.readouterr().err
        assert words in err and len(err.strip().splitlines()) == 1, err


def test_resnet_blocks_add_their_shortcut_and_train_from_the_command_line(tmp_path):
    """--arch resnet: each basic block is ReLU(F(x) + shortcut(x)); with its last BatchNorm's scale
    at zero F contributes nothing and the block is ReLU(shortcut(x)); the projection shortcut
    appears exactly where the shape changes; and the family trains."""
    from attnlab.cli import main
    from attnlab.models.cnn import BasicBlock

    torch.manual_seed(0)
    block = BasicBlock(4, 4).eval()
    x = torch.randn(2, 4, 8, 8)
    with torch.no_grad():
        block.residual[-1].weight.zero_()
        block.residual[-1].bias.zero_()
        assert torch.allclose(block(x), x.relu())
    down = BasicBlock(4, 8, stride=2).eval()
    assert isinstance(block.shortcut, torch.nn.Identity) and not isinstance(down.shortcut, torch.nn.Identity)
    assert down(x).shape == (2, 8, 4, 4)
    net = CNN(CNNConfig(in_chans=1, num_classes=3, widths=(8, 16), image_size=8, arch="resnet"))
    assert net(torch.randn(2, 1, 8, 8)).shape == (2, 3) and sum(isinstance(m, BasicBlock) for m in net.modules()) == 4
    with pytest.raises(ValueError, match=r"\(--arch\): choose one of plain, resnet"):
        CNNConfig(arch="vgg")
    pytest.importorskip("sklearn")
    out = tmp_path / "res"
    argv = ["train", "cnn", "--arch", "resnet", "--max-iters", "3", "--eval-interval", "3", "--eval-iters", "1"]
    assert main([*argv, "--no-progress", "--device", "cpu", "--dtype", "fp32", "--out", str(out)]) == 0


def test_fine_tuning_from_a_huggingface_vit_folder(tmp_path, capsys):
    """train vit --init HF_DIR: a ViTForImageClassification folder (3 labels) starts a digits
    classifier (10): its body carries over (exactly, with --freeze), the head is new."""
    from safetensors.torch import load_file

    import attnlab
    from attnlab.cli import main

    transformers = pytest.importorskip("transformers")
    pytest.importorskip("sklearn")
    cfg = transformers.ViTConfig(
        image_size=8, patch_size=2, num_channels=1, hidden_size=16, num_hidden_layers=1, num_attention_heads=2,
        intermediate_size=32, num_labels=3,
    )  # fmt: skip
    torch.manual_seed(0)
    transformers.ViTForImageClassification(cfg).save_pretrained(tmp_path / "hf")
    pretrained = attnlab.load(tmp_path / "hf").state_dict()
    out = tmp_path / "tuned"
    common = ["--eval-iters", "1", "--no-progress", "--device", "cpu", "--dtype", "fp32", "--no-compile"]
    argv = ["train", "vit", "--init", str(tmp_path / "hf"), "--freeze", "--max-iters", "3", "--eval-interval", "3"]
    assert main([*argv, "--out", str(out), *common]) == 0
    after = load_file(str(out / "last" / "model.safetensors"))
    body = [k for k in pretrained if not k.startswith("head.")]
    assert body and all(torch.equal(pretrained[k], after[k]) for k in body)
    assert after["head.weight"].shape == (10, 16) and pretrained["head.weight"].shape == (3, 16)
