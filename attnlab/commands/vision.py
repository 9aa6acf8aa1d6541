"""`attnlab train vit|cnn`, classifier `eval`, `predict` and `inspect`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

from .common import given, refuse_model_changes, run_header, train_config
from ..errors import CheckpointError, DataError


def _preset_for(data_name: str, shape) -> str:
    c, h, _ = shape
    if h <= 8:
        return "digits"
    return "mnist" if c == 1 else "cifar"


def cmd_train_vision(args) -> int:
    from ..checkpoint import run_config
    from ..data.images import load_images
    from ..models import CNN, VIT_PRESETS, CNNConfig, ViT, ViTConfig
    from ..train import Trainer
    from ..train.tasks import ImageClassificationTask

    out = Path(args.out)
    model_over = given(args, args.model_fields)
    if not args.resume:  # check the options before anything is read or written
        tcfg = train_config(args, None)
        if args.arch == "vit" and args.preset:
            ViTConfig(**{**VIT_PRESETS[args.preset], **model_over})
    saved = run_config(out, args.resume, (args.arch,))
    if saved:
        refuse_model_changes(out, None, {}, {"data": (args.data, saved.get("data_spec"))})
    data_spec = (saved.get("data_spec") if saved else args.data) or "digits"
    splits = load_images(data_spec, args.data_dir)
    c, h, w = splits.shape
    if h != w:
        raise DataError(f"images are {h}x{w}; attnlab's classifiers expect square images")
    if saved:
        cls = ViT if args.arch == "vit" else CNN
        mcfg = cls.config_class.from_dict(saved["model"])
        refuse_model_changes(out, mcfg, model_over)
        tcfg = train_config(args, saved)
    else:
        common = dict(in_chans=c, num_classes=len(splits.labels), labels=splits.labels)
        if args.arch == "vit":
            preset = args.preset or _preset_for(splits.name, splits.shape)
            mcfg = ViTConfig(**{**VIT_PRESETS[preset], "image_size": h, **model_over, **common})
        else:
            mcfg = CNNConfig(**common, image_size=h)
    if mcfg.image_size != h:
        raise DataError(f"the images of {splits.name} are {h}x{w}, but the model takes {mcfg.image_size}x"
                        f"{mcfg.image_size}; drop --image-size (it follows the data) or resize the images")
    print(splits.note, file=sys.stderr)
    torch.manual_seed(tcfg.seed)
    model = ViT(mcfg) if args.arch == "vit" else CNN(mcfg)
    flip = args.flip if args.flip is not None else splits.name == "cifar10"
    pad = args.pad if args.pad is not None else max(1, h // 8)
    rotate = args.rotate if args.rotate is not None else (0.0 if splits.name == "cifar10" else 10.0)
    task = ImageClassificationTask(splits, tcfg.batch_size, pad=pad, flip=flip, label_smoothing=args.label_smoothing,
                                   rotate=rotate, scale=rotate / 100)
    trainer = Trainer(model, task, tcfg, out, meta={"data_spec": data_spec})
    if args.resume:
        trainer.resume()
    n = sum(p.numel() for p in model.parameters())
    print(f"{args.arch.upper()} {n / 1e6:.2f}M parameters | {run_header(trainer)}",
          file=sys.stderr)
    result = trainer.fit()
    pred, y = task.predict(trainer.model, "test", device=trainer.device)
    acc = (pred == y).float().mean().item()
    print(f"done: step {result['step']}, {result['seconds']:.0f}s, test accuracy {acc:.4f} "
          f"({len(y)} images), run folder {out}", file=sys.stderr)
    return 0


def _load_classifier(ckpt: str, device: str):
    from ..checkpoint import load_model
    from ..train.trainer import pick_device

    dev = pick_device(device)
    model, meta = load_model(ckpt, device=str(dev), with_meta=True)
    if model.model_type not in ("vit", "cnn"):
        raise CheckpointError(f"{ckpt} holds a {model.model_type} model; this command needs an image classifier (vit or cnn)")
    if "mean" not in meta:
        meta = {**meta, "mean": [0.5] * model.config.in_chans, "std": [0.5] * model.config.in_chans}
    return model, meta, dev


def _normalize(x: torch.Tensor, meta: dict) -> torch.Tensor:
    c = x.shape[1]
    return (x - torch.tensor(meta["mean"]).view(1, c, 1, 1)) / torch.tensor(meta["std"]).view(1, c, 1, 1)


def cmd_eval_classifier(args) -> int:
    from ..data.images import load_images
    from ..inspect.plots import confusion_matrix_png

    model, meta, dev = _load_classifier(args.ckpt, args.device)
    spec = args.data or meta.get("data_spec") or meta.get("data")
    splits = load_images(spec, args.data_dir)
    split = args.split or "test"
    c = model.config
    if splits.shape != (c.in_chans, c.image_size, c.image_size):
        raise DataError(f"{splits.name} holds {'x'.join(map(str, splits.shape))} images, but the model takes "
                        f"{c.in_chans}x{c.image_size}x{c.image_size}; evaluate it on data like its training data")
    labels = list(c.labels or range(c.num_classes))
    if [str(v) for v in splits.labels] != [str(v) for v in labels]:
        raise DataError(f"{splits.name} has classes {splits.labels[:10]}, but the model was trained on {labels[:10]}; "
                        "evaluate on data with the same classes, in the same order")
    x, y = getattr(splits, split)
    with torch.no_grad():
        pred = torch.cat([model(_normalize(x[i : i + 256], meta).to(dev)).argmax(-1).cpu()
                          for i in range(0, len(x), 256)])
    acc = (pred == y).float().mean().item()
    k = len(splits.labels)
    cm = torch.zeros(k, k, dtype=torch.long)
    cm.index_put_((y, pred), torch.ones_like(y), accumulate=True)
    out = Path(args.out) if args.out else Path(args.ckpt) / "confusion.png"
    confusion_matrix_png(cm.numpy(), splits.labels, out, title=f"{splits.name} {split}: accuracy {acc:.4f}")
    res = {"data": splits.name, "split": split, "images": len(y), "accuracy": acc, "confusion_png": str(out),
           "note": splits.note}
    if args.json:
        print(json.dumps(res))
    else:
        print(f"{splits.name} [{split}], {len(y)} images: accuracy {acc:.4f}; confusion matrix {out}")
    return 0


def cmd_predict(args) -> int:
    from ..data.images import load_image

    model, meta, dev = _load_classifier(args.ckpt, args.device)
    c = model.config
    labels = c.labels or [str(i) for i in range(c.num_classes)]
    for path in args.images:
        x, note = load_image(path, c.in_chans, c.image_size)
        if note:
            print(f"note: {note}", file=sys.stderr)
        with torch.no_grad():
            probs = model(_normalize(x[None], meta).to(dev)).softmax(-1)[0].cpu()
        top = probs.topk(min(args.top_k, len(probs)))
        shown = ", ".join(f"{labels[i]} {p:.3f}" for p, i in zip(top.values.tolist(), top.indices.tolist()))
        print(f"{path}: {shown}")
    return 0


# ---- inspect ------------------------------------------------------------------------------
def _attention_maps(model, x):
    from ..inspect import capture_attention

    with capture_attention(model) as rec, torch.no_grad():
        model(x)
    maps = rec.maps()
    return [maps[k] for k in sorted(maps, key=lambda n: int(n.split(".")[2]))]  # encoder.blocks.<i>.attn


def _need_vit(model, what):
    if model.model_type != "vit":
        raise CheckpointError(f"inspect {what} needs a ViT checkpoint, got a {model.model_type} model")


def _one_image(args, model, meta):
    from ..data.images import load_image

    if not args.image:
        raise ValueError(f"inspect {args.what} needs --image FILE (the image to look at)")
    x, note = load_image(args.image, model.config.in_chans, model.config.image_size)
    if note:
        print(f"note: {note}", file=sys.stderr)
    return x, _normalize(x[None], meta)


def _test_images(args, meta, n):
    from ..data.images import load_images

    splits = load_images(meta.get("data_spec") or meta.get("data"), args.data_dir)
    return _normalize(splits.test[0][:n], meta)


def cmd_inspect(args) -> int:
    from ..inspect import analysis as A
    from ..inspect import plots as P

    model, meta, dev = _load_classifier(args.ckpt, "cpu")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    raw: dict[str, np.ndarray] = {}
    if args.what in ("attention", "rollout"):
        _need_vit(model, args.what)
        img, x = _one_image(args, model, meta)
        maps = _attention_maps(model, x)  # L x (1, H, T, T)
        g, npre = model.grid, model.n_prefix
        if args.what == "attention":
            if not 0 <= args.token < maps[0].shape[-1]:
                raise ValueError(f"--token must be in 0..{maps[0].shape[-1] - 1}")
            rows = torch.stack([m[0, :, args.token, npre:] for m in maps])  # (L, H, N)
            grids = rows.reshape(*rows.shape[:2], *g).numpy()
            P.attention_grid_png(img, grids, out, title=f"attention from token {args.token}")
            raw["attention"] = torch.stack([m[0] for m in maps]).numpy()
        else:
            r = A.rollout(maps, args.head_fusion, args.discard_ratio, n_prefix=npre)[0]  # (T, T)
            src = r[0, npre:] if npre else r[:, :].mean(0)
            heat = (src / src.max()).reshape(*g).numpy()
            P.overlay_png(img, heat, out, title=f"attention rollout ({args.head_fusion}, discard {args.discard_ratio})")
            raw["rollout"] = r.numpy()
    elif args.what == "embeddings":
        _need_vit(model, args.what)
        comps, var = A.embedding_components(model.patch_embed.proj.weight.detach(), 28)
        P.components_png(comps.numpy(), var.numpy(), out)
        raw.update(components=comps.numpy(), explained_variance=var.numpy())
    elif args.what == "positions":
        _need_vit(model, args.what)
        pos = model.pos_embed.detach()[0, model.n_prefix :]
        sim = A.position_similarity(pos)
        P.position_similarity_png(sim.numpy(), model.grid, out)
        raw["similarity"] = sim.numpy()
    elif args.what == "distance":
        _need_vit(model, args.what)
        x = _test_images(args, meta, args.n_images)
        maps = _attention_maps(model, x)
        dist = torch.stack([A.mean_attention_distance(m, model.grid, model.config.patch_size, model.n_prefix)
                            for m in maps])  # (L, H)
        P.attention_distance_png(dist.numpy(), out, image_size=model.config.image_size)
        raw["distance"] = dist.numpy()
    elif args.what == "cka":
        raw.update(_cka(args, model, meta, out))
    np.savez(out.with_suffix(".npz"), **raw)
    print(f"wrote {out} and {out.with_suffix('.npz')}")
    return 0


def _cka(args, model, meta, out) -> dict:
    from ..inspect import analysis as A
    from ..inspect import plots as P
    from ..inspect.hooks import capture_features

    other = None
    if args.compare:
        other, meta_b, _ = _load_classifier(args.compare, "cpu")
        if (other.config.image_size, other.config.in_chans) != (model.config.image_size, model.config.in_chans):
            raise ValueError("--compare model takes images of another size or channel count; CKA needs the same inputs")
    x = _test_images(args, meta, args.n_images)
    if args.batch_size < 4:
        raise ValueError("--batch-size must be at least 4 for minibatch CKA")
    names_a = names_b = None
    mb = None
    full_a, full_b = [], []
    for i in range(0, len(x), args.batch_size):
        xb = x[i : i + args.batch_size]
        if len(xb) < 4:
            break
        with capture_features(model) as fa, torch.no_grad():
            model(xb)
        fb = fa
        if other is not None:
            xb_b = _normalize((xb * torch.tensor(meta["std"]).view(1, -1, 1, 1)
                               + torch.tensor(meta["mean"]).view(1, -1, 1, 1)), meta_b)
            with capture_features(other) as fb, torch.no_grad():
                other(xb_b)
        names_a, names_b = list(fa), list(fb)
        if args.kernel == "linear":
            mb = mb or A.MinibatchCKA(len(names_a), len(names_b))
            mb.update([fa[n] for n in names_a], [fb[n] for n in names_b])
        else:
            full_a.append([fa[n] for n in names_a])
            full_b.append([fb[n] for n in names_b])
    if args.kernel == "linear":
        m = mb.compute().numpy()
    else:  # RBF CKA on all collected features at once
        fa = [torch.cat([b[j] for b in full_a]) for j in range(len(names_a))]
        fb = [torch.cat([b[j] for b in full_b]) for j in range(len(names_b))]
        m = np.array([[A.rbf_cka(a, b) for b in fb] for a in fa])
    name_a = f"{model.model_type.upper()} ({Path(args.ckpt).name})"
    name_b = f"{other.model_type.upper()} ({Path(args.compare).name})" if other is not None else name_a
    P.cka_png(m, out, xlabel=f"{name_b} layer", ylabel=f"{name_a} layer", title=f"{args.kernel} CKA")
    return {"cka": m}
