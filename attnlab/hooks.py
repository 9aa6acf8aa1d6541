"""Named hook points: one mechanism to read and to change any intermediate value of a model.

Every value worth looking at passes through a :class:`HookPoint`, an identity module (the idea
of TransformerLens's ``hook_points.py``). A hook point's name is its module path, so the same
thing has the same name suffix in every family::

    blocks.0.hook_resid_pre         GPT block 0's input (the residual stream)
    encoder.blocks.0.attn.hook_pattern   a ViT's or a text encoder's first attention pattern

Reading and changing are the same call: a hook function ``fn(value, hook)`` sees the value and
returns a replacement, or None to leave it as it is::

    logits, cache = model.run_with_cache(idx)                  # every hook point (detached)
    cache["blocks.0.attn.hook_pattern"]                        # (B, H, T, T)
    cache.layers("attn.hook_pattern")                          # every layer's, first layer first
    with model.hooks([("blocks.1.attn.hook_z", zero_head(3))]):
        ablated = model(idx)

A hook point with no hook function costs one Python attribute test, and attention keeps its
fused kernel unless its scores or pattern are hooked (see :class:`attnlab.attention.MultiHeadAttention`).
"""

from __future__ import annotations

import contextlib
import fnmatch
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Union

import torch
from torch import Tensor, nn
from torch.nn.modules import module as torch_module

from .errors import OptionError

__all__ = ["HookPoint", "HookedModule", "ActivationCache", "HookFn", "NameFilter", "zero_heads"]

HookFn = Callable[[Tensor, "HookPoint"], Union[Tensor, None]]
# which hook points: one name or glob ("blocks.*.attn.hook_pattern"), a list of them, or a predicate
NameFilter = Union[str, Iterable[str], Callable[[str], bool], None]


class HookPoint(nn.Module):
    """An identity at a named place. ``step_dim``: for a value computed once per decoding step
    (an RNN's attention over the source), the dimension along which a cache joins the steps."""

    def __init__(self, step_dim: int | None = None) -> None:
        super().__init__()
        self.name: str = ""  # set by HookedModule.hook_points()
        self.step_dim = step_dim
        self.fns: list[HookFn] = []
        self.torch_hooked = False  # a PyTorch hook was registered on this point

    @property
    def active(self) -> bool:
        """True while a hook function is attached (attention then forms its weights explicitly)."""
        return bool(self.fns)

    @property
    def watched(self) -> bool:
        """True while anything would see this point's value: an attnlab hook function or a PyTorch
        hook (a value computed only for a hook point, such as each head's result, is computed then)."""
        return bool(self.fns or self.torch_hooked or torch_module._global_forward_hooks)

    def add(self, fn: HookFn) -> Callable[[], None]:
        """Attach ``fn``; returns a function that detaches it."""
        self.fns.append(fn)
        return lambda: self.fns.remove(fn) if fn in self.fns else None

    def forward(self, x: Tensor) -> Tensor:
        for fn in list(self.fns):
            out = fn(x, self)
            if out is not None:
                if not isinstance(out, Tensor) or out.shape != x.shape:
                    got = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                    raise ValueError(
                        f"a hook on {self.name} returned {got}; it must return a tensor of the "
                        f"value's shape {tuple(x.shape)}, or None to keep the value"
                    )
                x = out
        return x

    def __call__(self, x: Tensor) -> Tensor:
        # With nothing attached a hook point is free (nn.Module.__call__ costs microseconds). With
        # attnlab hook functions, PyTorch hooks registered on it (register_forward_hook and the like,
        # which captum's layer methods use) or forward hooks on every module, it is a real module
        # call, so that every kind of hook fires.
        if self.fns or self.torch_hooked or torch_module._global_forward_hooks:
            return super().__call__(x)
        return x

    # PyTorch's hook registrations mark the point (for good: a removed hook leaves it a module call,
    # which is as correct and only slower)
    def register_forward_hook(self, *args, **kwargs):
        self.torch_hooked = True
        return super().register_forward_hook(*args, **kwargs)

    def register_forward_pre_hook(self, *args, **kwargs):
        self.torch_hooked = True
        return super().register_forward_pre_hook(*args, **kwargs)

    def register_full_backward_hook(self, *args, **kwargs):
        self.torch_hooked = True
        return super().register_full_backward_hook(*args, **kwargs)

    def register_full_backward_pre_hook(self, *args, **kwargs):
        self.torch_hooked = True
        return super().register_full_backward_pre_hook(*args, **kwargs)

    def extra_repr(self) -> str:
        return f"{self.name!r}" if self.name else ""


class ActivationCache(dict):
    """Hook-point name -> the value that passed it, in the order the forward reached them (for a
    stack of blocks: first layer first). A value computed at every decoding step is joined along its hook point's ``step_dim``;
    :meth:`calls` gives every call's value separately."""

    def __init__(self) -> None:
        super().__init__()
        self._calls: dict[str, list[Tensor]] = {}
        self._step_dims: dict[str, int | None] = {}

    def _record(self, name: str, value: Tensor, step_dim: int | None) -> None:
        calls = self._calls.setdefault(name, [])
        calls.append(value)
        self._step_dims[name] = step_dim
        if len(calls) == 1:
            self[name] = value
        elif step_dim is not None:
            self[name] = torch.cat(calls, dim=step_dim)
        else:  # called again with no step dimension (a loop over calls): the last value, as TransformerLens
            self[name] = value

    def calls(self, name: str) -> list[Tensor]:
        """Every value that passed ``name`` during the forward, in call order."""
        return list(self._calls[name])

    def layers(self, suffix: str) -> list[Tensor]:
        """The values of every hook point whose name ends with ``suffix``, first layer first:
        ``cache.layers("attn.hook_pattern")`` -> [(B, H, T, T), ...]."""
        return [v for k, v in self.items() if k == suffix or k.endswith("." + suffix)]

    def names(self, suffix: str) -> list[str]:
        return [k for k in self if k == suffix or k.endswith("." + suffix)]


def _matcher(names: NameFilter) -> Callable[[str], bool]:
    if names is None:
        return lambda n: True
    if callable(names):
        return names
    many = isinstance(names, Iterable) and not isinstance(names, (Tensor, Mapping))
    pats = [names] if isinstance(names, str) else list(names) if many else None
    if pats is None or not all(isinstance(p, str) for p in pats):
        raise OptionError(
            f"names={names!r:.40}: give a hook point's name or glob, a list of them, or a predicate on the name"
        )

    def match(n: str) -> bool:  # a glob matches the whole name: "*.attn.hook_pattern" finds every layer's
        return any(fnmatch.fnmatchcase(n, p) for p in pats)

    return match


@contextlib.contextmanager
def in_mode(model: nn.Module, training: bool = False) -> Iterator[nn.Module]:
    """``model`` in eval mode (dropout off; ``training=True``: train mode) for what runs inside, back
    in its own mode after, however that ends."""
    was_training = model.training
    model.train(training)
    try:
        yield model
    finally:
        model.train(was_training)


class HookedModule(nn.Module):
    """The hook methods every attnlab model has (mixed in by the model classes)."""

    def hook_points(self, names: NameFilter = None) -> dict[str, HookPoint]:
        """Name -> hook point, in module order (first layer first), optionally filtered: a name, a
        glob matching whole names (``"blocks.*.hook_resid_post"``, ``"*.attn.hook_pattern"``), a
        list of these, or a predicate on the name."""
        match = _matcher(names)
        found = {}
        for n, m in self.named_modules():
            if isinstance(m, HookPoint):
                m.name = n
                if match(n):
                    found[n] = m
        return found

    def _resolve(self, names: NameFilter) -> dict[str, HookPoint]:
        points = self.hook_points(names)
        if not points and names is not None:
            shown = names if isinstance(names, str) or callable(names) else list(names)
            some = ", ".join(list(self.hook_points())[:6])
            raise OptionError(
                f"{type(self).__name__} has no hook point matching {shown!r}; its hook points are "
                f"named like {some}, ... (model.hook_points() lists them)"
            )
        return points

    @contextlib.contextmanager
    def hooks(
        self, fwd: Iterable[tuple[NameFilter, HookFn]] = (), bwd: Iterable[tuple[NameFilter, HookFn]] = ()
    ) -> Iterator["HookedModule"]:
        """``with model.hooks([(names, fn), ...]): model(x)``: ``fn(value, hook)`` runs at every hook
        point matching ``names`` during the forward passes inside the block, and its return value
        (if not None) replaces the value. ``bwd``: ``fn(gradient, hook)`` runs when the backward
        pass reaches the value of a matching point, with the loss's gradient with respect to it
        (the same shape), and its return value (if not None) replaces that gradient
        (TransformerLens's ``dir="bwd"`` hooks). The functions are removed on leaving the block."""
        removers = []
        try:
            for names, fn in fwd:
                removers += [p.add(fn) for p in self._resolve(names).values()]
            for names, fn in bwd:
                removers += [p.add(_on_gradient(fn)) for p in self._resolve(names).values()]
            yield self
        finally:
            for remove in removers:
                remove()

    def reset_hooks(self) -> None:
        """Detach every hook function (after an interrupted experiment, say)."""
        for p in self.hook_points().values():
            p.fns.clear()

    @contextlib.contextmanager
    def caching(
        self, names: NameFilter = None, *, detach: bool = True, device: str | torch.device | None = None
    ) -> Iterator[ActivationCache]:
        """``with model.caching("attn.hook_pattern") as cache: model(x)``: the cache fills during
        the forward passes inside the block. ``detach=False`` keeps the autograd graph (a loss
        may then use a cached value, as the captioner's attention regulariser does)."""
        cache = ActivationCache()

        def save(x: Tensor, hook: HookPoint) -> None:
            v = x.detach() if detach else x
            cache._record(hook.name, v.to(device) if device is not None else v, hook.step_dim)

        with self.hooks([(names, save)]):
            yield cache

    @contextlib.contextmanager
    def caching_gradients(self, names: NameFilter = None) -> Iterator[ActivationCache]:
        """``with model.caching_gradients("blocks.*.hook_resid_post") as grads: loss.backward()``
        after a forward inside the block: name -> the gradient of what was backpropagated with
        respect to that point's value (TransformerLens's ``incl_bwd`` cache, without the suffix)."""
        cache = ActivationCache()

        def save(grad: Tensor, hook: HookPoint) -> None:
            cache._record(hook.name, grad.detach(), hook.step_dim)

        with self.hooks(bwd=[(names, save)]):
            yield cache

    def run_with_cache(
        self, *args, names: NameFilter = None, detach: bool = True, device: str | torch.device | None = None, **kwargs
    ) -> tuple[object, ActivationCache]:
        """Run the model and return (its output, an :class:`ActivationCache` of the hook points
        matching ``names``; all of them by default)."""
        # the inputs: the first a tensor, the others tensors or None (options such as head="mlm" go by keyword)
        wrong = [a for i, a in enumerate(args) if not isinstance(a, Tensor) and (i == 0 or a is not None)]
        if wrong:
            raise OptionError(
                f"run_with_cache takes the model's own inputs, tensors (token ids (B, T), images (B, C, H, W)), "
                f"got {type(wrong[0]).__name__}"
            )
        try:
            with self.caching(names, detach=detach, device=device) as cache:
                out = self(*args, **kwargs)
        except IndexError as e:  # (torch's "index out of range in self" names neither the ids nor the vocabulary)
            raise ids_out_of_range(self, [*args, *kwargs.values()]) or e from None
        return out, cache


def ids_out_of_range(model: nn.Module, inputs: list) -> OptionError | None:
    """The one-line error for integer ``inputs`` (token ids) that fall outside ``model``'s
    embeddings, or None when they do not (the IndexError came from elsewhere)."""
    ids = [x for x in inputs if isinstance(x, Tensor) and not x.is_floating_point() and x.dtype != torch.bool]
    rows = {n: m.num_embeddings for n, m in model.named_modules() if isinstance(m, nn.Embedding)}
    if not ids or not rows or not any(x.numel() for x in ids):
        return None
    low = min(int(x.min()) for x in ids if x.numel())
    high = max(int(x.max()) for x in ids if x.numel())
    name, size = max(rows.items(), key=lambda kv: kv[1])  # (the token embedding: the largest table)
    if low >= 0 and high < size:
        return None
    return OptionError(
        f"token ids from {low} to {high} given to {type(model).__name__}, whose embedding {name} takes ids "
        f"from 0 to {size - 1}; encode text with the model's own tokenizer"
    )


def _on_gradient(fn: HookFn) -> HookFn:
    """A forward hook function that has ``fn(gradient, hook)`` called on the value's gradient."""

    def attach(x: Tensor, hook: HookPoint) -> None:
        if x.requires_grad:
            x.register_hook(lambda grad: fn(grad, hook))

    return attach


def zero_heads(*heads: int) -> HookFn:
    """A hook function for an ``attn.hook_z`` point (B, H, T, d_v) that zeroes these heads' outputs:
    the same as zeroing their columns of W_O (a head ablation)."""

    def ablate(z: Tensor, hook: HookPoint) -> Tensor:
        if any(not 0 <= h < z.shape[1] for h in heads):
            raise ValueError(f"{hook.name} has {z.shape[1]} heads; cannot ablate head(s) {list(heads)}")
        z = z.clone()
        z[:, list(heads)] = 0
        return z

    return ablate
