"""Image classification data: embedded digits, MNIST (IDX), CIFAR-10 (python batches), and
any folder laid out one sub-folder per class. All splits are float tensors (N, C, H, W) in
[0, 1] plus integer labels; normalisation statistics come from the training split."""

from __future__ import annotations

import gzip
import io
import pickle
import tarfile
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..errors import DataError
from . import sources

IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".webp", ".tif", ".tiff"}


@dataclass
class ImageSplits:
    name: str
    train: tuple[Tensor, Tensor]
    val: tuple[Tensor, Tensor]
    test: tuple[Tensor, Tensor]
    labels: list[str]
    note: str = ""
    mean: list[float] = field(default_factory=list)
    std: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.mean, self.std = channel_stats(self.train[0])

    @property
    def shape(self) -> tuple[int, int, int]:
        return tuple(self.train[0].shape[1:])


def channel_stats(images: Tensor) -> tuple[list[float], list[float]]:
    """Per-channel mean and std of (N, C, H, W) images (std at least 1e-3: a constant channel
    must not divide by zero), the statistics ``normalize`` uses."""
    return images.mean(dim=(0, 2, 3)).tolist(), images.std(dim=(0, 2, 3)).clamp_min(1e-3).tolist()


def normalize(images: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """Images (B, C, H, W) in [0, 1] -> (x - mean_c) / std_c per channel."""
    c = images.shape[1]
    mean_t = torch.tensor(mean, device=images.device).view(1, c, 1, 1)
    return (images - mean_t) / torch.tensor(std, device=images.device).view(1, c, 1, 1)


def denormalize(x: Tensor, mean: list[float], std: list[float]) -> Tensor:
    """The inverse of :func:`normalize`: back to [0, 1] images."""
    c = x.shape[1]
    return x * torch.tensor(std, device=x.device).view(1, c, 1, 1) + torch.tensor(mean, device=x.device).view(
        1, c, 1, 1
    )


def _split(x: Tensor, y: Tensor, fractions: tuple[float, float], seed: int = 0):
    """Shuffle once (fixed seed) and cut into train / val / test."""
    g = torch.Generator().manual_seed(seed)
    perm = torch.randperm(len(x), generator=g)
    x, y = x[perm], y[perm]
    n_val, n_test = int(len(x) * fractions[0]), int(len(x) * fractions[1])
    n_train = len(x) - n_val - n_test
    return (
        (x[:n_train], y[:n_train]),
        (x[n_train : n_train + n_val], y[n_train : n_train + n_val]),
        (x[n_train + n_val :], y[n_train + n_val :]),
    )


def digits() -> ImageSplits:
    """scikit-learn's 1,797 8×8 handwritten digits (ship with scikit-learn, no download):
    shuffled, 70% train / 10% validation / 20% test."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("the digits dataset needs scikit-learn: pip install 'attnlab[vision]'") from None
    d = load_digits()
    x = torch.tensor(d.images, dtype=torch.float32)[:, None] / 16.0
    y = torch.tensor(d.target, dtype=torch.long)
    tr, va, te = _split(x, y, (0.1, 0.2))
    return ImageSplits(
        "digits",
        tr,
        va,
        te,
        [str(i) for i in range(10)],
        note=f"sklearn digits: {len(tr[0])} train / {len(va[0])} val / {len(te[0])} test",
    )


def two_dots(
    size: int = 24, near: bool = False, counts=(4096, 512, 1024), margin: int = 4, far: int = 5, seed: int = 0
) -> ImageSplits:
    """A relation between two distant parts of an image: a red dot (channel 0) and a green one
    (channel 1) on a black ``size``×``size`` image; the label says whether the red dot is left of
    the green one. ``near=False``: their columns are at least ``far`` pixels apart, farther than a
    5×5 receptive field reaches; ``near=True``: both lie within one 3×3 neighbourhood (at most 2
    pixels apart in each direction), where a small convolution sees both at once. Dots keep
    ``margin`` pixels from the border, where zero padding would tell a convolution where it is.
    ``counts``: train, validation and test images; ``seed`` draws them."""
    if size < 2 * margin + far + 1:
        raise ValueError(f"a {size}-pixel image has no room for two dots {far} columns apart, {margin} from the border")
    g = torch.Generator().manual_seed(seed)

    def draw(count: int) -> tuple[Tensor, Tensor]:
        kept, n = [], 0
        while n < count:  # rejection: draw positions anywhere inside the margin, keep the pairs that qualify
            rc = torch.randint(margin, size - margin, (4 * count, 4), generator=g)  # (row, col) red, (row, col) green
            dr, dc = (rc[:, 0] - rc[:, 2]).abs(), (rc[:, 1] - rc[:, 3]).abs()
            ok = (dc > 0) & ((torch.maximum(dr, dc) <= 2) if near else (dc >= far))
            kept.append(rc[ok])
            n += int(ok.sum())
        rc = torch.cat(kept)[:count]
        x, i = torch.zeros(count, 2, size, size), torch.arange(count)
        x[i, 0, rc[:, 0], rc[:, 1]] = 1.0
        x[i, 1, rc[:, 2], rc[:, 3]] = 1.0
        return x, (rc[:, 1] < rc[:, 3]).long()

    splits = [draw(c) for c in counts]
    how = "within 2 pixels of each other" if near else f"at least {far} columns apart"
    return ImageSplits(
        f"two-dots-{'near' if near else 'far'}",
        *splits,
        ["red right of green", "red left of green"],
        note=f"two dots {how} on {size}×{size} images",
    )


def read_idx(path: Path) -> np.ndarray:
    """An IDX file (MNIST format), gzipped or not."""
    try:
        raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
    except (OSError, EOFError) as e:
        raise DataError(f"{path} is not a readable (gzipped) IDX file: {e}") from None
    if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] != 0x08:
        raise DataError(f"{path} is not an IDX file of unsigned bytes (bad magic number)")
    ndim = raw[3]
    dims = [int.from_bytes(raw[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim)]
    data = np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim)
    if data.size != int(np.prod(dims)):
        raise DataError(f"{path} is truncated: expected {int(np.prod(dims))} values, found {data.size}")
    return data.reshape(dims)


def _find(root: Path, *names: str) -> Path | None:
    for n in names:
        for cand in (root / n, root / (n + ".gz")):
            if cand.is_file():
                return cand
    return None


def mnist(data_dir: str | None = None) -> ImageSplits:
    """MNIST from IDX files in <data dir>/mnist. With only the 10,000-image test set present,
    train on its first 8,000 (the last 800 of those for validation) and test on the last 2,000."""
    root = _mnist_root(data_dir)
    tx, ty = _find(root, "t10k-images-idx3-ubyte"), _find(root, "t10k-labels-idx1-ubyte")
    trx, tr_y = _find(root, "train-images-idx3-ubyte"), _find(root, "train-labels-idx1-ubyte")
    if tx is None or ty is None:
        raise DataError(f"MNIST test files (t10k-images-idx3-ubyte[.gz]) not found in {root}")
    xt = torch.from_numpy(read_idx(tx).copy()).float()[:, None] / 255.0
    yt = torch.from_numpy(read_idx(ty).astype(np.int64))
    labels = [str(i) for i in range(10)]
    if trx is not None and tr_y is not None:
        x = torch.from_numpy(read_idx(trx).copy()).float()[:, None] / 255.0
        y = torch.from_numpy(read_idx(tr_y).astype(np.int64))
        return ImageSplits(
            "mnist",
            (x[:-5000], y[:-5000]),
            (x[-5000:], y[-5000:]),
            (xt, yt),
            labels,
            note="MNIST: 55,000 train / 5,000 val / 10,000 test",
        )
    return ImageSplits(
        "mnist",
        (xt[:7200], yt[:7200]),
        (xt[7200:8000], yt[7200:8000]),
        (xt[8000:], yt[8000:]),
        labels,
        note="MNIST test set only: train on images 0-7199, validate on 7200-7999, test on the last 2,000 (8000-9999)",
    )


def _mnist_root(data_dir) -> Path:
    d = sources.data_dir(data_dir)
    if d is not None and (d / "mnist").is_dir():
        return d / "mnist"
    paths = sources.resolve("mnist", data_dir)
    return paths[0].parent


class _NumpyOnlyUnpickler(pickle.Unpickler):
    """CIFAR-10's python batches are pickles; allow only what numpy arrays need."""

    ALLOWED = {
        ("numpy.core.multiarray", "_reconstruct"),
        ("numpy._core.multiarray", "_reconstruct"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
    }

    def find_class(self, module, name):
        if (module, name) in self.ALLOWED:
            return super().find_class(module, name)
        raise DataError(f"refusing to unpickle {module}.{name}: not a CIFAR-10 batch file")


def _read_cifar_batch(data: bytes) -> tuple[np.ndarray, np.ndarray]:
    d = _NumpyOnlyUnpickler(io.BytesIO(data), encoding="bytes").load()
    x = np.asarray(d[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32)
    return x, np.asarray(d[b"labels"], dtype=np.int64)


def cifar10(data_dir: str | None = None) -> ImageSplits:
    """CIFAR-10 python batches (<data dir>/cifar-10-batches-py or the tar.gz): 45,000 train /
    5,000 val (the end of data_batch_5) / 10,000 test."""
    d = sources.data_dir(data_dir)
    folder = d / "cifar-10-batches-py" if d is not None else None
    if folder is not None and folder.is_dir():
        read = lambda n: (folder / n).read_bytes()  # noqa: E731
    else:
        tar = tarfile.open(sources.resolve("cifar10", data_dir)[0])
        read = lambda n: tar.extractfile(f"cifar-10-batches-py/{n}").read()  # noqa: E731
    parts = [_read_cifar_batch(read(f"data_batch_{i}")) for i in range(1, 6)]
    x = torch.from_numpy(np.concatenate([p[0] for p in parts])).float() / 255.0
    y = torch.from_numpy(np.concatenate([p[1] for p in parts]))
    xt, yt = _read_cifar_batch(read("test_batch"))
    labels = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]
    return ImageSplits(
        "cifar10",
        (x[:45000], y[:45000]),
        (x[45000:], y[45000:]),
        (torch.from_numpy(xt).float() / 255.0, torch.from_numpy(yt)),
        labels,
        note="CIFAR-10: 45,000 train / 5,000 val / 10,000 test",
    )


def load_image(path: str | Path, channels: int, size: int | None = None) -> tuple[Tensor, str | None]:
    """One image as (C, H, W) in [0, 1]; returns (tensor, a note when it was converted)."""
    from PIL import Image, UnidentifiedImageError

    path = Path(path)
    if path.is_dir():
        raise DataError(f"{path} is a folder, not an image; give an image file (PNG, JPEG, ...)")
    if not path.is_file():
        raise DataError(f"image {path} does not exist")
    import warnings

    note = None
    try:
        with warnings.catch_warnings(record=True) as caught:  # PIL's two-line warning becomes one note
            warnings.simplefilter("always", Image.DecompressionBombWarning)
            img = Image.open(path)
            img.load()
    except Image.DecompressionBombError:
        raise DataError(
            f"{path} is larger than PIL's safety limit of {2 * Image.MAX_IMAGE_PIXELS:,} pixels (a possible "
            "decompression bomb); scale it down first"
        ) from None
    except (UnidentifiedImageError, OSError) as e:
        raise DataError(f"{path} is not an image file PIL can read ({type(e).__name__}); give a PNG or JPEG") from None
    if any(issubclass(w.category, Image.DecompressionBombWarning) for w in caught):
        w, h = img.size
        note = f"{path.name} is very large ({w}x{h} = {w * h:,} pixels)"
    return fit_image(img, channels, size, path.name, note)


def fit_image(img, channels: int, size: int | None, name: str, note: str | None = None) -> tuple[Tensor, str | None]:
    """A PIL image as (C, H, W) in [0, 1] with ``channels`` channels, resized to ``size``; returns
    (tensor, a note of the conversions made, or None)."""
    from PIL import Image

    mode = "L" if channels == 1 else "RGB"
    if img.mode != mode:
        if mode == "RGB" and img.mode in ("L", "LA", "1", "I", "I;16"):
            note = (
                note + "; " if note else ""
            ) + f"{name} is grayscale; converted to RGB for this {channels}-channel model"
        elif mode == "L" and img.mode not in ("L", "1", "I", "I;16"):
            note = (
                note + "; " if note else ""
            ) + f"{name} is {img.mode}; converted to grayscale for this 1-channel model"
        img = img.convert(mode)
    if size is not None and img.size != (size, size):
        note = (note + "; " if note else "") + f"resized {img.size[0]}x{img.size[1]} to {size}x{size}"
        img = img.resize((size, size), Image.BILINEAR)
    arr = np.asarray(img, dtype=np.float32) / 255.0
    x = torch.from_numpy(arr)
    return (x[None] if x.dim() == 2 else x.permute(2, 0, 1)).contiguous(), note


def image_folder(root: str | Path, size: int | None = None) -> ImageSplits:
    """root/<class name>/<image files>: 70 / 10 / 20 split after a fixed shuffle."""
    root = Path(root)
    classes = sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(classes) < 2:
        raise DataError(
            f"{root} has {len(classes)} class folder(s); image classification needs at least 2 "
            "(one sub-folder per class)"
        )
    files = [(f, i) for i, c in enumerate(classes) for f in sorted(c.rglob("*")) if f.suffix.lower() in IMAGE_SUFFIXES]
    if not files:
        raise DataError(f"no images ({', '.join(sorted(IMAGE_SUFFIXES))}) found under {root}")
    from PIL import Image

    with Image.open(files[0][0]) as first:
        channels = 1 if first.mode in ("L", "1") else 3
        size = size or min(first.size)
    xs = [load_image(f, channels, size)[0] for f, _ in files]
    x, y = torch.stack(xs), torch.tensor([i for _, i in files])
    tr, va, te = _split(x, y, (0.1, 0.2))
    return ImageSplits(
        root.name,
        tr,
        va,
        te,
        [c.name for c in classes],
        note=f"{root}: {len(classes)} classes, {len(files)} images, {size}x{size}",
    )


def hf_images(spec: str) -> ImageSplits:
    """A HuggingFace image classification dataset (``hf:NAME...``), its images at the first one's
    size and channels, split 70 / 10 / 20 after a fixed shuffle as image folders are."""
    from . import hf

    name, images, labels, classes = hf.labelled_images(spec)
    if len(classes) < 2:
        raise DataError(f"{name} has {len(classes)} class; image classification needs at least 2")
    first = images[0]
    channels = 1 if getattr(first, "mode", "RGB") in ("L", "1", "I", "I;16") else 3
    size = min(first.size)
    index = {c: i for i, c in enumerate(classes)}
    x = torch.stack([fit_image(img, channels, size, name)[0] for img in images])
    y = torch.tensor([index[lab] for lab in labels])
    tr, va, te = _split(x, y, (0.1, 0.2))
    return ImageSplits(
        name, tr, va, te, classes, note=f"{name}: {len(classes)} classes, {len(x)} images, {size}x{size}"
    )


def load_images(spec: str | None, data_dir: str | None = None) -> ImageSplits:
    if spec in (None, "", "digits"):
        return digits()
    if spec == "mnist":
        return mnist(data_dir)
    if spec == "cifar10":
        return cifar10(data_dir)
    from . import hf

    if hf.is_hf(spec):
        return hf_images(spec)
    p = Path(spec).expanduser()
    if p.is_dir():
        return image_folder(p)
    raise DataError(
        f"unknown image dataset {spec!r}; use digits, mnist, cifar10 or a folder with one sub-folder per class"
    )


# how far outside [0, 1] a tensor image may reach: the rounding of a resize or a colour conversion
PIXEL_SLACK = 1e-3


def images_argument(images, channels: int, size: int) -> tuple[Tensor, bool]:
    """What the Python API's image verbs accept, as (N, C, H, W) in [0, 1] and whether one image was
    given: a file path, a list of paths, a (C, H, W) or (N, C, H, W) tensor in [0, 1]."""
    import torch

    if isinstance(images, Tensor):
        single = images.dim() == 3
        x = images[None] if single else images
        if x.dim() != 4 or x.shape[1:] != (channels, size, size):
            raise DataError(
                f"images must be ({channels}, {size}, {size}) or (N, {channels}, {size}, {size}) "
                f"in [0, 1], got {tuple(images.shape)}"
            )
        if not torch.isfinite(x).all():  # (a NaN image would get a confident-looking class)
            raise DataError("images hold NaN or infinite values; give pixel values in [0, 1]")
        low, high = (float(v) for v in x.float().aminmax()) if x.numel() else (0.0, 0.0)
        if low < -PIXEL_SLACK or high > 1 + PIXEL_SLACK:  # (0..255 bytes, or images normalised already)
            raise DataError(
                f"images hold values from {low:g} to {high:g}; give pixel values in [0, 1] (the model's "
                "normalisation is applied to them: divide bytes by 255, undo a normalisation)"
            )
        return x.float(), single
    if isinstance(images, np.ndarray) and images.ndim == 4:  # (N, H, W, C): a batch of NumPy images
        images = list(images)
    single = isinstance(images, (str, Path, np.ndarray)) or _is_pil(images)
    if not single and not isinstance(images, (list, tuple)):
        raise DataError(
            "images must be a file path, a PIL image, a NumPy array, a list of them, or a (C, H, W) or "
            f"(N, C, H, W) tensor in [0, 1]; got {type(images).__name__}"
        )
    items = [images] if single else list(images)
    if not items:
        raise DataError("no images given: pass a file path, a PIL image, a NumPy array, a list of them, or a tensor")
    return torch.stack([one_image_tensor(item, channels, size) for item in items]), single


def _is_pil(obj) -> bool:
    return type(obj).__module__.startswith("PIL.") and hasattr(obj, "convert")


def one_image_tensor(item, channels: int, size: int) -> Tensor:
    """One image as (C, H, W) in [0, 1]: a file path, a PIL image, or a NumPy array laid out as
    images are in NumPy, PIL and OpenCV, (H, W) or (H, W, C) with C in 1, 3, 4 (uint8 in 0..255,
    or floats in [0, 1]); converted and resized as an image file is."""
    from PIL import Image

    if isinstance(item, (str, Path)):
        return load_image(item, channels, size)[0]
    if _is_pil(item):
        return fit_image(item, channels, size, "the image")[0]
    if isinstance(item, np.ndarray):
        arr = item[..., 0] if item.ndim == 3 and item.shape[-1] == 1 else item
        if arr.ndim not in (2, 3) or (arr.ndim == 3 and arr.shape[-1] not in (3, 4)):
            raise DataError(
                f"a NumPy image must be (H, W) or (H, W, C) with C 1, 3 or 4 (NumPy's layout), got {item.shape}"
            )
        if arr.dtype != np.uint8:
            arr = arr.astype(np.float64)
            if not np.isfinite(arr).all() or arr.min() < 0 or arr.max() > 1:
                raise DataError("a NumPy image of floats must hold values in [0, 1] (or give uint8 in 0..255)")
            arr = np.round(arr * 255).astype(np.uint8)
        return fit_image(Image.fromarray(arr), channels, size, "the image")[0]
    raise DataError(
        f"cannot read an image from {type(item).__name__}: give a file path, a PIL image, a NumPy array or a tensor"
    )
