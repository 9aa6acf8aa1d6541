"""Image captioning: attention over the grid, the regulariser, decoding, data, and the commands."""

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from attnlab.cli import main
from attnlab.data.captions import COLORS, load_captions, make_scenes, read_tsv
from attnlab.generate.beam import beam_search, greedy_decode
from attnlab.errors import DataError
from attnlab.inspect.analysis import pointing_hit
from attnlab.models.caption import CaptionConfig, Captioner, doubly_stochastic_penalty
from helpers import tiny_run_flags

ARCHS = ["rnn", "rnn-attention", "transformer"]
TINY = dict(
    vocab_size=20,
    image_size=32,
    widths=(8, 16, 16),
    patch_size=8,
    enc_layers=1,
    dim=32,
    emb_dim=16,
    attention_dim=16,
    layers=1,
    heads=2,
    mlp_dim=32,
    context=12,
    dropout=0.0,
)
FAST = tiny_run_flags()


def _model(arch, encoder="cnn"):
    torch.manual_seed(0)
    return Captioner(CaptionConfig(**TINY, arch=arch, encoder=encoder)).eval()


def test_the_one_image_vector_keeps_where_things_are_only_when_flattened():
    """The LSTM's start from the grid's mean is the same whatever the order of the grid's cells (what
    is there, not where); from the flattened grid (Show and Tell's vector) it changes with it, and the
    decoder never starts from an image vector where it reads the image only through attention."""
    for vector, same in (("mean", True), ("flatten", False)):
        torch.manual_seed(0)
        m = Captioner(CaptionConfig(**TINY, arch="rnn", image_vector=vector)).eval()
        z = m.encode(torch.randn(2, 3, 32, 32))["z"]  # (B, N, D_z)
        n, d = z.shape[1:]
        assert m.init_h[0].in_features == (d if vector == "mean" else n * d)
        moved = z[:, torch.randperm(n, generator=torch.Generator().manual_seed(0))]  # the same cells, elsewhere
        start, start_moved = m.start({"z": z}, 4)["h"], m.start({"z": moved}, 4)["h"]
        assert torch.allclose(start, start_moved, atol=1e-6) == same
        assert m(torch.randn(2, 3, 32, 32), torch.randint(0, 20, (2, 5))).shape == (2, 5, 20)
    with pytest.raises(ValueError, match="never starts from an image vector"):
        CaptionConfig(**TINY, arch="rnn-attention", image_vector="flatten")
    assert CaptionConfig(**TINY, arch="rnn-attention", init_from_image=True, image_vector="flatten").starts_from_image


@pytest.mark.parametrize("encoder", ["cnn", "vit"])
def test_attention_rows_sum_to_one_over_the_grid(encoder):
    m = _model("rnn-attention", encoder)
    images = torch.randn(3, 3, 32, 32)
    logits, cache = m.run_with_cache(images, torch.randint(4, 20, (3, 5)), names="attn.hook_pattern")
    assert logits.shape == (3, 5, 20)
    a = cache["attn.hook_pattern"][:, 0]  # the decoder's attention, steps joined: (B, 1, T, N) -> (B, T, N)
    h, w = m.grid
    assert a.shape == (3, 5, h * w) and (h, w) == ((8, 8) if encoder == "cnn" else (4, 4))
    torch.testing.assert_close(a.sum(-1), torch.ones(3, 5))
    assert (a >= 0).all()


def test_doubly_stochastic_penalty_by_hand():
    # two steps over three cells; the second image's second step is padding and must not count
    a = torch.tensor([[[0.5, 0.25, 0.25], [0.5, 0.5, 0.0]], [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0]]])
    mask = torch.tensor([[True, True], [True, False]])
    # image 1: column sums 1.0, 0.75, 0.25 -> 0 + 0.0625 + 0.5625 = 0.625
    # image 2: column sums 1, 0, 0 -> 0 + 1 + 1 = 2
    assert doubly_stochastic_penalty(a, mask).item() == pytest.approx((0.625 + 2) / 2)


@pytest.mark.parametrize("arch", ARCHS)
def test_teacher_forcing_equals_step_by_step_decoding(arch):
    m = _model(arch)
    images = torch.randn(2, 3, 32, 32)
    tgt_in = torch.tensor([[1, 5, 6, 7, 8], [1, 9, 4, 4, 10]])
    with torch.no_grad():
        full = m(images, tgt_in).log_softmax(-1)
        state = m.start(m.encode(images), 8)
        steps = []
        for t in range(tgt_in.shape[1]):
            logp, state = m.step(state, tgt_in[:, t])
            steps.append(logp)
    torch.testing.assert_close(torch.stack(steps, 1), full, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("arch", ARCHS)
def test_beam_of_one_is_greedy(arch):
    m = _model(arch)
    images = torch.randn(3, 3, 32, 32)
    greedy = greedy_decode(m, images, None, max_len=10)
    beam = [h[0].tokens for h in beam_search(m, images, None, beam=1, max_len=10, alpha=0.0)]
    assert beam == greedy


def test_transformer_memory_is_the_image_grid():
    m = _model("transformer")
    state = m.encode(torch.randn(2, 3, 32, 32))
    assert state["memory"].shape == (2, 64, 32)  # the 8x8 CNN grid, projected to the decoder width


def test_scenes_are_reproducible_and_boxes_hold_their_objects():
    a, b = make_scenes(20, seed=3, image_size=48), make_scenes(20, seed=3, image_size=48)
    assert torch.equal(a.images, b.images) and a.captions == b.captions
    assert not torch.equal(a.images, make_scenes(20, seed=4, image_size=48).images)
    for img, objs, caps in zip(a.images, a.objects, a.captions):
        assert 1 <= len(objs) <= 3 and len(caps) == 3
        xs = [o.box[0] for o in objs]
        assert xs == sorted(xs)  # left to right, as the captions say
        for o in objs:
            x0, y0, x1, y1 = o.box
            assert 0 <= x0 < x1 <= 48 and 0 <= y0 < y1 <= 48
            centre = img[:, (y0 + y1) // 2 + (y1 - y0) // 4, (x0 + x1) // 2]  # inside every shape (the triangle too)
            assert torch.allclose(centre * 255, torch.tensor(COLORS[o.color], dtype=torch.float32), atol=40)
            assert all(o.color in c and o.shape in c for c in caps)


@pytest.mark.parametrize("objects, size", [(4, 64), (6, 48), (6, 64)])
def test_scenes_of_up_to_six_objects_keep_them_apart_and_their_sizes_apart(objects, size):
    """More objects than three: one column each, so boxes never overlap and run left to right; a
    small shape stays smaller than a large one where the columns clip both; every phrasing names
    every object, left to right, and lists them as "a , b and c"."""
    scenes = make_scenes(60, seed=7, image_size=size, min_objects=objects, max_objects=objects)
    widths = {"small": set(), "large": set()}
    for objs, caps in zip(scenes.objects, scenes.captions):
        assert len(objs) == objects and len({(o.shape, o.color) for o in objs}) == objects
        for left, right in zip(objs, objs[1:]):
            assert left.box[2] <= right.box[0]  # apart, left to right
        for o in objs:
            assert 0 <= o.box[0] and o.box[2] <= size and o.box[2] - o.box[0] >= 5
            widths[o.size].add(o.box[2] - o.box[0])
        phrases = [o.phrase for o in objs]
        for cap in caps:
            at = [cap.index(p) for p in phrases]
            assert at == sorted(at)
        assert caps[0] == " , ".join(phrases[:-1]) + " and " + phrases[-1]
        assert caps[2] == caps[0] + " from left to right"
    assert max(widths["small"]) < min(widths["large"])
    with pytest.raises(ValueError, match="at least 48x48"):
        make_scenes(1, image_size=40, max_objects=6)
    with pytest.raises(ValueError, match="1 to 6 objects"):
        make_scenes(1, max_objects=7)


def test_pointing_hit_by_hand():
    att = torch.zeros(4, 4)
    att[1, 2] = 1.0  # the cell covering x 16..24, y 8..16 of a 32-pixel image
    assert pointing_hit(att, (18, 10, 22, 14), 32)
    assert not pointing_hit(att, (0, 0, 8, 8), 32)
    assert pointing_hit(att, (23, 15, 30, 30), 32)  # overlaps the cell's corner


def test_pointing_game_scores_the_words_that_name_each_object():
    from attnlab.data.captions import SceneObject
    from attnlab.data.parallel import Vocab
    from attnlab.recipes.caption import object_words

    def pointing(ids, att):
        hits = {"size": [], "colour": [], "shape": []}
        for kind, step, obj in object_words(vocab, ids, objects):
            hits[kind].append(pointing_hit(att[step], obj.box, 32))
        return hits

    objects = [
        SceneObject("circle", "red", "small", (0, 0, 10, 10)),
        SceneObject("square", "blue", "large", (20, 20, 32, 32)),
    ]
    caption = "a small red circle to the left of a large blue square"
    vocab = Vocab.build([caption], "word")
    ids = vocab.encode(caption)
    att = torch.zeros(len(ids), 4, 4)
    att[:, 3, 3] = 1.0  # every step looks at the bottom-right cell (the blue square) ...
    att[2, 0, 0] = 2.0  # ... except "red", which looks at the top-left one (the red circle)
    got = pointing(ids, att)
    assert got == {"size": [False, True], "colour": [True, True], "shape": [False, True]}
    # a caption naming an object the scene lacks scores nothing for it
    other = vocab.encode("a small blue circle")
    assert pointing(other, att) == {"size": [], "colour": [], "shape": []}


def _write_images(folder: Path) -> None:
    folder.mkdir()
    Image.fromarray(np.full((20, 30), 128, np.uint8), "L").save(folder / "grey.png")
    Image.fromarray(np.zeros((40, 40, 4), np.uint8), "RGBA").save(folder / "rgba.png")
    Image.fromarray(np.zeros((50, 20, 3), np.uint8)).save(folder / "tall.jpg")


def test_tsv_captions_convert_images_and_refuse_bad_lines(tmp_path):
    _write_images(tmp_path / "img")
    tsv = tmp_path / "caps.tsv"
    tsv.write_text(
        "img/grey.png\ta grey picture\nimg/rgba.png\ta clear one\nimg/tall.jpg\ta tall one\n"
        "img/grey.png\tanother grey picture\n"
    )
    data = load_captions(str(tsv), image_size=16)
    assert sum(len(x) for x in data.images.values()) >= 3
    assert all(x.shape[1:] == (3, 16, 16) for x in data.images.values())  # grey and RGBA to RGB, any size resized
    assert len(read_tsv(tsv)) == 3
    (tmp_path / "bad.tsv").write_text("img/missing.png\ta caption\n")
    with pytest.raises(DataError, match="missing.png"):
        read_tsv(tmp_path / "bad.tsv")
    (tmp_path / "empty.tsv").write_text("img/grey.png\t  \nimg/rgba.png\ta\nimg/tall.jpg\tb\n")
    with pytest.raises(DataError, match="empty captions"):
        load_captions(str(tmp_path / "empty.tsv"), image_size=16)


def test_coco_mini_set_loads():
    root = Path(os.environ.get("ATTNLAB_DATA", "../shared/data")) / "coco_captions_mini"
    if not root.is_dir():
        pytest.skip("coco_captions_mini not found (set ATTNLAB_DATA)")
    data = load_captions(str(root), image_size=32)
    n = sum(len(x) for x in data.images.values())
    assert n == 25 and sum(len(c) for c in data.captions["train"]) == 5 * len(data.images["train"])
    assert data.vocab.size > 100 and data.images["train"].shape[1:] == (3, 32, 32)


@pytest.fixture(scope="module")
def caption_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("cap") / "run"
    assert (
        main(
            [
                "train",
                "caption",
                "--out",
                str(out),
                "--train-scenes",
                "40",
                "--image-size",
                "32",
                "--dim",
                "32",
                "--emb-dim",
                "16",
                "--attention-dim",
                "16",
                *FAST,
            ]
        )
        == 0
    )
    return out


def test_caption_commands_end_to_end(caption_run, tmp_path, capsys):
    img = tmp_path / "scene.png"
    x = make_scenes(1, seed=9, image_size=32).images[0]
    Image.fromarray((x.permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(img)
    capsys.readouterr()
    assert main(["caption", "--ckpt", str(caption_run), str(img), "--beam", "2", "--device", "cpu"]) == 0
    assert capsys.readouterr().out.startswith(f"{img}: ")
    assert main(["eval", "--ckpt", str(caption_run), "--json", "--device", "cpu"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert len(res["bleu"]) == 4 and 0 <= res["bleu"][3] <= 100 and "nrefs" in res["bleu_signature"]
    assert res["pointing"] is None or 0 <= res["pointing"] <= 1
    if res["pointing"] is not None:  # the random-object control: 1 / (objects in the scene), between 1/3 and 1
        assert all(1 / 3 - 1e-9 <= v <= 1 for v in res["pointing_random_object_by_word"].values())
        # per word, the leads over the random-object pointer: their means are the rates' differences
        for kind, leads in res["pointing_leads_by_word"].items():
            lead = res["pointing_by_word"][kind] - res["pointing_random_object_by_word"][kind]
            assert np.mean(leads["attention"]) == pytest.approx(lead)
            chance = res["pointing_chance_by_word"][kind] - res["pointing_random_object_by_word"][kind]
            assert np.mean(leads["random_cell"]) == pytest.approx(chance)
            assert len(leads["shuffled"]) == len(leads["attention"])  # (the null: another word's map, same words)
    assert set(res["by_objects"]) <= {"1", "2", "3"}
    for by in res["by_objects"].values():  # (sentence BLEU per scene: the claims' intervals over test scenes)
        assert len(by["sentence_bleu4"]) == by["images"] and all(0 <= v <= 100 for v in by["sentence_bleu4"])
        named = by["objects_named"]  # (per scene, the share of its objects its caption names whole)
        assert len(named) == by["images"] and all(0 <= v <= 1 for v in named)
        assert by["exact"] <= np.mean([v == 1 for v in named]) + 1e-9  # an exact caption names every object
    png = tmp_path / "grid.png"
    assert main(["inspect", "caption", "--ckpt", str(caption_run), "--image", str(img), "--out", str(png)]) == 0
    raw = np.load(png.with_suffix(".npz"))
    assert raw["attention"].shape == (len(raw["words"]), 8, 8) and png.stat().st_size > 1000
    np.testing.assert_allclose(raw["attention"].sum((1, 2)), 1.0, atol=1e-5)


def test_caption_refuses_other_checkpoints_and_bad_images(caption_run, tmp_path, capsys):
    from helpers import train_tiny_gpt

    gpt = train_tiny_gpt(main, tmp_path)
    capsys.readouterr()
    assert main(["caption", "--ckpt", str(gpt), "x.png"]) == 2
    assert "needs a captioner" in capsys.readouterr().err
    (tmp_path / "not.png").write_text("hello")
    assert main(["caption", "--ckpt", str(caption_run), str(tmp_path / "not.png")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "not.png" in err and len(err.strip().splitlines()) == 1
    assert main(["inspect", "rollout", "--ckpt", str(caption_run), "--image", "x.png", "--out", "y.png"]) == 2
    assert "needs a vit checkpoint" in capsys.readouterr().err


def test_caption_attributions_are_complete_and_drawn_per_word(caption_run, tmp_path, capsys):
    """Each word's pixel attributions sum to its logit minus the logit on a zero image (integrated
    gradients, within 1 %); gradient x input equals the gradient taken by hand; `attnlab inspect
    attribution` writes those maps, one per generated word."""
    pytest.importorskip("captum")
    import attnlab
    from attnlab.data.images import normalize
    from attnlab.inspect.attribution import caption_attributions
    from attnlab.recipes.caption import caption_ids

    model = attnlab.load(caption_run)
    img = make_scenes(1, seed=9, image_size=32).images
    x = normalize(img, model.mean, model.std)
    caption = [5, 7, 9]
    tgt_in = torch.tensor([[model.config.bos_id, *caption]])
    res = caption_attributions(model, x, caption, steps=64)
    with torch.no_grad():
        gap = (
            model(x, tgt_in)[0, torch.arange(3), caption]
            - model(torch.zeros_like(x), tgt_in)[0, torch.arange(3), caption]
        )
    assert res["pixels"].shape == (3, 32, 32)
    assert torch.allclose(res["pixels"].sum((1, 2)), gap, rtol=0.01, atol=1e-3), (res["pixels"].sum((1, 2)), gap)
    gxi = caption_attributions(model, x, caption, positions=[1], method="gradient_x_input")["pixels"]
    xg = x.clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(model(xg, tgt_in)[0, 1, 7], xg)
    assert torch.allclose(gxi[0], (grad * x)[0].sum(0), atol=1e-6)
    with pytest.raises(ValueError, match="positions must lie in 0..2"):
        caption_attributions(model, x, caption, positions=[3])

    png = tmp_path / "scene.png"
    Image.fromarray((img[0].permute(1, 2, 0).numpy() * 255).astype(np.uint8)).save(png)
    out = tmp_path / "attr.png"
    argv = ["inspect", "attribution", "--ckpt", str(caption_run), "--image", str(png), "--out", str(out)]
    assert main([*argv, "--method", "gradient_x_input"]) == 0
    raw = np.load(out.with_suffix(".npz"))
    ids = caption_ids(model, img, model.run_meta)[0]
    assert list(raw["words"]) == [model.vocab.tokenizer.id_to_token(i) for i in ids]
    from attnlab.data.images import load_image

    x8 = normalize(load_image(png, 3, 32)[0][None], model.mean, model.std)  # the image as the command read it
    want = caption_attributions(model, x8, ids, method="gradient_x_input")["pixels"]
    np.testing.assert_allclose(raw["attribution"], want.numpy(), atol=1e-5)
    verb = model.attribute(png, method="gradient_x_input")  # the same from the loaded model
    assert [w for w, _ in verb] == list(raw["words"])
    np.testing.assert_allclose(np.stack([m.numpy() for _, m in verb]), raw["attribution"], atol=1e-5)


def test_pointing_chance_is_the_share_of_cells_a_box_touches():
    import torch

    from attnlab.inspect.analysis import pointing_chance, pointing_hit

    assert pointing_chance((4, 4), (0, 0, 4, 4), 8) == 0.25  # 2 × 2 of 16 cells (2 px each)
    assert pointing_chance((4, 4), (1, 1, 3, 3), 8) == 0.25  # a box across cell borders touches 4 cells
    assert pointing_chance((4, 4), (0, 0, 8, 8), 8) == 1.0
    # it is pointing_hit's rate over every possible arg-max cell
    box = (3, 1, 7, 2)
    hits = [pointing_hit(torch.eye(16)[i].reshape(4, 4), box, 8) for i in range(16)]
    assert pointing_chance((4, 4), box, 8) == sum(hits) / 16
