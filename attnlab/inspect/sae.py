"""Sparse autoencoders on a model's activations: the dictionary-learning view of features
(Bricken et al. 2023, "Towards Monosemanticity"; Gao et al. 2024 for top-k), with SAELens's loss
terms and its plain training step (``grad_clip=1.0``: its SAETrainer's clipping), on activations
streamed from a corpus through one hook point.

An SAE writes an activation x (d_in) as a sparse, non-negative combination of d_sae learned
directions (the rows of W_dec) plus a bias::

    f(x)  = act((x − b_dec) W_enc + b_enc)          (d_sae,)   act: ReLU, or top-k then ReLU
    x̂(f)  = f W_dec + b_dec                          (d_in,)
    loss  = ‖x − x̂‖²  +  λ Σ_i f_i ‖W_dec,i‖          (ReLU: the L1 penalty, weighted by each
                                                       direction's norm, SAELens's "standard")
    loss  = ‖x − x̂‖²  +  α · aux                      (top-k: the sparsity is the k itself; aux
                                                       lets dead latents reconstruct the residual)

With ``unit_norm_decoder`` (the default, Anthropic's) the rows of W_dec are renormalised after
every step and the gradient's component along each row is removed first, so the L1 term is the
plain sum of activations. Latents that have not fired for ``dead_after`` tokens are dead; a ReLU
SAE resamples them ``resamples`` times during training (their encoder and decoder directions
reset toward inputs the SAE reconstructs worst), a top-k SAE trains them through the auxiliary
loss (Gao et al.'s AuxK). :func:`evaluate` reports L0, explained variance, the dead fraction and
the next-token loss with the SAE spliced into the model, against the clean model and against
zero-ablating the hook point.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Iterator, Literal

import torch
from torch import Tensor, nn

from ..config import Config
from ..options import Arg, nonneg_float
from ..errors import CheckpointError, OptionError

__all__ = ["SAEConfig", "SparseAutoencoder", "train", "evaluate", "load_sae", "token_batches", "activations"]

SAE_WEIGHTS, SAE_CONFIG, SAE_METRICS = "sae.safetensors", "sae.json", "metrics.json"


@dataclass
class SAEConfig(Config):
    d_in: int = 128
    d_sae: int = 1024
    kind: Literal["relu", "topk"] = "relu"
    k: int = 32  # top-k: latents kept per token
    # ReLU: λ of the L1 penalty (on inputs scaled to norm √d_in); top-k: α of the AuxK loss (SAELens's
    # aux_loss_coefficient)
    l1_coefficient: Annotated[float, Arg("ReLU: λ of the L1 penalty", nonneg_float)] = 2.0
    aux_coefficient: Annotated[float, Arg("top-k: α of the AuxK loss", nonneg_float)] = 1.0
    unit_norm_decoder: bool = True
    apply_b_dec_to_input: bool = True
    # inputs are multiplied by this (and outputs divided) so that their mean norm is √d_in, as
    # SAELens's "expected_average_only_in": the L1 coefficient then means the same at every width
    input_scale: float = 1.0
    hook: str = ""  # the hook point it reads (blocks.1.hook_resid_post)

    SIZES = ("d_in", "d_sae", "k")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kind == "topk" and self.k > self.d_sae:
            raise ValueError(f"--k {self.k} is more than the SAE's {self.d_sae} latents")


class SparseAutoencoder(nn.Module):
    """The SAE's parameters and its forward pass; shapes: x (..., d_in), latents (..., d_sae)."""

    def __init__(self, config: SAEConfig) -> None:
        super().__init__()
        self.config = c = config
        w_dec = torch.empty(c.d_sae, c.d_in)
        nn.init.kaiming_uniform_(w_dec)
        if c.unit_norm_decoder:
            w_dec /= w_dec.norm(dim=-1, keepdim=True)
        self.W_dec = nn.Parameter(w_dec)  # (d_sae, d_in): one direction per latent
        self.W_enc = nn.Parameter(w_dec.T.clone())  # (d_in, d_sae): the decoder's transpose to start
        self.b_enc = nn.Parameter(torch.zeros(c.d_sae))
        self.b_dec = nn.Parameter(torch.zeros(c.d_in))

    def decoder_norms(self) -> Tensor:
        """(d_sae,) the length of each latent's direction (1 with a unit-norm decoder)."""
        return self.W_dec.norm(dim=-1)

    def pre_activations(self, x: Tensor) -> Tensor:
        """(..., d_sae): (x − b_dec) W_enc + b_enc, before the activation (top-k: scaled by each
        direction's norm, SAELens's rescale_acts_by_decoder_norm)."""
        x = x * self.config.input_scale
        if self.config.apply_b_dec_to_input:
            x = x - self.b_dec
        pre = x @ self.W_enc + self.b_enc
        return pre * self.decoder_norms() if self.config.kind == "topk" else pre

    def activate(self, pre: Tensor) -> Tensor:
        """(..., d_sae) latents: ReLU, or the k largest pre-activations (then ReLU), the rest 0."""
        if self.config.kind == "relu":
            return torch.relu(pre)
        top = pre.topk(self.config.k, dim=-1, sorted=False)
        return torch.zeros_like(pre).scatter(-1, top.indices, top.values.relu())

    def encode(self, x: Tensor) -> Tensor:
        return self.activate(self.pre_activations(x))

    def decode(self, latents: Tensor) -> Tensor:
        """(..., d_in): f W_dec + b_dec (top-k: f divided back by the norms it was scaled by)."""
        if self.config.kind == "topk":
            latents = latents / self.decoder_norms()
        return (latents @ self.W_dec + self.b_dec) / self.config.input_scale

    def forward(self, x: Tensor) -> Tensor:
        return self.decode(self.encode(x))

    def losses(self, x: Tensor, dead: Tensor | None = None) -> dict[str, Tensor]:
        """SAELens's training loss terms on a batch x (N, d_in): ``mse_loss`` (the squared error
        summed over d_in, averaged over tokens), ``l1_loss`` (ReLU) or ``auxiliary_reconstruction_loss``
        (top-k, given ``dead``: (d_sae,) bool), their sum ``loss``, and the ``latents``; in the
        scaled space the SAE works in (``input_scale``), as SAELens's are."""
        pre = self.pre_activations(x)
        latents = self.activate(pre)
        scale = self.config.input_scale
        x, out = x * scale, self.decode(latents) * scale
        mse = (out - x).pow(2).sum(-1).mean()
        terms = {"mse_loss": mse}
        if self.config.kind == "relu":
            terms["l1_loss"] = self.config.l1_coefficient * (latents * self.decoder_norms()).norm(p=1, dim=-1).mean()
        else:
            terms["auxiliary_reconstruction_loss"] = self.aux_loss(x, out, pre, dead)
        loss = sum(terms.values())
        return {**terms, "loss": loss, "latents": latents}

    def aux_loss(self, x: Tensor, out: Tensor, pre: Tensor, dead: Tensor | None) -> Tensor:
        """AuxK (Gao et al. 2024, appendix A.2): the k_aux = d_in / 2 largest pre-activations of
        dead latents reconstruct the residual x − x̂ (no bias), scaled down while few are dead."""
        n_dead = int(dead.sum()) if dead is not None else 0
        if n_dead == 0:
            return out.new_zeros(())
        k_aux = x.shape[-1] // 2
        scale = min(n_dead / k_aux, 1.0)
        top = torch.where(dead, pre, -torch.inf).topk(min(k_aux, n_dead), dim=-1, sorted=False)
        acts = torch.zeros_like(pre).scatter(-1, top.indices, top.values)
        residual = (x - out).detach()
        recon = (acts / self.decoder_norms()) @ self.W_dec
        return self.config.aux_coefficient * scale * (recon - residual).pow(2).sum(-1).mean()

    @torch.no_grad()
    def project_decoder_gradient(self) -> None:
        """Remove each decoder row's gradient component along the row (it only changes the norm,
        which renormalising undoes), as Anthropic's training does."""
        if self.W_dec.grad is not None:
            w = self.W_dec / self.decoder_norms()[:, None]
            self.W_dec.grad -= (self.W_dec.grad * w).sum(-1, keepdim=True) * w

    @torch.no_grad()
    def normalize_decoder(self) -> None:
        self.W_dec /= self.decoder_norms()[:, None]

    # ---- saving ---------------------------------------------------------------------------------
    def save(self, folder: str | Path, metrics: dict | None = None, meta: dict | None = None) -> Path:
        """``folder/sae.safetensors`` + ``sae.json`` (config and where it came from) + ``metrics.json``."""
        from safetensors.torch import save_file

        from ..outputs import atomic_write_text

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".{SAE_WEIGHTS}.tmp"
        save_file({k: v.detach().cpu().contiguous() for k, v in self.state_dict().items()}, tmp)
        tmp.replace(folder / SAE_WEIGHTS)
        atomic_write_text(folder / SAE_CONFIG, json.dumps({"config": self.config.to_dict(), **(meta or {})}, indent=1))
        if metrics is not None:
            atomic_write_text(folder / SAE_METRICS, json.dumps(metrics, indent=1))
        return folder


def load_sae(folder: str | Path, device: str = "cpu") -> tuple[SparseAutoencoder, dict]:
    """(the SAE, the rest of its sae.json: the model run it reads, ...) from a folder ``save`` wrote."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / SAE_CONFIG).is_file():
        raise CheckpointError(f"{folder} holds no {SAE_CONFIG}; give a folder written by attnlab sae train")
    try:
        saved = json.loads((folder / SAE_CONFIG).read_text())
        sae = SparseAutoencoder(SAEConfig.from_dict(saved["config"]))
        sae.load_state_dict(load_file(folder / SAE_WEIGHTS))
    except (ValueError, KeyError, OSError, RuntimeError) as e:
        raise CheckpointError(f"{folder} does not hold a readable SAE ({str(e).splitlines()[0][:120]})") from None
    saved.pop("config")
    return sae.to(device).eval(), saved


# ---- activations from a corpus ---------------------------------------------------------------------
def token_batches(ids, context: int, batch_size: int, generator: torch.Generator) -> Iterator[Tensor]:
    """Endless (batch_size, context) windows of the token ids ``ids`` (a 1-D array), at random offsets."""
    import numpy as np

    ids = torch.from_numpy(np.array(ids, dtype=np.int64))  # (a copy: a memory map is read-only)
    if len(ids) <= context:
        raise OptionError(f"the corpus has {len(ids)} tokens, fewer than one window of {context}")
    while True:
        starts = torch.randint(0, len(ids) - context, (batch_size,), generator=generator)
        yield torch.stack([ids[s : s + context] for s in starts.tolist()])


def hook_layer(hook: str) -> int | None:
    """The block a GPT hook point sits in (``blocks.3.hook_resid_post`` -> 3), else None."""
    parts = hook.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blocks" and parts[1].isdigit() else None


def example_batches(model, source, batch_size: int, generator: torch.Generator) -> Iterator[tuple[Tensor, Tensor]]:
    """Endless (inputs, targets) batches of ``batch_size`` examples from ``source``: a 1-D array of
    token ids (windows of the model's context: tokens and the next tokens) or (images (N, C, H, W),
    labels (N,)) for an image classifier."""
    if isinstance(source, tuple):
        images, labels = source
        while True:
            idx = torch.randint(len(images), (batch_size,), generator=generator)
            yield images[idx], labels[idx]
    for window in token_batches(source, model.config.context, batch_size, generator):
        yield window[:, :-1], window[:, 1:]


@torch.no_grad()
def activations(model, hook: str, batches: Iterator[tuple[Tensor, Tensor]], device) -> Iterator[Tensor]:
    """Endless (tokens, d_in) activations at ``hook``: each batch's inputs run through ``model`` (a
    GPT only up to the block that holds the hook point), its activations flattened."""
    layer = hook_layer(hook)
    deep = getattr(model.config, "layers", 0)
    stop = {"stop_at_layer": layer + 1} if layer is not None and layer + 1 < deep else {}
    for inputs, _ in batches:
        with model.caching(hook) as cache:
            model(inputs.to(device), **stop)
        yield cache[hook].flatten(0, -2).float()


@torch.no_grad()
def hook_shape(model, hook: str, source) -> tuple[int, int]:
    """(tokens per example, width) of the activations at ``hook``, from one example of ``source``."""
    inputs, _ = next(example_batches(model, source, 1, torch.Generator().manual_seed(0)))
    with model.caching(hook) as cache:
        model(inputs.to(next(model.parameters()).device))
    value = cache[hook]
    return (value[0].numel() // value.shape[-1]), value.shape[-1]


def check_hook(model, hook: str) -> None:
    points = model.hook_points()
    if not isinstance(hook, str) or hook not in points:
        resid = [n for n in points if "resid" in n][:4]
        raise OptionError(
            f"{hook!r} is not a hook point of this model; e.g. {', '.join(resid)} (model.hook_points() lists them)"
        )


# ---- training -----------------------------------------------------------------------------------------
@dataclass
class SAETraining:
    """How an SAE is trained: ``steps`` batches of ``batch_tokens`` activations with Adam at ``lr``
    (linear warm-up over ``warmup`` steps, constant, then down to 0 over the last ``decay``
    fraction of the steps), the gradient's norm clipped at ``grad_clip`` when it is set."""

    steps: int = 2000
    batch_tokens: int = 1024
    lr: float = 4e-4
    warmup: int = 50
    decay: float = 0.2
    dead_after: int = 20_000  # tokens without firing that make a latent dead
    resamples: int = 3  # ReLU: dead latents resampled at 1/4, 2/4, 3/4 of the steps (0: never)
    grad_clip: float = 0.0  # the gradient's norm clipped at this every step (SAELens's SAETrainer: 1.0; 0: never)
    seed: int = 0
    log: Any = field(default=None, repr=False)  # a callable taking one progress line


def train(
    model,
    hook: str,
    source,
    *,
    config: SAEConfig | None = None,
    training: SAETraining | None = None,
    init: SparseAutoencoder | None = None,
    device: str | torch.device = "cpu",
) -> tuple[SparseAutoencoder, list[dict]]:
    """Train an SAE on ``model``'s activations at ``hook`` over ``source`` (a 1-D array of token
    ids, the corpus; or (images, labels)); returns (the SAE, one record per logged step).
    ``config.d_in`` is set from the activations; ``init``: start from these weights."""
    check_hook(model, hook)
    training = training or SAETraining()
    gen = torch.Generator().manual_seed(training.seed)
    per_example, _ = hook_shape(model, hook, source)
    per_batch = max(1, math.ceil(training.batch_tokens / per_example))
    stream = activations(model, hook, example_batches(model, source, per_batch, gen), device)
    buffer = next(stream)
    d_in = buffer.shape[-1]
    config = config or SAEConfig()
    if init is not None:
        sae = init
    else:
        torch.manual_seed(training.seed)
        scale = math.sqrt(d_in) / buffer.norm(dim=-1).mean().clamp_min(1e-12).item()
        sae = SparseAutoencoder(
            SAEConfig.from_dict({**config.to_dict(), "d_in": d_in, "hook": hook, "input_scale": scale})
        )
        with torch.no_grad():  # b_dec starts at the activations' mean: the SAE codes the deviations
            sae.b_dec.copy_(buffer.mean(0).cpu() * scale)
    if sae.config.d_in != d_in:
        raise OptionError(f"the SAE reads {sae.config.d_in}-wide activations; {hook} is {d_in} wide")
    sae.to(device).train()

    def batches() -> Iterator[Tensor]:
        pool = buffer
        while True:
            while len(pool) < training.batch_tokens:
                pool = torch.cat([pool, next(stream)])
            yield pool[: training.batch_tokens]
            pool = pool[training.batch_tokens :]

    return sae, fit(sae, batches(), training)


def fit(sae: SparseAutoencoder, batches: Iterator[Tensor], training: SAETraining) -> list[dict]:
    """The training loop on any stream of (tokens, d_in) batches: Adam, dead-latent tracking,
    resampling (ReLU) or AuxK (top-k), the unit-norm decoder."""
    c = sae.config
    optimizer = torch.optim.Adam(sae.parameters(), lr=training.lr, betas=(0.9, 0.999))
    since_fired = torch.zeros(c.d_sae, device=sae.W_dec.device)  # tokens since each latent last fired
    resample_at = {training.steps * i // (training.resamples + 1) for i in range(1, training.resamples + 1)}
    history: list[dict] = []
    for step in range(1, training.steps + 1):
        lr = training.lr * min(1.0, step / max(1, training.warmup))
        if training.decay > 0:
            lr *= min(1.0, (training.steps - step + 1) / (training.decay * training.steps))
        for group in optimizer.param_groups:
            group["lr"] = lr
        x = next(batches)
        dead = since_fired >= training.dead_after
        terms = sae.losses(x, dead if c.kind == "topk" else None)
        optimizer.zero_grad(set_to_none=True)
        terms["loss"].backward()
        if training.grad_clip:  # (before the decoder's projection, where SAELens's SAETrainer clips)
            torch.nn.utils.clip_grad_norm_(sae.parameters(), training.grad_clip)
        if c.unit_norm_decoder:
            sae.project_decoder_gradient()
        optimizer.step()
        if c.unit_norm_decoder:
            sae.normalize_decoder()
        with torch.no_grad():
            fired = (terms["latents"] > 0).any(0)
            since_fired = torch.where(fired, torch.zeros_like(since_fired), since_fired + len(x))
        if c.kind == "relu" and step in resample_at:
            n = resample(sae, optimizer, x, since_fired >= training.dead_after)
            since_fired[since_fired >= training.dead_after] = 0
            if n and training.log:
                training.log(f"step {step}: resampled {n} dead latents")
        if step % 50 == 0 or step == training.steps:
            rec = {k: float(v.detach()) for k, v in terms.items() if k != "latents"}
            rec.update(step=step, lr=lr, l0=float((terms["latents"] > 0).sum(-1).float().mean()))
            rec["dead_fraction"] = float((since_fired >= training.dead_after).float().mean())
            history.append(rec)
            if training.log:
                training.log(
                    f"step {step}/{training.steps}: loss {rec['loss']:.4f} (mse {rec['mse_loss']:.4f}), "
                    f"L0 {rec['l0']:.1f}, dead {rec['dead_fraction']:.1%}"
                )
    sae.eval()
    return history


@torch.no_grad()
def resample(sae: SparseAutoencoder, optimizer, x: Tensor, dead: Tensor) -> int:
    """Anthropic's resampling: each dead latent's decoder direction is set to an input the SAE
    reconstructs badly (drawn with probability ∝ its squared error), normalised; its encoder
    direction to that input scaled to 0.2 × the alive latents' mean encoder norm; its encoder
    bias to 0; and Adam's moments for those weights to 0. Returns how many were resampled."""
    idx = dead.nonzero().flatten()
    if len(idx) == 0:
        return 0
    err = (sae(x) - x).pow(2).sum(-1)
    if not err.sum() > 0:
        return 0
    pick = torch.multinomial(err / err.sum(), len(idx), replacement=True)
    directions = x[pick] * sae.config.input_scale - sae.b_dec
    directions = directions / directions.norm(dim=-1, keepdim=True).clamp_min(1e-8)
    alive = ~dead
    enc_norm = sae.W_enc[:, alive].norm(dim=0).mean() if alive.any() else torch.tensor(1.0)
    sae.W_dec[idx] = directions
    sae.W_enc[:, idx] = directions.T * 0.2 * enc_norm
    sae.b_enc[idx] = 0
    for p, rows in ((sae.W_dec, (idx,)), (sae.W_enc, (slice(None), idx)), (sae.b_enc, (idx,))):
        state = optimizer.state.get(p, {})
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                state[key][rows] = 0
    return len(idx)


# ---- evaluation ---------------------------------------------------------------------------------------
@torch.no_grad()
def evaluate(model, sae: SparseAutoencoder, source, *, batches: int = 8, batch_size: int = 8, seed: int = 1) -> dict:
    """The SAE on ``batches`` fresh batches of ``source`` (token ids, or (images, labels)): ``l0``
    (latents active per token), ``explained_variance`` (1 − Σ‖x − x̂‖² / Σ‖x − x̄‖²),
    ``dead_fraction`` (latents that never fired), and the model's loss (next-token, or the
    classifier's) ``ce_clean`` / ``ce_with_sae`` (x̂ in place of x) / ``ce_zero_ablated`` (0 in
    place of x), with ``ce_loss_recovered`` = (zero − sae) / (zero − clean)."""
    from ..losses import cross_entropy

    hook = sae.config.hook
    check_hook(model, hook)
    device = sae.W_dec.device
    gen = torch.Generator().manual_seed(seed)
    drawn = example_batches(model, source, batch_size, gen)
    sums = dict(err=0.0, var=0.0, l0=0.0, tokens=0, clean=0.0, spliced=0.0, zero=0.0)
    fired = torch.zeros(sae.config.d_sae, dtype=torch.bool, device=device)
    for _ in range(batches):
        x_ids, y = (t.to(device) for t in next(drawn))
        with model.caching(hook) as cache:
            clean = cross_entropy(model(x_ids), y).item()
        x = cache[hook].float()
        latents = sae.encode(x)
        x_hat = sae.decode(latents)
        flat, flat_hat = x.flatten(0, -2), x_hat.flatten(0, -2)
        sums["err"] += (flat - flat_hat).pow(2).sum().item()
        sums["var"] += (flat - flat.mean(0)).pow(2).sum().item()
        sums["l0"] += (latents > 0).sum().item()
        sums["tokens"] += flat.shape[0]
        fired |= (latents > 0).flatten(0, -2).any(0)
        with model.hooks([(hook, lambda v, h: x_hat.to(v.dtype))]):
            spliced = cross_entropy(model(x_ids), y).item()
        with model.hooks([(hook, lambda v, h: torch.zeros_like(v))]):
            zero = cross_entropy(model(x_ids), y).item()
        sums["clean"] += clean
        sums["spliced"] += spliced
        sums["zero"] += zero
    clean, spliced, zero = (sums[k] / batches for k in ("clean", "spliced", "zero"))
    return {
        "hook": hook,
        "tokens": sums["tokens"],
        "l0": sums["l0"] / sums["tokens"],
        "explained_variance": 1 - sums["err"] / max(sums["var"], 1e-12),
        "dead_fraction": 1 - fired.float().mean().item(),
        "ce_clean": clean,
        "ce_with_sae": spliced,
        "ce_zero_ablated": zero,
        "ce_loss_recovered": (zero - spliced) / (zero - clean) if zero != clean else float("nan"),
    }


# ---- features ------------------------------------------------------------------------------------------
@torch.no_grad()
def features(
    model,
    sae: SparseAutoencoder,
    ids,
    decode_token,
    *,
    latents: list[int] | None = None,
    count: int = 24,
    windows: int = 64,
    batch_size: int = 8,
    top: int = 6,
    before: int = 10,
    after: int = 3,
    seed: int = 2,
) -> list[dict]:
    """What each latent responds to and writes, for feature pages: over ``windows`` windows of
    ``ids``, its firing ``frequency``, its ``top`` activating contexts (the tokens around each
    hit, ``decode_token(id)`` each, with the latent's activation on every one), and its direct
    effect on the logits, W_dec[i] · W_U (the unembedding, the final LayerNorm left out):
    the tokens it ``promotes`` and ``suppresses`` most. ``latents``: which (default: the
    ``count`` that fire most often)."""
    hook = sae.config.hook
    check_hook(model, hook)
    device = sae.W_dec.device
    gen = torch.Generator().manual_seed(seed)
    stream = token_batches(ids, model.config.context, batch_size, gen)
    seen, acts = [], []
    for _ in range(max(1, windows // batch_size)):
        batch = next(stream)
        with model.caching(hook) as cache:
            model(batch.to(device))
        seen.append(batch)
        acts.append(sae.encode(cache[hook].float()).cpu())
    tokens, acts = torch.cat(seen), torch.cat(acts)  # (W, T), (W, T, d_sae)
    frequency = (acts > 0).flatten(0, 1).float().mean(0)
    if latents is None:
        latents = [i for i in frequency.argsort(descending=True).tolist() if frequency[i] > 0][:count]
    bad = [i for i in latents if not 0 <= i < sae.config.d_sae]
    if bad:
        raise OptionError(
            f"latent {bad[0]} does not exist; this SAE has {sae.config.d_sae} (0 to {sae.config.d_sae - 1})"
        )
    effects = (sae.W_dec / sae.decoder_norms()[:, None]) @ model.W_U.to(sae.W_dec.dtype)  # (d_sae, vocab)
    effects = effects[:, : getattr(model.config, "vocab_size", effects.shape[1])].cpu()
    pages = []
    for i in latents:
        a = acts[..., i]
        flat = a.flatten()
        hits = [h for h in flat.topk(min(top, flat.numel())).indices.tolist() if flat[h] > 0]
        contexts = []
        for h in hits:
            w, t = divmod(h, a.shape[1])
            lo, hi = max(0, t - before), min(a.shape[1], t + after + 1)
            contexts.append(
                {
                    "tokens": [decode_token(int(x)) for x in tokens[w, lo:hi]],
                    "activations": [round(float(v), 4) for v in a[w, lo:hi]],
                    "at": t - lo,
                }
            )
        e = effects[i]
        pages.append(
            {
                "latent": i,
                "frequency": float(frequency[i]),
                "max_activation": float(flat.max()),
                "contexts": contexts,
                "promotes": [(decode_token(j), round(float(e[j]), 4)) for j in e.topk(6).indices.tolist()],
                "suppresses": [(decode_token(j), round(float(e[j]), 4)) for j in (-e).topk(6).indices.tolist()],
            }
        )
    return pages


@torch.no_grad()
def image_features(
    model, sae: SparseAutoencoder, images: Tensor, labels: list[str], *, latents=None, count: int = 12, top: int = 6
) -> list[dict]:
    """Feature pages of an SAE on a ViT: over ``images`` (N, C, H, W), normalised as the model
    reads them, each latent's firing ``frequency``, its ``top`` (image, token) hits (token 0 is
    the class token when there is one) and the classes its direction raises and lowers through the
    classifier head (``promotes`` / ``suppresses``; the final LayerNorm left out)."""
    hook = sae.config.hook
    check_hook(model, hook)
    device = sae.W_dec.device
    acts = []
    for start in range(0, len(images), 64):
        with model.caching(hook) as cache:
            model(images[start : start + 64].to(device))
        acts.append(sae.encode(cache[hook].float()).cpu())
    acts = torch.cat(acts)  # (N, T, d_sae)
    frequency = (acts > 0).flatten(0, 1).float().mean(0)
    if latents is None:
        latents = [i for i in frequency.argsort(descending=True).tolist() if frequency[i] > 0][:count]
    effects = ((sae.W_dec / sae.decoder_norms()[:, None]) @ model.head.weight.T.to(sae.W_dec.dtype)).cpu()
    prefix = getattr(model, "n_prefix", 0)
    pages = []
    for i in latents:
        a = acts[..., i]
        flat = a.flatten()
        hits = [h for h in flat.topk(min(top, flat.numel())).indices.tolist() if flat[h] > 0]
        contexts = [
            {
                "image": n,
                "token": t,
                "patch": t - prefix if t >= prefix else None,
                "activation": round(float(flat[h]), 4),
            }
            for h in hits
            for n, t in [divmod(h, a.shape[1])]
        ]
        e = effects[i]
        k = min(3, e.numel())
        pages.append(
            {
                "latent": i,
                "frequency": float(frequency[i]),
                "max_activation": float(flat.max()),
                "contexts": contexts,
                "promotes": [(labels[j], round(float(e[j]), 4)) for j in e.topk(k).indices.tolist()],
                "suppresses": [(labels[j], round(float(e[j]), 4)) for j in (-e).topk(k).indices.tolist()],
            }
        )
    return pages


def image_features_page(pages: list[dict], pictures: Tensor, patch: int, title: str) -> str:
    """One offline HTML page of :func:`image_features`: each hit's image (``pictures``: (N, C, H,
    W) in [0, 1]) with the patch outlined (the whole image for the class token)."""
    import base64
    import io
    from html import escape

    from PIL import Image

    scale = max(1, 96 // pictures.shape[-1])

    def png(n: int) -> str:
        x = (pictures[n].clamp(0, 1) * 255).round().byte()
        arr = x[0].numpy() if x.shape[0] == 1 else x.permute(1, 2, 0).numpy()
        img = Image.fromarray(arr).resize((x.shape[-1] * scale, x.shape[-2] * scale), Image.NEAREST)
        buf = io.BytesIO()
        img.save(buf, format="PNG")
        return base64.b64encode(buf.getvalue()).decode()

    columns = pictures.shape[-1] // patch
    cards = []
    for p in pages:
        hits = []
        for c in p["contexts"]:
            if c["patch"] is None:
                box = f"left:0;top:0;width:{pictures.shape[-1] * scale - 4}px;height:{pictures.shape[-2] * scale - 4}px"
            else:
                r, q = divmod(c["patch"], columns)
                box = f"left:{q * patch * scale}px;top:{r * patch * scale}px;width:{patch * scale - 4}px;height:{patch * scale - 4}px"
            hits.append(
                f'<figure><div class="im"><img src="data:image/png;base64,{png(c["image"])}">'
                f'<div class="box" style="{box}"></div></div><figcaption>{c["activation"]:.2f}'
                f"{' (cls)' if c['patch'] is None else ''}</figcaption></figure>"
            )
        classes = lambda pairs: ", ".join(f"<code>{escape(str(t))}</code>&nbsp;{v:+.2f}" for t, v in pairs)  # noqa: E731
        cards.append(
            f'<section id="latent-{p["latent"]}"><h2>latent {p["latent"]}</h2><p>fires on {p["frequency"]:.2%} of '
            f"tokens; largest activation {p['max_activation']:.3f}; raises {classes(p['promotes'])}; lowers "
            f'{classes(p["suppresses"])}</p><div class="row">{"".join(hits)}</div></section>'
        )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em}section{border:1px solid #ccc;border-radius:6px;"
        "padding:.5em 1em;margin:1em 0}.row{display:flex;gap:8px;flex-wrap:wrap}figure{margin:0}"
        ".im{position:relative}.box{position:absolute;border:2px solid #f60}figcaption{font-size:12px}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title><style>{style}</style>'
        f"</head><body><h1>{escape(title)}</h1><p>Each card: the images where a latent fires most, the patch "
        "outlined, and the classes its direction raises and lowers through the head.</p>"
        + "".join(cards)
        + "</body></html>"
    )


def features_page(pages: list[dict], title: str) -> str:
    """One self-contained HTML page (no network) of :func:`features`: a card per latent, each
    context's tokens shaded by the latent's activation, the hit outlined."""
    from html import escape

    def tok(text: str) -> str:
        return escape(text).replace(" ", "&nbsp;").replace("\n", "↵")

    cards = []
    for p in pages:
        rows = []
        for c in p["contexts"]:
            peak = max(c["activations"]) or 1.0
            spans = "".join(
                f'<span class="t{" hit" if j == c["at"] else ""}" title="{v:.3f}" '
                f'style="background:rgba(255,120,0,{max(0.0, v) / peak:.2f})">{tok(t)}</span>'
                for j, (t, v) in enumerate(zip(c["tokens"], c["activations"]))
            )
            rows.append(f'<div class="ctx">{spans} <small>{c["activations"][c["at"]]:.3f}</small></div>')
        logits = lambda pairs: ", ".join(f"<code>{tok(t)}</code>&nbsp;{v:+.2f}" for t, v in pairs)  # noqa: E731
        cards.append(
            f'<section id="latent-{p["latent"]}"><h2>latent {p["latent"]}</h2>'
            f"<p>fires on {p['frequency']:.2%} of tokens; largest activation {p['max_activation']:.3f}</p>"
            f"<p>promotes {logits(p['promotes'])}<br>suppresses {logits(p['suppresses'])}</p>"
            + "".join(rows)
            + "</section>"
        )
    style = (
        "body{font-family:system-ui,sans-serif;margin:2em;max-width:70em}section{border:1px solid #ccc;"
        "border-radius:6px;padding:.5em 1em;margin:1em 0}.ctx{font-family:monospace;margin:.2em 0}"
        ".t{padding:0 1px}.hit{outline:1px solid #c00}code{background:#eee}"
    )
    return (
        f'<!doctype html><html><head><meta charset="utf-8"><title>{escape(title)}</title>'
        f"<style>{style}</style></head><body><h1>{escape(title)}</h1>"
        "<p>Each card: a latent's top activating contexts (shade: its activation on each token; outlined: "
        "the token where it peaks) and the tokens its decoder direction raises and lowers through the "
        "unembedding.</p>" + "".join(cards) + "</body></html>"
    )


def describe(metrics: dict) -> str:
    """One line of :func:`evaluate`'s numbers."""
    return (
        f"{metrics['hook']}: L0 {metrics['l0']:.1f}, explained variance {metrics['explained_variance']:.3f}, "
        f"dead {metrics['dead_fraction']:.1%}; next-token loss clean {metrics['ce_clean']:.4f}, with the SAE "
        f"{metrics['ce_with_sae']:.4f}, zero-ablated {metrics['ce_zero_ablated']:.4f} "
        f"({metrics['ce_loss_recovered']:.1%} of the loss recovered)"
    )


def print_line(line: str) -> None:
    print(line, file=sys.stderr, flush=True)
