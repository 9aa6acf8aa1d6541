"""Image captioning data: synthetic scenes (embedded, generated from a seed), COCO-format folders
(a captions JSON like ``captions_train2017.json`` beside its images), and ``image<TAB>caption`` files.

Scenes: small RGB images with one to six coloured shapes (three by default), captions from a
small grammar that names each object (size, colour, shape) and their left-to-right relation, three
phrasings per image, and every object's bounding box, so that one can measure where a captioner
looks (the pointing game).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from ..models.configs import MAX_OBJECTS
from . import sources
from .images import IMAGE_SUFFIXES, channel_stats, load_image
from .parallel import Vocab, pad_batch, read_lines

COLORS = {
    "red": (220, 40, 40),
    "green": (40, 190, 60),
    "blue": (50, 80, 230),
    "yellow": (235, 215, 40),
    "white": (235, 235, 235),
}
SHAPES = ("circle", "square", "triangle")
SIZES = {"small": 0.09, "large": 0.16}  # half-width of the shape, as a fraction of the image side


@dataclass
class SceneObject:
    shape: str
    color: str
    size: str
    box: tuple[int, int, int, int]  # x0, y0, x1, y1 in pixels (inclusive-exclusive)

    @property
    def phrase(self) -> str:
        return f"a {self.size} {self.color} {self.shape}"


@dataclass
class Scenes:
    images: Tensor  # (N, 3, H, W) float in [0, 1]
    captions: list[list[str]]  # several phrasings per image
    objects: list[list[SceneObject]]  # left to right


def _draw(img: np.ndarray, obj: SceneObject) -> None:
    x0, y0, x1, y1 = obj.box
    h, w = y1 - y0, x1 - x0
    yy, xx = np.mgrid[0:h, 0:w]
    cy, cx = (h - 1) / 2, (w - 1) / 2
    if obj.shape == "circle":
        mask = (yy - cy) ** 2 + (xx - cx) ** 2 <= (min(h, w) / 2) ** 2
    elif obj.shape == "square":
        mask = np.ones((h, w), dtype=bool)
    else:  # triangle, apex up: the half-width grows linearly from the top row to the bottom one
        mask = np.abs(xx - cx) <= (yy + 1) / h * (w / 2)
    img[y0:y1, x0:x1][mask] = COLORS[obj.color]


def scene_captions(objs: list[SceneObject]) -> list[str]:
    """The phrasings of a scene whose objects are ordered left to right. Every phrasing names the
    objects in that order, so a relation word always agrees with the order of mention."""
    p = [o.phrase for o in objs]
    if len(p) == 1:
        return [p[0], f"there is {p[0]}", f"{p[0]} on its own"]
    if len(p) == 2:
        return [f"{p[0]} to the left of {p[1]}", f"{p[0]} and {p[1]}", f"{p[0]} on the left and {p[1]} on the right"]
    listed = lambda q: " , ".join(q[:-1]) + f" and {q[-1]}"  # noqa: E731 - "a , b and c"
    return [listed(p), f"{p[0]} to the left of {listed(p[1:])}", f"{listed(p)} from left to right"]


def make_scenes(
    n: int,
    seed: int = 0,
    *,
    image_size: int = 64,
    min_objects: int = 1,
    max_objects: int = 3,
    noise: float = 0.03,
    exclude: set | frozenset = frozenset(),
) -> Scenes:
    """``n`` scenes from ``seed`` (the same seed gives the same scenes) of ``min_objects`` to
    ``max_objects`` objects (at most :data:`MAX_OBJECTS`). Objects never overlap, sit in separate
    columns (so "left of" is unambiguous), and no two share colour and shape; a small shape is
    always smaller than a large one, even where the columns are narrow. A scene whose captions (as
    a tuple) are in ``exclude`` is drawn again: held-out scenes never repeat the captions of the
    training scenes."""
    if not 1 <= min_objects <= max_objects <= MAX_OBJECTS:
        raise ValueError(
            f"scenes hold 1 to {MAX_OBJECTS} objects; got min_objects={min_objects}, max_objects={max_objects}"
        )
    least = max(24, 8 * max_objects)  # a column of at least 8 pixels per object: 5 and 7 pixel shapes
    if image_size < least:
        raise ValueError(
            f"scenes of up to {max_objects} objects need images of at least {least}x{least} pixels, got {image_size}"
        )
    rng = random.Random(seed)
    images = np.zeros((n, image_size, image_size, 3), dtype=np.uint8)
    captions, objects = [], []
    tries = 0
    while len(captions) < n:
        tries += 1
        if tries > 100 * n:
            raise DataError(f"could not draw {n} scenes unlike the {len(exclude)} excluded; use more objects per scene")
        i = len(captions)
        k = rng.randint(min_objects, max_objects)
        column = image_size // k  # one column per object keeps them apart
        kinds = rng.sample([(s, c) for s in SHAPES for c in COLORS], k)
        objs = []
        widest = column // 2 - 1  # the largest half-width that keeps an object inside its column
        halves = {name: min(max(3, round(f * image_size)), widest) for name, f in SIZES.items()}
        if halves["small"] >= halves["large"]:  # narrow columns: both sizes clipped alike, told apart by 2 px
            halves["small"] = halves["large"] - 1
        for j, (shape, color) in enumerate(kinds):
            size = rng.choice(list(SIZES))
            half = halves[size]
            cx = rng.randint(j * column + half, (j + 1) * column - half - 1)
            cy = rng.randint(half, image_size - half - 1)
            objs.append(SceneObject(shape, color, size, (cx - half, cy - half, cx + half + 1, cy + half + 1)))
        caps = scene_captions(objs)
        if tuple(caps) in exclude:
            continue
        for o in objs:
            _draw(images[i], o)
        captions.append(caps)
        objects.append(objs)
    x = torch.from_numpy(images).permute(0, 3, 1, 2).float() / 255
    if noise > 0:  # a little pixel noise so that the background is not a constant
        x = (x + noise * torch.randn(x.shape, generator=torch.Generator().manual_seed(seed))).clamp(0, 1)
    return Scenes(x, captions, objects)


# ---- real images ----------------------------------------------------------------------------------
def read_coco(captions_json: Path, image_dir: Path | None = None) -> list[tuple[Path, list[str]]]:
    """(image path, its captions) from a COCO captions JSON (``images`` + ``annotations``)."""
    try:
        d = json.loads(captions_json.read_text(encoding="utf-8"))
        files = {img["id"]: img["file_name"] for img in d["images"]}
        anns = d["annotations"]
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as e:
        raise DataError(
            f"{captions_json} is not a COCO captions JSON ({type(e).__name__}: {e}); it needs "
            "'images' (id, file_name) and 'annotations' (image_id, caption)"
        ) from None
    image_dir = image_dir or captions_json.parent
    caps: dict[int, list[str]] = {}
    for a in anns:
        if a.get("image_id") not in files:
            raise DataError(f"{captions_json}: a caption names image id {a.get('image_id')}, which 'images' lacks")
        caps.setdefault(a["image_id"], []).append(str(a.get("caption", "")))
    items = []
    for image_id, name in sorted(files.items()):
        path = _find_image(image_dir, name)
        if path is None:
            raise DataError(f"{captions_json} names image {name}, which is not in {image_dir} (nor a sub-folder)")
        items.append((path, caps.get(image_id, [])))
    return items


def _find_image(root: Path, name: str) -> Path | None:
    direct = root / name
    if direct.is_file():
        return direct
    return next((p for p in root.rglob(Path(name).name) if p.is_file()), None)


def read_tsv(path: Path) -> list[tuple[Path, list[str]]]:
    """``image_path<TAB>caption`` lines (paths relative to the file); one image may have many lines."""
    caps: dict[Path, list[str]] = {}
    for n, line in enumerate(read_lines(path), 1):  # UTF-8 (or a clear error), gzip allowed
        if not line.strip():
            continue
        if line.count("\t") != 1:
            what = "no tab" if "\t" not in line else f"{line.count(chr(9)) + 1} columns"
            raise DataError(f"{path}:{n} has {what}; each line is image_path<TAB>caption")
        image, caption = line.split("\t")
        p = (path.parent / image.strip()).resolve()
        if not p.is_file():
            raise DataError(f"{path}:{n} names image {image.strip()}, which does not exist")
        caps.setdefault(p, []).append(caption)
    return list(caps.items())


def find_captions(spec: str, data_dir: str | None = None) -> list[tuple[Path, list[str]]]:
    if spec in sources.named("captions"):  # (coco-mini: the data folder, the cache, or downloaded)
        files = sources.resolve(spec, data_dir)
        return read_coco(files[0])
    p = Path(spec).expanduser()
    if p.is_file() and p.suffix == ".json":
        return read_coco(p)
    if p.is_file():
        return read_tsv(p)
    if p.is_dir():
        jsons = sorted(p.glob("captions*.json")) or sorted(p.glob("*.json"))
        if not jsons:
            raise DataError(
                f"{p} holds no captions JSON; give a COCO folder (captions_*.json beside the images), "
                "a .json file or an image<TAB>caption file"
            )
        return read_coco(jsons[0], p)
    raise DataError(
        f"unknown caption data {spec!r}: use scenes, {', '.join(sources.named('captions'))}, a COCO folder or "
        "captions JSON, or an image<TAB>caption file"
    )


# ---- what the trainer reads -------------------------------------------------------------------------
@dataclass
class CaptionData:
    """Images and reference captions per split, the word vocabulary, and (for scenes) the objects."""

    name: str
    vocab: Vocab
    images: dict[str, Tensor]  # split -> (N, 3, H, W) in [0, 1]
    captions: dict[str, list[list[str]]]
    encoded: dict[str, list[list[list[int]]]]
    max_len: int  # the longest caption in tokens (without <bos>/<eos>)
    objects: dict[str, list[list[SceneObject]]] = field(default_factory=dict)
    note: str = ""
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mean, self.std = channel_stats(self.images["train"])

    def batch(self, split: str, batch_size: int, gen: torch.Generator):
        """(images (B, 3, H, W) in [0, 1], tgt_in, tgt_out): one random reference per image."""
        n = len(self.images[split])
        idx = torch.randint(n, (batch_size,), generator=gen).tolist()
        caps = []
        for i in idx:
            refs = self.encoded[split][i]
            caps.append(refs[int(torch.randint(len(refs), (1,), generator=gen))][: self.max_len])
        v = self.vocab
        tgt_in, _ = pad_batch([[v.bos_id] + c for c in caps], v.pad_id)
        tgt_out, _ = pad_batch([c + [v.eos_id] for c in caps], v.pad_id)
        return self.images[split][idx], tgt_in, tgt_out


def split_items(items: list, fractions=(0.8, 0.1), seed: int = 0, name: str = "the data") -> dict[str, list]:
    """Train, validation and test items after a fixed shuffle, each split at least one item and
    no item in two splits (a test image seen in training would score what was memorised)."""
    if len(items) < 3:
        raise DataError(
            f"{name} has {len(items)} image(s); training, validation and test need one each, never shared: "
            "give at least 3"
        )
    order = list(range(len(items)))
    random.Random(seed).shuffle(order)
    n_val = max(1, int(len(items) * fractions[1]))
    n_test = max(1, len(items) - int(len(items) * fractions[0]) - n_val)
    n_train = len(items) - n_val - n_test
    parts = {"train": order[:n_train], "val": order[n_train : n_train + n_val], "test": order[n_train + n_val :]}
    return {k: [items[i] for i in v] for k, v in parts.items()}


def load_captions(
    spec: str | None,
    *,
    image_size: int = 64,
    vocab: dict | None = None,
    n_train: int = 8000,
    max_objects: int = 3,
    seed: int = 0,
) -> CaptionData:
    """``spec``: ``scenes`` (default; generated), a COCO folder or JSON, or an image<TAB>caption file.
    ``vocab`` (from a checkpoint) is reused instead of building one from the training captions."""
    if spec in (None, "", "scenes"):
        # validation and test scenes never repeat a training scene's captions (exact match would
        # reward memorised strings), nor each other's
        sets = {"train": make_scenes(n_train, seed, image_size=image_size, max_objects=max_objects)}
        seen = {tuple(c) for c in sets["train"].captions}
        for split, n, offset in (("val", max(50, n_train // 20), 1), ("test", max(100, n_train // 16), 2)):
            sets[split] = make_scenes(n, seed + offset, image_size=image_size, max_objects=max_objects, exclude=seen)
            seen |= {tuple(c) for c in sets[split].captions}
        images = {k: s.images for k, s in sets.items()}
        captions = {k: s.captions for k, s in sets.items()}
        objects = {k: s.objects for k, s in sets.items()}
        name, note = "scenes", f"scenes: {n_train} train / {len(captions['val'])} val / {len(captions['test'])} test"
    else:
        items = find_captions(spec)
        if not items:
            raise DataError(f"{spec} holds no images")
        splits = split_items(items, name=str(spec))
        images, captions = {}, {}
        converted = set()
        for k, part in splits.items():
            xs = []
            for path, caps in part:
                x, conv = load_image(path, 3, image_size)
                if conv:
                    converted.add(conv.split(";")[0] if "grayscale" in conv or "RGBA" in conv else "resized")
                xs.append(x)
            images[k] = torch.stack(xs)
            captions[k] = [caps for _, caps in part]
        objects = {}
        name = Path(spec).name
        note = (
            f"{name}: {len(images['train'])} train / {len(images['val'])} val / {len(images['test'])} test "
            f"images, resized to {image_size}x{image_size}"
        )
    for k, caps in captions.items():
        for i, refs in enumerate(caps):
            kept = [c for c in refs if c.strip()]
            if not kept:
                raise DataError(
                    f"{name}: an image of the {k} split has only empty captions; give it a caption or leave it out"
                )
            caps[i] = kept
    v = Vocab.from_dict(vocab) if vocab else Vocab.build([c for refs in captions["train"] for c in refs], "word")
    encoded = {k: [[v.encode(c) for c in refs] for refs in caps] for k, caps in captions.items()}
    max_len = max(len(e) for refs in encoded["train"] for e in refs)
    return CaptionData(name, v, images, captions, encoded, max_len, objects, note)


def image_files(paths: list[str]) -> list[Path]:
    """The image files named (folders are expanded to the images in them)."""
    out = []
    for p in map(Path, paths):
        if p.is_dir():
            found = sorted(q for q in p.iterdir() if q.suffix.lower() in IMAGE_SUFFIXES)
            if not found:
                raise DataError(f"folder {p} holds no images ({', '.join(sorted(IMAGE_SUFFIXES))}); give image files")
            out += found
        else:
            out.append(p)
    return out
