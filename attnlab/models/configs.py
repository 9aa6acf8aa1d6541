"""The models' configurations, declared without torch: each field is an option of ``attnlab train``
(its type, default and help), so the command line, its --help and :func:`attnlab.train` read them
without importing the models themselves (each model module re-exports its config).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Literal

from ..config import ACTIVATIONS, NORMS, Config, SpecialTokens
from ..options import Arg, above_one, nonneg_float, nonneg_int, positive_float, positive_int, probability


# ---- cnn ----------------------------------------------------------------------------
@dataclass
class CNNConfig(Config):
    in_chans: int = 1
    num_classes: int = 10  # 0: no head (an image encoder: see ``features``)
    widths: tuple = (32, 64, 128)  # channels of each stage; each stage after the first halves H and W
    image_size: int = 28
    labels: list | None = None
    arch: Annotated[
        Literal["plain", "resnet"],
        Arg("plain: (conv, BN, ReLU) x2 per stage; resnet: two residual basic blocks per stage (ResNet-18's, scaled "
            "to small images)"),
    ] = "plain"  # fmt: skip

    SIZES = ("in_chans", "image_size")

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 0 <= self.num_classes <= 1 << 24:
            raise ValueError(f"num_classes must be 0 (no head) or more, got {self.num_classes}")
        if not self.widths or not all(isinstance(w, int) and 1 <= w <= 4096 for w in self.widths):
            raise ValueError(f"widths must be a list of channel counts from 1 to 4096, got {self.widths!r}")
        self.widths = tuple(self.widths)  # JSON gives a list back

    @property
    def grid(self) -> tuple[int, int]:
        """The (h, w) of the last stage's feature map: each stage after the first halves H and W."""
        g = self.image_size
        for _ in self.widths[1:]:
            g = (g + 1) // 2
        return g, g


# ---- vit ----------------------------------------------------------------------------
VIT_POSITIONS = ("learned", "sincos", "fourier", "relative", "none")


@dataclass
class ViTConfig(Config):
    image_size: int = 32
    patch_size: int = 4
    in_chans: int = 3
    num_classes: int = 10  # 0: no head, the model returns the pooled features
    dim: int = 192
    layers: int = 6
    heads: int = 3
    mlp_ratio: float = 4.0
    pool: Literal["cls", "mean"] = "cls"
    pos: Annotated[
        Literal[VIT_POSITIONS],
        Arg("positional encoding: learned, sincos (2-D sine-cosine), fourier (learned Fourier features), relative "
            "(2-D Shaw et al., no absolute table) or none (a bag of patches)"),
    ] = "learned"  # fmt: skip
    rel_distance: Annotated[
        int, Arg("--pos relative: patch offsets beyond this many rows or columns share a table row", positive_int)
    ] = 8
    dropout: float = 0.0
    norm_eps: float = 1e-6
    qkv_bias: bool = True
    peg: bool = False  # conditional position encoding (CPVT): a depthwise conv after the first block
    labels: list | None = None  # class names, in index order
    window: Annotated[
        int | None,
        Arg("restricted attention: each patch attends to the patches within WINDOW rows and columns of it (the class "
            "token to all, and all to it; default: every patch)", positive_int),
    ] = None  # fmt: skip

    SIZES = ("image_size", "patch_size", "in_chans", "dim", "layers", "heads")
    ALIASES = {"depth": "layers"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be 0 (no head) or more, got {self.num_classes}")
        if self.image_size % self.patch_size:
            raise ValueError(
                f"image size {self.image_size} is not divisible by patch size {self.patch_size}; "
                "pick a patch size that divides it"
            )
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")

    @property
    def grid(self) -> tuple[int, int]:
        g = self.image_size // self.patch_size
        return g, g


VIT_PRESETS: dict[str, dict] = {
    # 8×8 digits: 2×2 patches -> a 4×4 grid of 16 tokens
    # (with a PEG: on 1,259 training images the convolution's locality is worth ~1.5 points)
    "digits": dict(image_size=8, patch_size=2, in_chans=1, dim=64, layers=4, heads=4, mlp_ratio=2.0, peg=True),
    # 28×28 MNIST: 4×4 patches -> 7×7 grid
    "mnist": dict(image_size=28, patch_size=4, in_chans=1, dim=64, layers=6, heads=4, mlp_ratio=2.0, peg=True),
    # 32×32 CIFAR-10: 4×4 patches -> 8×8 grid
    "cifar": dict(image_size=32, patch_size=4, in_chans=3, dim=192, layers=6, heads=3, mlp_ratio=2.0),
}


# ---- gpt ----------------------------------------------------------------------------
POSITIONS = ("learned", "rope", "alibi", "sinusoidal", "relative")


@dataclass
class GPTConfig(Config):
    # fmt: off
    vocab_size: int = 50257
    context: int = 1024  # the most tokens the model can see at once (nanoGPT's block_size)
    layers: int = 12
    heads: int = 12
    dim: int = 768
    dropout: float = 0.0
    bias: bool = True
    pos: Literal[POSITIONS] = "learned"  # relative: Shaw et al.
    # exact GELU (nanoGPT); the gpt2 preset uses "gelu_tanh" (GPT-2's gelu_new), speedrun-cpu "relu2"
    activation: Literal[ACTIVATIONS] = "gelu"
    norm_eps: float = 1e-5
    tie_output: bool = True
    mlp: Annotated[bool, Arg("an MLP in every block (--no-mlp: attention only, as in the induction-head studies)")] = True
    embed_scale: Annotated[
        bool | None,
        Arg("multiply the token embeddings by √dim, as 'Attention is all you need' does, so that a fixed unit-amplitude "
            "(sinusoidal) position code does not drown them (default: on for --pos sinusoidal)"),
    ] = None
    window: Annotated[
        int | None,
        Arg("restricted attention: each token attends to itself and the WINDOW tokens before it (default: all "
            "earlier tokens)", positive_int),
    ] = None
    pos_combine: Annotated[
        Literal["add", "concat"],
        Arg("absolute positions: add them to the token embeddings (add), or concatenate [token; position] (concat: "
            "see --pos-dim)"),
    ] = "add"
    pos_dim: Annotated[
        int,
        Arg("--pos-combine concat: the position code's width; the token embedding is dim - POS_DIM wide and [token; "
            "position] is the stream (0: both dim wide, joined and projected back to dim by a learned matrix that "
            "starts as their sum)", nonneg_int),
    ] = 0
    rel_distance: Annotated[
        int, Arg("--pos relative: distances beyond this many tokens share one table row", positive_int)
    ] = 16
    rel_heads: Annotated[bool, Arg("--pos relative: a table per head instead of one shared by all heads")] = False
    qk_norm: Annotated[
        bool, Arg("RMS-normalise each head's queries and keys (QK-norm; the speedrun-cpu preset's)")
    ] = False
    logit_softcap: Annotated[
        float,
        Arg("soft-cap the output logits at ±CAP: CAP·tanh(logits/CAP), as Gemma 2 and the modded-nanogpt speedrun do "
            "(0: no cap)", nonneg_float),
    ] = 0.0
    zero_init: Annotated[
        bool,
        Arg("start the projections that write into the residual stream (attention W_O, MLP out) and an untied output "
            "head at zero, so that every block starts as the identity (the speedrun's init)"),
    ] = False
    attn_scale: Annotated[
        float | None,
        Arg("multiply the attention scores q·k by this instead of 1/√d_k (1.0: unscaled dot products, the baseline of "
            "the √d_k claim)", positive_float),
    ] = None
    vocab_multiple: Annotated[
        int,
        Arg("round the embedding and output head up to a multiple of this many rows (64: the matmul shapes tensor "
            "cores run fastest, as nanoGPT pads GPT-2's 50,257 to 50,304); the extra rows are never output and exports "
            "drop them (1: no padding; BPE runs use 64)", positive_int),
    ] = 1
    kv_heads: Annotated[
        int | None,
        Arg("grouped-query attention: this many key/value heads, each shared by heads / KV_HEADS query heads (default: "
            "one per query head; Llama 3, Qwen and Mistral share)", positive_int),
    ] = None
    head_dim: Annotated[
        int | None, Arg("each head's width (default dim / heads; Qwen3 and Gemma use other widths)", positive_int)
    ] = None
    mlp_hidden: Annotated[int | None, Arg("the MLP's hidden width (default 4 x dim)", positive_int)] = None
    norm: Annotated[
        Literal[NORMS], Arg("the normalisation: layer (LayerNorm, GPT-2's) or rms (RMSNorm: Llama, Qwen, Mistral)")
    ] = "layer"
    gated_mlp: Annotated[
        bool,
        Arg("a gated MLP: (act(x W_gate) * x W_up) W_down; with --activation silu it is SwiGLU (Llama, Qwen, "
            "Mistral)"),
    ] = False
    qkv_bias: Annotated[
        bool | None,
        Arg("biases on the query, key and value projections alone (default: as --bias; Qwen2 has them)"),
    ] = None
    rope_base: Annotated[
        float,
        Arg("--pos rope: the base of the rotary frequencies (Llama 3 and Qwen: 500,000 and 1,000,000)", above_one),
    ] = 10000.0
    rope_scaling: Annotated[
        str | None,
        Arg("--pos rope: frequencies rescaled for a longer context: linear:FACTOR, "
            "llama3:FACTOR:LOW:HIGH:ORIGINAL_CONTEXT (Llama 3.1 and 3.2: llama3:8:1:4:8192), "
            "yarn:FACTOR:ORIGINAL_CONTEXT:BETA_FAST:BETA_SLOW:ATTENTION_FACTOR (Qwen2.5's long contexts: "
            "yarn:4:32768:32:1:1.1386; a last :untruncated leaves the ramp's ends unrounded), "
            "longrope:ORIGINAL_CONTEXT:ATTENTION_FACTOR:S1,S2,...:L1,L2,... (Phi-3/3.5 mini 128k: a short and a long "
            "factor per rotated pair) or dynamic:FACTOR:ORIGINAL_CONTEXT (dynamic NTK: the base raised past the "
            "original context)"),
    ] = None
    rope_fraction: Annotated[
        float,
        Arg("--pos rope: rotate this share of each head's dimensions, pass the rest (Pythia: 0.25)", probability),
    ] = 1.0
    sandwich_norm: Annotated[
        bool, Arg("normalise each sublayer's output too before it joins the residual stream (Gemma 2 and 3)")
    ] = False
    attn_softcap: Annotated[
        float, Arg("soft-cap the attention scores at ±CAP: CAP·tanh(scores/CAP) (Gemma 2; 0: no cap)", nonneg_float)
    ] = 0.0
    global_every: Annotated[
        int,
        Arg("with --window: every Nth layer attends to all earlier tokens, the others within the window (Gemma 2: 2, "
            "Gemma 3: 6; 0: every layer windowed)", nonneg_int),
    ] = 0
    window_from: Annotated[
        int,
        Arg("with --window: the first N layers attend to all earlier tokens, the later ones within the window "
            "(Qwen2's max_window_layers; 0: every layer windowed)", nonneg_int),
    ] = 0
    rope_local_base: Annotated[
        float | None,
        Arg("--pos rope: the rotary base of the windowed layers, which --rope-scaling leaves unscaled (Gemma 3: "
            "10,000; default: as the other layers, --rope-base and --rope-scaling)", above_one),
    ] = None
    post_ln: Annotated[
        bool,
        Arg("the original Transformer's post-LN blocks, LN(x + sublayer(x)), instead of pre-LN's x + sublayer(LN(x)) "
            "(Vaswani et al. 2017; deep ones train unstably, Xiong et al. 2020)"),
    ] = False
    parallel_residual: Annotated[
        bool, Arg("attention and MLP both read the block's input: x + attn(x) + mlp(x) (GPT-J, Pythia)")
    ] = False
    attn_tie: Annotated[
        Literal["none", "qk", "kv"],
        Arg("one projection fewer in attention: qk uses the queries as keys (W_K = W_Q), kv the keys as values (W_V = "
            "W_K); none keeps three"),
    ] = "none"

    # fmt: on

    SIZES = ("vocab_size", "context", "layers", "heads", "dim")
    ALIASES = {
        "block_size": "context",
        "n_layer": "layers",
        "n_head": "heads",
        "n_embd": "dim",
        "position": "pos",
        "tie_weights": "tie_output",
    }

    def __post_init__(self) -> None:
        super().__post_init__()  # (each field's own bounds and choices, as declared above)
        if self.embed_scale is None:
            self.embed_scale = self.pos == "sinusoidal"
        if self.head_dim is None and self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}; pick heads dividing dim")
        if self.kv_heads is not None and self.heads % self.kv_heads:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv_heads}; pick a divisor")
        if self.rope_scaling is not None:
            from ..position import rope_scaling_parts

            kind, numbers = rope_scaling_parts(self.rope_scaling)  # (a malformed spec: its form, in one line)
            if kind == "longrope" and len(numbers[2]) != self.rotary_dim // 2:
                raise ValueError(
                    f"--rope-scaling longrope gives {len(numbers[2])} factors for {self.rotary_dim // 2} rotated "
                    "pairs; give one short and one long factor per pair"
                )
            if kind == "dynamic" and self.rotary_dim <= 2:
                raise ValueError("--rope-scaling dynamic raises the base by a power r/(r-2): rotate more than 2 dims")
        if self.pos == "rope" and self.rotary_dim % 2:
            raise ValueError(
                f"--pos rope rotates pairs of a head's dimensions: {self.rotary_dim} of them (head width "
                f"{self.d_head} x --rope-fraction {self.rope_fraction}) is odd"
            )
        if self.pos_dim and not (self.pos_combine == "concat" and self.pos_dim < self.dim):
            raise ValueError(
                f"--pos-dim {self.pos_dim} splits the stream's {self.dim} dims between tokens and positions: give "
                f"--pos-combine concat and a width between 1 and {self.dim - 1}"
            )
        if self.pos_dim and self.tie_output:
            raise ValueError(
                "--pos-dim makes the token embedding narrower than the stream, so the output head cannot reuse "
                "it: add --no-tie-output"
            )
        if self.pos_combine == "concat" and self.pos not in ("learned", "sinusoidal"):
            raise ValueError(
                f"--pos-combine concat joins an absolute position code to the tokens; --pos {self.pos} has none "
                "(use learned or sinusoidal)"
            )
        if self.post_ln and (self.parallel_residual or self.sandwich_norm):
            raise ValueError(
                "--post-ln normalises after each residual sum; drop --parallel-residual and --sandwich-norm"
            )
        for name in ("global_every", "window_from"):
            if getattr(self, name) and self.window is None:
                raise ValueError(f"--{name.replace('_', '-')} says which layers are windowed: give the --window too")
        if self.rel_heads and self.pos != "relative":
            raise ValueError(
                f"--rel-heads shapes the relative-position tables: it needs --pos relative (got --pos {self.pos})"
            )

    @property
    def d_head(self) -> int:
        """Each head's width: head_dim, else dim / heads."""
        return self.head_dim or self.dim // self.heads

    def layer_window(self, layer: int) -> int | None:
        """The attention window of block ``layer`` (None: all earlier tokens)."""
        if self.global_every and (layer + 1) % self.global_every == 0 or layer < self.window_from:
            return None
        return self.window

    @property
    def rotary_dim(self) -> int:
        """The dimensions of each head that RoPE rotates."""
        return int(self.d_head * self.rope_fraction)

    @property
    def vocab_rows(self) -> int:
        """Rows of the embedding and output head: vocab_size rounded up to vocab_multiple."""
        return -(-self.vocab_size // self.vocab_multiple) * self.vocab_multiple

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True):
        # a checkpoint written before embed_scale existed never scaled its embeddings
        d = cls.resolve_aliases(d) if isinstance(d, dict) else d
        if isinstance(d, dict) and "embed_scale" not in d:
            d = {**d, "embed_scale": False}
        return super().from_dict(d, strict)


# The modded-nanogpt speedrun's model changes, each a config option (ablated in benchmarks/speedrun.py):
# rotary positions, QK-norm, ReLU², an untied head, logits soft-capped at 15, zero-initialised
# output projections, no biases.
SPEEDRUN_CHANGES = dict(
    pos="rope", activation="relu2", qk_norm=True, tie_output=False, logit_softcap=15.0, zero_init=True, bias=False
)

GPT_PRESETS: dict[str, dict] = {
    # a few seconds per hundred steps on a laptop CPU; for tests and quick looks
    "nano": dict(layers=2, heads=2, dim=64, context=64),
    # nanoGPT's documented CPU run on Tiny Shakespeare
    "shakespeare-cpu": dict(layers=4, heads=4, dim=128, context=64),
    # nanoGPT's CPU model with the speedrun's changes; trained with Muon on a trapezoidal schedule
    # (the recipe's training defaults, recipes/gpt.py)
    "speedrun-cpu": dict(layers=4, heads=4, dim=128, context=64, **SPEEDRUN_CHANGES),
    # nanoGPT's GPU Shakespeare model
    "shakespeare": dict(layers=6, heads=6, dim=384, context=256, dropout=0.2),
    # its speedrun twin: the same shape with the speedrun's changes, and nanoGPT's dropout (1 M
    # characters: without it the model overfits from step ~300; benchmarks/speedrun_gpu.py)
    "speedrun": dict(layers=6, heads=6, dim=384, context=256, **SPEEDRUN_CHANGES, dropout=0.2),
    # GPT-2 small (124M)
    "gpt2": dict(layers=12, heads=12, dim=768, context=1024, vocab_size=50257, activation="gelu_tanh"),
}


# ---- encoder ----------------------------------------------------------------------------
@dataclass
class TextEncoderConfig(Config):
    vocab_size: int = 30522
    context: int = 512  # the longest input in tokens, [CLS] and [SEP] included
    layers: int = 12
    heads: int = 12
    dim: int = 768
    mlp_dim: int = 3072
    type_vocab_size: int = 2  # segments (token types): sentence A and B
    dropout: float = 0.1
    norm_first: bool = False  # BERT's post-LN; True for pre-LN
    norm_eps: float = 1e-12
    pad_id: int = 0
    mlm_head: bool = True
    num_classes: int = 0  # > 0: a classification head
    labels: list | None = None  # class names, in index order
    per_token: Annotated[
        bool, Arg("the classification head labels every token (tagging) instead of the whole text")
    ] = False
    window: Annotated[
        int | None,
        Arg("restricted attention: each token attends to the WINDOW tokens on either side (default: all)", positive_int),
    ] = None  # fmt: skip
    pos: Annotated[
        Literal["learned", "relative"],
        Arg("learned (BERT's absolute table) or relative (Shaw et al.: learned key and value vectors per clipped "
            "distance, inside attention; no table added to the tokens)"),
    ] = "learned"  # fmt: skip
    rel_distance: Annotated[
        int, Arg("--pos relative: distances beyond this many tokens share one table row", positive_int)
    ] = 16

    SIZES = ("vocab_size", "context", "layers", "heads", "dim", "mlp_dim", "type_vocab_size")
    ALIASES = {"num_labels": "num_classes"}
    HELP = {"context": "the longest input in tokens, [CLS] and [SEP] included"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")
        if self.context < 3:
            raise ValueError(f"--context {self.context}: an encoded text is [CLS] text [SEP], so at least 3 tokens")
        if self.num_classes < 0:
            raise ValueError(f"num_classes must be 0 (no classifier) or more, got {self.num_classes}")
        if self.per_token and not self.num_classes:
            raise ValueError("per_token needs a classifier: num_classes > 0 (the number of tags)")


ENCODER_PRESETS: dict[str, dict] = {
    "tiny": dict(layers=2, heads=2, dim=128, mlp_dim=512, context=128),  # BERT-tiny's shape
    "mini": dict(layers=4, heads=4, dim=256, mlp_dim=1024, context=128),  # BERT-mini
    "small": dict(layers=4, heads=8, dim=512, mlp_dim=2048, context=512),  # BERT-small
    "base": dict(layers=12, heads=12, dim=768, mlp_dim=3072, context=512),  # bert-base
}


# ---- graph ----------------------------------------------------------------------------
@dataclass
class GraphTransformerConfig(Config):
    num_classes: int = 2
    node_features: int = 0  # 0: nodes without features (one learned vector for every node)
    dim: int = 64
    layers: int = 3
    heads: int = 4
    mlp_ratio: float = 2.0
    dropout: float = 0.0
    pos: Annotated[Literal["laplacian", "none"], Arg("laplacian (eigenvectors of the graph Laplacian) or none")] = (
        "laplacian"
    )
    lap_k: Annotated[int, Arg("how many Laplacian eigenvectors each node gets")] = 8
    sign_flip: Annotated[bool, Arg("random eigenvector signs in training")] = True
    attend: Annotated[
        Literal["all", "edges"],
        Arg("all: every node attends to every node (the complete graph); edges: to its neighbours"),
    ] = "all"

    SIZES = ("dim", "layers", "heads", "lap_k")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")
        if self.num_classes < 1 or self.node_features < 0:
            raise ValueError(
                f"num_classes must be at least 1 and node_features 0 or more, got {self.num_classes}, "
                f"{self.node_features}"
            )


# ---- rnn ----------------------------------------------------------------------------
@dataclass
class RNNConfig(SpecialTokens, Config):
    src_vocab: int = 8000
    tgt_vocab: int = 8000
    emb_dim: int = 256
    dim: int = 512  # the hidden state's width
    layers: int = 1
    cell: Literal["gru", "lstm"] = "gru"
    bidirectional: bool = True
    attention: Literal["none", "additive", "dot"] = "additive"
    dropout: float = 0.2
    context: int = 256  # the longest source or target sequence, in tokens
    readout: Annotated[
        int, Arg("Bahdanau's deep output: a maxout layer this wide before the vocabulary (0: none)", nonneg_int)
    ] = 0

    SIZES = ("src_vocab", "tgt_vocab", "emb_dim", "dim", "layers", "context")
    ALIASES = {"hidden": "dim", "max_len": "context"}
    HELP = {
        "dim": "the recurrent state's width",
        "layers": "stacked recurrent layers, encoder and decoder each",
        "cell": "the recurrent cell",
        "bidirectional": "the encoder reads the source both ways (Bahdanau et al.'s)",
        "attention": "the decoder's attention over the encoder states: none (one context vector), additive "
        "(Bahdanau) or dot (Luong)",
        "context": "the longest source or target sentence, in tokens",
    }


# ---- seq2seq ----------------------------------------------------------------------------
@dataclass
class TransformerConfig(SpecialTokens, Config):
    src_vocab: int = 8000
    tgt_vocab: int = 8000
    dim: int = 256
    heads: int = 8
    enc_layers: int = 3
    dec_layers: int = 3
    mlp_dim: int = 512
    dropout: float = 0.1
    norm_first: bool = False  # the paper's post-LN; True for pre-LN
    pos: Literal["sinusoidal", "learned", "relative"] = "sinusoidal"  # relative: Shaw et al., in both self-attentions
    rel_distance: Annotated[
        int, Arg("--pos relative: distances beyond this many tokens share one table row", positive_int)
    ] = 16
    activation: Literal[ACTIVATIONS] = "relu"
    share_embeddings: bool = True  # only when the vocabulary is joint (src_vocab == tgt_vocab)
    tie_output: bool = True
    context: int = 256  # the longest source or target sequence, in tokens

    SIZES = ("src_vocab", "tgt_vocab", "dim", "heads", "enc_layers", "dec_layers", "mlp_dim", "context")
    ALIASES = {"ff_dim": "mlp_dim", "max_len": "context"}
    HELP = {"context": "the longest source or target sentence, in tokens"}

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")
        if self.share_embeddings and self.src_vocab != self.tgt_vocab:
            raise ValueError("share_embeddings needs a joint vocabulary (src_vocab == tgt_vocab)")


# ---- caption ----------------------------------------------------------------------------
# the synthetic scenes' most objects (attnlab.data.captions draws them): each object has a column of its
# own, at least 8 pixels wide
MAX_OBJECTS = 6
ARCHS = ("rnn", "rnn-attention", "transformer")
IMAGE_VECTORS = ("mean", "flatten")
ENCODERS = ("cnn", "vit")


@dataclass
class CaptionConfig(SpecialTokens, Config):
    vocab_size: int = 64
    arch: Literal[ARCHS] = "rnn-attention"
    encoder: Literal[ENCODERS] = "cnn"
    image_size: int = 40
    in_chans: int = 3
    widths: tuple = (16, 32, 64)  # CNN encoder stages: a 40-pixel image gives a 10×10 grid
    patch_size: int = 4  # ViT encoder: 4-pixel patches, a 10×10 grid at 40 pixels
    enc_layers: int = 2  # ViT encoder depth
    dim: int = 256  # the decoder's width (LSTM state, or Transformer model width)
    emb_dim: int = 128  # RNN decoders: word embedding width
    attention_dim: int = 128  # rnn-attention: width of the additive attention
    layers: int = 2  # Transformer decoder blocks
    heads: int = 4
    mlp_dim: int = 512
    context: int = 32  # the longest caption, in tokens with <bos>
    dropout: float = 0.1
    alpha_c: float = 1.0  # λ of the doubly stochastic attention regulariser (rnn-attention)
    # rnn-attention: h₀, c₀ = MLP(mean z) as in the paper, or (default) a learned start, so that the
    # image reaches the words only through attention (on scenes: 99.6 % exact captions and attention
    # on the object being described, against 95 % and mostly misplaced attention with the paper's)
    init_from_image: bool = False
    # the one vector the LSTM starts from (rnn; rnn-attention with init_from_image): the grid's mean, a
    # bag of features that keeps what is there but not where, or a learned map of the whole flattened
    # grid, as a CNN's last fully connected layer gives Show and Tell its image vector (it keeps the layout)
    image_vector: Literal[IMAGE_VECTORS] = "mean"

    SIZES = (
        "vocab_size",
        "image_size",
        "in_chans",
        "patch_size",
        "enc_layers",
        "dim",
        "emb_dim",
        "attention_dim",
        "layers",
        "heads",
        "mlp_dim",
        "context",
    )
    HELP = {
        "arch": "the decoder: rnn (an LSTM that sees the image once, no attention), rnn-attention (Show, Attend "
        "and Tell's soft attention) or transformer",
        "encoder": "the image encoder: a small CNN or a ViT, each giving a grid of feature vectors",
        "enc_layers": "--encoder vit: encoder blocks",
        "dim": "the decoder's width (the LSTM's state, or the Transformer's model width)",
        "emb_dim": "RNN decoders: word embedding width",
        "attention_dim": "rnn-attention: width of the additive attention's hidden layer",
        "layers": "--arch transformer: decoder blocks",
        "heads": "--arch transformer or --encoder vit: attention heads per layer",
        "mlp_dim": "--arch transformer or --encoder vit: hidden width of each block's MLP",
        "context": "the longest caption in tokens, <bos> included",
        "alpha_c": "rnn-attention: λ of the doubly stochastic attention regulariser (each pixel attended about "
        "once over the caption)",
        "init_from_image": "rnn-attention: start the LSTM from the mean image feature, as in the paper, instead "
        "of a learned start (then the image reaches the words only through attention)",
        "image_vector": "--arch rnn (or rnn-attention with --init-from-image): the one vector the LSTM starts "
        "from: mean (the grid's mean feature: what is there, not where) or flatten (a learned map of the whole "
        "grid, as a CNN's last layer: where things are too)",
    }

    def __post_init__(self) -> None:
        super().__post_init__()
        self.widths = tuple(self.widths)
        if self.encoder == "vit" and self.image_size % self.patch_size:
            raise ValueError(f"image_size {self.image_size} is not divisible by patch_size {self.patch_size}")
        if self.arch == "transformer" and self.dim % self.heads:
            raise ValueError(f"dim={self.dim} is not divisible by heads={self.heads}")
        if self.alpha_c < 0:
            raise ValueError(f"alpha_c must be 0 or more, got {self.alpha_c}")
        if self.image_vector != "mean" and not self.starts_from_image:
            raise ValueError(
                f"image_vector={self.image_vector!r} applies to arch rnn, or rnn-attention with init_from_image: "
                f"this {self.arch} decoder never starts from an image vector"
            )

    @property
    def starts_from_image(self) -> bool:
        """Whether the decoder starts from one image vector (h₀, c₀ = f(that vector)): the RNNs but
        rnn-attention's default, whose image reaches the words only through attention."""
        return self.arch == "rnn" or (self.arch == "rnn-attention" and self.init_from_image)

    @property
    def grid(self) -> tuple[int, int]:
        """(h, w) of the image grid the decoder attends over."""
        if self.encoder == "vit":
            g = self.image_size // self.patch_size
            return g, g
        return CNNConfig(widths=self.widths, image_size=self.image_size).grid
