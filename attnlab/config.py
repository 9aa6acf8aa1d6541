"""A base for the configuration dataclasses: to and from plain JSON-able dicts, checked.

Every config is strict: unknown fields, values of the wrong type and sizes that are not
positive (or absurdly large: validated before anything is allocated) are refused with a
``ValueError`` that names the field.

One vocabulary for the hyper-parameters every family shares (see the README):

    layers   blocks in the stack          (was GPT n_layer, ViT depth)
    heads    attention heads               (was GPT n_head)
    dim      model width                   (was GPT n_embd, RNN hidden)
    mlp_dim  feed-forward hidden width     (was Transformer ff_dim)
    context  the most tokens a model reads (was GPT block_size, seq2seq max_len)
    pos      positional encoding           (was GPT position)

A config's ``ALIASES`` maps the old names to these: the constructor, ``from_dict`` (so
checkpoints written before the change load) and attribute reads all accept them.
"""

from __future__ import annotations

import typing
from dataclasses import asdict, dataclass, fields

from .options import check_fields, declared_parameters

# The largest value any size field (vocabulary, width, context, layers) may take: far beyond
# any model attnlab can train, small enough that a corrupt config fails here and not in malloc.
MAX_SIZE = 1 << 24
# the names a config's ``norm`` and ``activation`` may take (:mod:`attnlab.blocks` builds them)
NORMS = ("layer", "rms")
ACTIVATIONS = ("gelu", "gelu_tanh", "relu", "relu2", "silu")


def _type_ok(value, typ) -> bool:
    origin, args = typing.get_origin(typ), typing.get_args(typ)
    if origin is typing.Union or (origin is not None and type(None) in args):
        return any(_type_ok(value, a) for a in args)
    if typ is type(None):
        return value is None
    if typ is bool:
        return isinstance(value, bool)
    if typ is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if typ is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if typ in (list, tuple) or origin in (list, tuple):
        return isinstance(value, (list, tuple))
    if isinstance(typ, type):
        return isinstance(value, typ)
    return True


class _ConfigType(type):
    """Lets the constructor take a field's old name (``GPTConfig(n_layer=2)``)."""

    def __call__(cls, *args, **kwargs):
        return super().__call__(*args, **cls.resolve_aliases(kwargs))


class Config(metaclass=_ConfigType):
    """Mixin for @dataclass configs. ``from_dict`` refuses unknown fields (a checkpoint of another
    model, or a typo) unless ``strict=False``. A field declares its check in its annotation: the
    values it may take as a ``Literal``, its help and bound as an :class:`~attnlab.options.Arg`
    (``lr: Annotated[float, Arg("...", positive_float)] = 1e-3``); the constructor, the command line
    and :func:`attnlab.train` then check it alike. A field of the shared vocabulary (``layers``,
    ``dropout``) takes its help from :data:`FIELD_HELP` (or the class's ``HELP``, where its meaning
    is the class's own). Subclasses list their size fields in ``SIZES`` (each an integer in
    1..MAX_SIZE) and call ``super().__post_init__()``."""

    SIZES: typing.ClassVar[tuple[str, ...]] = ()
    ALIASES: typing.ClassVar[dict[str, str]] = {}  # old name -> field
    HELP: typing.ClassVar[dict[str, str]] = {}  # field -> its help, where FIELD_HELP's does not fit

    def __init_subclass__(cls, **kwargs) -> None:
        super().__init_subclass__(**kwargs)
        for old, new in cls.__dict__.get("ALIASES", {}).items():  # reading cfg.n_layer gives cfg.layers
            setattr(cls, old, property(lambda self, new=new: getattr(self, new), doc=f"old name of {new}"))

    @classmethod
    def resolve_aliases(cls, d: dict) -> dict:
        """``d`` with old field names replaced by the current ones."""
        out = dict(d)
        for old, new in cls.ALIASES.items():
            if old in out:
                if new in out and out[new] != out[old]:
                    raise ValueError(
                        f"{cls.__name__}: both {new}={out[new]!r} and its old name {old}={out[old]!r} given"
                    )
                out[new] = out.pop(old)
        return out

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for f in fields(self):
            value = getattr(self, f.name)
            if not _type_ok(value, hints[f.name]):
                want = str(hints[f.name]).replace("typing.", "").replace("<class '", "").replace("'>", "")
                raise ValueError(f"{type(self).__name__}.{self.label(f.name)} must be {want}, got {value!r}")
        check_fields(self)  # (the fields declared with their bounds: Annotated[float, Arg(help, check)])
        for name in self.SIZES:
            v = getattr(self, name)
            if v is not None and not 1 <= v <= MAX_SIZE:
                raise ValueError(f"{self.label(name)} must be an integer from 1 to {MAX_SIZE}, got {v}")
        for f in fields(self):  # rates and ratios with the same meaning in every family
            v = getattr(self, f.name)
            if (f.name == "dropout" or f.name.endswith("_dropout")) and isinstance(v, float) and not 0 <= v < 1:
                raise ValueError(
                    f"--{f.name.replace('_', '-')} must be in [0, 1), got {v}: 1 would zero every activation it touches"
                )
            if f.name == "norm_eps" and isinstance(v, float) and not v > 0:
                raise ValueError(f"--norm-eps must be positive, got {v}: it keeps LayerNorm from dividing by zero")
            if f.name == "mlp_ratio" and isinstance(v, float) and not v > 0:
                raise ValueError(f"--mlp-ratio must be positive, got {v}: the MLP would have no hidden units")

    @classmethod
    def field_help(cls, name: str) -> str:
        """The help of field ``name`` not declared with an :class:`~attnlab.options.Arg`: its
        metadata's, the class's ``HELP``, else the shared vocabulary's (:data:`FIELD_HELP`); '' when
        none says. (:func:`attnlab.options.declared` asks the class, so options imports no config.)"""
        meta = {f.name: f.metadata for f in fields(cls)}[name]
        return meta.get("help") or cls.HELP.get(name) or FIELD_HELP.get(name, "")

    @classmethod
    def label(cls, name: str) -> str:
        """A field's name for messages, with its old names: ``context (block_size)``."""
        old = [o for o, n in cls.ALIASES.items() if n == name]
        return f"{name} ({', '.join(old)})" if old else name

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict, strict: bool = True):
        if not isinstance(d, dict):
            raise ValueError(f"a {cls.__name__} must be a JSON object, got {type(d).__name__}")
        d = cls.resolve_aliases(d)
        known = {f.name for f in fields(cls)}
        unknown = set(d) - known
        if unknown and strict:
            raise ValueError(f"unknown {cls.__name__} fields {sorted(unknown)}")
        return cls(**{k: v for k, v in d.items() if k in known})


# What each hyper-parameter of the shared vocabulary means: the --help of the option of that name
# in every family (a config's HELP, or a field's metadata "help", says it where its meaning differs).
FIELD_HELP = {
    # model
    "context": "the most tokens the model reads at once (nanoGPT's block_size)",
    "layers": "transformer blocks in the stack",
    "enc_layers": "encoder blocks",
    "dec_layers": "decoder blocks",
    "heads": "attention heads per layer (dim must divide by it)",
    "dim": "model width: the size of each token's vector in the residual stream",
    "mlp_dim": "hidden width of each block's MLP",
    "mlp_ratio": "hidden width of each block's MLP, as a multiple of dim",
    "emb_dim": "word embedding width",
    "dropout": "dropout probability while training (0: none)",
    "bias": "biases in the linear layers and LayerNorms",
    "qkv_bias": "biases in the query, key and value projections",
    "pos": "positional encoding",
    "activation": "the MLP's nonlinearity (gelu_tanh: GPT-2's gelu_new; relu2: ReLU squared, the speedrun's)",
    "norm_eps": "LayerNorm epsilon",
    "norm_first": "pre-LN blocks (LayerNorm before each sublayer) instead of the original post-LN",
    "tie_output": "the output layer shares the token embedding matrix",
    "share_embeddings": "one embedding matrix for source and target (only with a joint vocabulary)",
    "rel_distance": "--pos relative: distances beyond this many tokens share one table row",
    "type_vocab_size": "segment (token type) embeddings: BERT's sentence A and B",
    "image_size": "image side in pixels (square images)",
    "patch_size": "side of the square patches an image is cut into, in pixels",
    "pool": "what the classifier head reads: the class token (cls) or the mean of the patches (mean)",
    "peg": "conditional position encoding (CPVT's PEG): a depthwise convolution after the first block",
}


def option_fields(cls) -> list[str]:
    """The names of a config dataclass's option-sized fields (a number, a string, a bool, or None
    of one): each is an option of ``attnlab train`` and :func:`attnlab.train`. Lists and tuples (a
    CNN's widths) are set in Python only."""
    return [param.name for param, _, _ in declared_parameters(cls)]


@dataclass
class SpecialTokens:
    """The ids of a sequence model's special tokens, kept in its config (and so in config.json)
    so that the model, its loss and its decoders never assume them: padding (masked out of
    attention and of the loss), start and end of a sequence. The data's vocabulary sets them
    (:class:`attnlab.data.parallel.Vocab`); configs written before they were saved load with
    the values that vocabulary has always used."""

    pad_id: int = 0
    bos_id: int = 1
    eos_id: int = 2
