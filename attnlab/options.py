"""Options: what ``attnlab train`` / ``eval`` / ``sample`` ... and their Python counterparts take,
declared once, in the typed signature of the function that uses them, and checked the same way
from both.

A parameter ``beam: Annotated[int, Arg("beam size", beam_width)] = 5`` (or a field of a config
dataclass written so) is an option: :func:`declared` reads it into an :class:`OptionSpecs` (the
options as data), from which the command line (:mod:`attnlab.cli`, on cyclopts) makes its flags,
:func:`checked` makes a verb check its keywords and :func:`check_fields` a config its fields. No
command-line library is imported here: a value checker raises ``ValueError`` with the reason, and
each interface words it its own way (``--lr: ...`` / ``lr=...: ...``).
"""

from __future__ import annotations

import collections.abc
import functools
import inspect
import math
from dataclasses import dataclass
from pathlib import Path
import typing
from typing import Annotated, Any, Callable, Literal, TypeVar, cast

from .errors import OptionError
from .outputs import is_path


# ---- value checkers: text (a flag) or a Python value -> the value, or ValueError saying why ------------
def number(kind: type, low, low_ok: bool, high=None, what: str = "", high_ok: bool = True) -> Callable[[str], Any]:
    """A checker: ``kind`` (int or float) from ``low`` (inclusive when ``low_ok``) up to ``high``
    (inclusive when ``high_ok``), finite."""

    def parse(text: str):
        try:
            v = kind(text)
        except ValueError:
            raise ValueError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        if kind is float and not math.isfinite(v):
            raise ValueError(f"{text!r} is not a finite number")
        if (low is not None and (v < low if low_ok else v <= low)) or (
            high is not None and (v > high if high_ok else v >= high)
        ):
            raise ValueError(f"{text} is out of range: must be {what}")
        return v

    parse.__name__ = kind.__name__  # the command line names the type in its messages
    parse.bounds = (kind, low, low_ok, high, high_ok)  # for the surfaces that build their checks from the specs (serve)
    return parse


def at_least(n: int):
    return number(int, n, True, what=f"at least {n}")


integer = number(int, None, True)
finite = number(float, None, True)
positive_int = at_least(1)
nonneg_int = number(int, 0, True, what="0 or more")
nonneg_float = number(float, 0.0, True, what="0 or more")
positive_float = number(float, 0.0, False, what="more than 0")
probability = number(float, 0.0, False, 1.0, what="in (0, 1]")
fraction = number(float, 0.0, True, 1.0, what="in [0, 1]")
below_one = number(float, 0.0, True, 0.99, what="in [0, 1)")
above_one = number(float, 1.0, False, what="above 1")  # a rotary base
unit_interval = number(float, 0.0, True, 1.0, what="in [0, 1)", high_ok=False)  # a decay, a momentum, a beta
MAX_BEAM = 100  # beyond this a beam costs minutes per sentence and gains nothing measurable
# tokens one generation call produces at most: about 20 minutes of decoding a small model on a CPU;
# more in one call is a mistake more often than a plan (generate in pieces, each from the last)
MAX_NEW_TOKENS = 1_000_000
# the largest vocabulary a tokenizer is trained to: 20x GPT-2's; a larger one is a typo, and the
# tokenizers library aborts the process (a Rust panic) rather than refuse it
MAX_VOCAB = 1 << 20


def vocab_size(low: int):
    return number(int, low, True, MAX_VOCAB, what=f"from {low} to {MAX_VOCAB:,}")


new_tokens = number(int, 1, True, MAX_NEW_TOKENS, what=f"from 1 to {MAX_NEW_TOKENS:,} (generate more in pieces)")
# a count the Python API takes (top_k, tokens, rows): more than this is a mistake, not a plan
MAX_COUNT = 1 << 24
seed_value = number(int, 0, True, 2**63 - 1, what="from 0 to 2**63 - 1 (a 64-bit generator seed)")
beam_width = number(int, 1, True, MAX_BEAM, what=f"from 1 (greedy) to {MAX_BEAM}")


def device_name(name: str) -> str:
    """``name`` if it names a device (auto, cpu, cuda, cuda:N), else ValueError saying so."""
    if name not in ("auto", "cpu", "cuda") and not (name.startswith("cuda:") and name[5:].isdigit()):
        raise ValueError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")
    return name


def input_lines(texts: list[str], file: str | None) -> list[str]:
    """A command's input lines: its arguments, else the lines of ``--file``, else standard input."""
    import sys

    if texts:
        return list(texts)
    if file:
        path = Path(file)
        if not path.is_file():  # (a FIFO without a writer would be read forever)
            raise ValueError(
                f"--file {path} " + ("is not a regular file; give a text file" if path.exists() else "does not exist")
            )
        try:
            return path.read_text(encoding="utf-8").splitlines()
        except UnicodeDecodeError as e:
            raise ValueError(f"--file {path} is not UTF-8 text (byte {e.start}); convert it to UTF-8") from None
    return sys.stdin.read().splitlines()


# ---- the Python API's own arguments (the ones no flag declares) ----------------------------------------
def path_argument(value: Any, name: str) -> Path:
    """``value`` as a path, or one line saying ``name`` takes a file or folder path."""
    if not is_path(value):
        raise OptionError(f"{name}={value!r}: must be a file or folder path (a non-empty string or a Path)")
    return Path(value)


def count_argument(value: Any, name: str, least: int = 1) -> int:
    """``value`` as a whole number of at least ``least`` (True is no count), or one line saying so."""
    if isinstance(value, bool) or not isinstance(value, int) or not least <= value <= MAX_COUNT:
        raise OptionError(f"{name}={value!r}: must be an integer from {least} to {MAX_COUNT:,}")
    return value


def texts_argument(texts: Any, what: str) -> tuple[list[str], bool]:
    """(the texts, whether one string was given) of a verb that reads a string or a list of them."""
    single = isinstance(texts, str)
    if not single and not isinstance(texts, (list, tuple)):
        raise OptionError(f"{what} needs a string or a list of strings, got {type(texts).__name__}")
    items = [texts] if single else list(texts)
    if not items or any(not isinstance(t, str) or not t.strip() for t in items):
        raise OptionError(f"{what} needs non-empty texts (a string or a list of them)")
    return items, single


# ---- declarations ---------------------------------------------------------------------------------------
KINDS = ("value", "flag", "bool", "append")  # a value | on when given | --x / --no-x | repeatable


@dataclass
class Option:
    """One declared option. ``flags``: its names, the first the main one (``"--max-len"``), or one
    bare name for a positional argument; ``nargs`` ("+", "*") makes a value a list."""

    dest: str
    flags: tuple[str, ...]
    type: Callable | None = None
    default: Any = None
    choices: tuple | None = None
    kind: str = "value"
    nargs: str | None = None
    help: str = ""
    metavar: str | None = None
    required: bool = False
    group: str | None = None
    annotation: Any = None  # its Python type as declared (``float``, ``Literal["a", "b"] | None``)

    @property
    def positional(self) -> bool:
        return not self.flags[0].startswith("-")


class OptionSpecs:
    """The options of one command or one Python call, in declaration order. An option declared
    twice (two families both read ``--out`` in ``eval``) is kept once."""

    def __init__(self, group: str | None = None) -> None:
        self.specs: dict[str, Option] = {}
        self._group = group

    def add(
        self,
        *flags: str,
        dest: str | None = None,
        type: Callable | None = None,
        default: Any = None,
        choices=None,
        kind: str = "value",
        nargs: str | None = None,
        help: str = "",
        metavar: str | None = None,
        required: bool = False,
        annotation: Any = None,
    ) -> None:
        if kind not in KINDS:
            raise ValueError(f"option kind {kind!r}: one of {KINDS}")
        long = next((f for f in flags if f.startswith("--")), flags[0])
        dest = dest or long.lstrip("-").replace("-", "_")
        if kind == "flag" and default is None:
            default = False
        choices = tuple(choices) if choices is not None else None
        if dest in self.specs:  # (declared by another verb or config too: one option, with both's names)
            known = self.specs[dest]
            known.flags += tuple(f for f in flags if f not in known.flags)
            return
        self.specs[dest] = Option(
            dest, tuple(flags), type, default, choices, kind, nargs, help, metavar, required, self._group, annotation
        )

    def merge(self, other: "OptionSpecs") -> None:
        """Add ``other``'s options (one declared here already gains its names)."""
        for name, spec in other.specs.items():
            if name in self.specs:
                self.specs[name].flags += tuple(f for f in spec.flags if f not in self.specs[name].flags)
            else:
                self.specs[name] = spec

    def __iter__(self):
        return iter(self.specs.values())

    def __contains__(self, name: str) -> bool:
        return name in self.specs

    # ---- checking values from Python --------------------------------------------------------------------
    def checked(self, given: dict, what: str) -> dict:
        """Every declared option -> its default, or the checked value ``given`` for it."""
        values = {n: s.default for n, s in self.specs.items()}
        for name, value in given.items():
            if name not in self.specs:
                raise OptionError(f"{what} has no option {name!r}; it takes {', '.join(sorted(self.specs))}")
            values[name] = self.check(name, value)
        return values

    def check(self, name: str, value: Any) -> Any:
        """``value`` for option ``name``, checked (and converted) as the command line would; None
        is "not given": the declared default (a family whose default is 0.1 gets 0.1, not None)."""
        spec = self.specs[name]
        if value is None:
            return spec.default
        if spec.kind in ("flag", "bool"):
            if not isinstance(value, bool):
                raise OptionError(f"{named(name, value, spec.flags[0])}: must be True or False")
            return value
        if spec.kind == "append" or spec.nargs in ("+", "*"):
            items = [value] if isinstance(value, (str, int, float, Path)) else list(value)
            return [self._one(spec, name, v) for v in items]
        return self._one(spec, name, value)

    @staticmethod
    def _one(spec: Option, name: str, value: Any) -> Any:
        if spec.type is not None and spec.type is not str:  # (a number from Python is a number, as in JSON)
            kind = getattr(spec.type, "bounds", (None,))[0]
            if isinstance(value, bool) or not isinstance(
                value, {int: int, float: (int, float)}.get(kind, (int, float, str))
            ):
                raise OptionError(f"{named(name, value, spec.flags[0])}: must be {takes(spec.type)}")
            try:
                value = spec.type(str(value))
            except ValueError as e:
                raise OptionError(f"{named(name, value, spec.flags[0])}: {e}") from None
        elif not isinstance(value, str):
            value = str(value) if isinstance(value, Path) else value
            if not isinstance(value, str):
                raise OptionError(f"{named(name, value, spec.flags[0])}: must be a string")
        if spec.choices is not None and value not in spec.choices:
            raise OptionError(f"{named(name, value, spec.flags[0])}: choose one of {', '.join(map(str, spec.choices))}")
        return value


def takes(checker: Callable) -> str:
    """What a value checker takes, in words: 'an integer', 'a number', else its name."""
    kind = getattr(checker, "bounds", (None,))[0]
    return {int: "an integer", float: "a number"}.get(kind) or getattr(checker, "__name__", "a value")


def named(name: str, value: Any, flag: str | None = None) -> str:
    """How an option is named in an error: its keyword and its flag (``flag``, else ``--the-name``),
    for Python and shell users alike."""
    shown = flag if flag and flag.startswith("--") else f"--{name.replace('_', '-')}"
    return f"{name}={value!r} ({shown})"


@dataclass
class Command:
    """A command (``attnlab sample``, ``translate``, ``bench`` ...): its help, and ``run``, a typed
    function whose signature declares the command's own options (:class:`Arg`) and which receives
    them, and those of ``verbs`` (the Python calls it makes, whose signatures declare theirs), as
    keywords: its flags are :func:`declared` ``(run, *verbs)``, after ``leading`` (options made at
    run time: ``inspect``'s WHAT, ``explore``'s inputs). ``specs``: the options of ``train FAMILY``
    (the family's options dataclass, its model config's fields and TrainConfig's, with the values a
    run given no options uses in their help), whose ``run`` reads them as one namespace."""

    name: str
    help: str
    description: str
    run: Callable[..., int | None]
    verbs: tuple[Callable, ...] = ()
    specs: OptionSpecs | None = None
    leading: OptionSpecs | None = None

    @property
    def options(self) -> OptionSpecs:
        if self.specs is not None:
            return self.specs
        options = declared(self.run, *self.verbs)
        if self.leading is not None:
            options.specs = {**self.leading.specs, **options.specs}
        return options


Verb = TypeVar("Verb", bound=Callable[..., Any])


# ---- a verb's typed signature is its declaration ---------------------------------------------------
@dataclass(frozen=True)
class Arg:
    """What a verb's parameter says beyond its type and default, as ``Annotated[int, Arg(...)]``:
    its help, the checker of its value (bounds and the words of a refusal) and, where the flag is
    not ``--the-name``, the flag's names (a bare name: a positional argument). A parameter so
    annotated is an option: the command line's flag, the keyword the verb checks (:func:`checked`)
    and the server's field are all made from the signature (:func:`declared`), so its default is
    written once, in the signature."""

    help: str = ""
    check: Callable[[str], Any] | None = None
    flags: tuple[str, ...] = ()
    metavar: str | None = None
    nargs: str | None = None


Device = Annotated[str, Arg("auto | cpu | cuda", device_name)]
DataDir = Annotated[str | None, Arg("folder holding named datasets (default: $ATTNLAB_DATA)")]
Beam = Annotated[int, Arg("beam size; 1 = greedy", beam_width)]
LengthPenalty = Annotated[float, Arg("beam search's length penalty exponent (GNMT; 0 = none)", nonneg_float)]
Which = Annotated[
    Literal["best", "last"] | None,
    Arg("a run folder's best/ (the default: best validation measure) or last/ (the final weights)"),
]


def shown_default(value: Any) -> str:
    """A default as --help states it: on/off, 0.001, 50,257."""
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, float):
        return f"{value:g}"
    return f"{value:,}" if isinstance(value, int) and value >= 10_000 else str(value)


def _choices(base: Any) -> tuple | None:
    """The values of a Literal type (within an Optional or a list too), else None."""
    if typing.get_origin(base) is Literal:
        return typing.get_args(base)
    for inner in typing.get_args(base):
        found = _choices(inner)
        if found:
            return found
    return None


def _is_list(base: Any) -> bool:
    sequences = (list, tuple, collections.abc.Sequence)
    return typing.get_origin(base) in sequences or any(typing.get_origin(a) in sequences for a in typing.get_args(base))


def _scalar(base: Any) -> type | None:
    """int, float, bool or str of a parameter's type (None, a list's items, Optional and a Literal's
    values unwrapped)."""
    if base in (int, float, bool, str):
        return base
    if typing.get_origin(base) is Literal:
        return type(typing.get_args(base)[0])
    for inner in typing.get_args(base):
        if inner is not type(None):
            found = _scalar(inner)
            if found is not None:
                return found
    return None


def _is_config(verb: Any) -> bool:
    """Whether ``verb`` is a config dataclass (:class:`attnlab.config.Config`): its fields are options
    of ``attnlab train`` whose value None is "not given", and those of the shared vocabulary need no
    :class:`Arg` (their help is :data:`attnlab.config.FIELD_HELP`'s)."""
    return inspect.isclass(verb) and hasattr(verb, "field_help") and hasattr(verb, "resolve_aliases")


def declared_parameters(verb: Callable) -> list[tuple[inspect.Parameter, Any, Arg]]:
    """(parameter, its type without the annotation, its :class:`Arg`) for each parameter of ``verb``
    annotated with an Arg, in the signature's order; of a config dataclass, every option-sized
    field (a number, a string, a bool, or None of one; a ``Literal``'s values its choices)."""
    verb = inspect.unwrap(verb)
    # a dataclass's fields, each in the namespace of the class that declares it (a base elsewhere)
    fields = typing.get_type_hints(verb, include_extras=True) if inspect.isclass(verb) else {}
    namespace = getattr(verb, "__globals__", None) or {}
    found = []
    # (a config's constructor takes its old names too: its dataclass __init__ is the declaration)
    parameters = list(inspect.signature(verb.__init__ if _is_config(verb) else verb).parameters.values())
    for param in parameters[1:] if _is_config(verb) else parameters:
        annotation = fields.get(param.name, param.annotation)
        if isinstance(annotation, str):
            try:
                annotation = eval(annotation, namespace)  # noqa: S307 (the verb's own annotation)
            except Exception:  # (a name imported for type checkers only: no option is declared so)
                if "Arg(" in annotation:
                    raise
                continue
        if typing.get_origin(annotation) is Annotated:
            base, *extras = typing.get_args(annotation)
            arg = next((e for e in extras if isinstance(e, Arg)), None)
            if arg is not None:
                found.append((param, base, arg))
        elif _is_config(verb) and _scalar(annotation) is not None and not _is_list(annotation):
            found.append((param, annotation, Arg(verb.field_help(param.name))))
    return found


def declared(
    *verbs: Callable, skip: tuple[str, ...] = (), shown: dict[str, str] | None = None, group: str | None = None
) -> OptionSpecs:
    """The options of ``verbs`` (a command's own stub first, then the Python call it makes): one
    per parameter annotated with an :class:`Arg` (of a config dataclass, every option-sized field),
    its flag ``--the-name`` (a config's old names too), its default the signature's (its help says
    it; ``shown``: the defaults to say instead, by name), its choices a ``Literal``'s, a bool an
    on/off flag, a list a repeatable flag (``nargs`` "+" or "*": several values after one flag).
    The same parameter in two verbs is declared once. A config's fields default to None: "not
    given", the run decides (its preset, its family's defaults, its data). ``group``: the title
    they are listed under in --help."""
    specs = OptionSpecs(group)
    for verb in verbs:
        config = _is_config(verb)
        for param, base, arg in declared_parameters(verb):
            name = param.name
            if name in skip:
                continue
            required = param.default is param.empty and not config
            default = None if required or config else param.default
            scalar = _scalar(base)
            old = [f"--{o.replace('_', '-')}" for o, n in getattr(verb, "ALIASES", {}).items() if n == name]
            flags = arg.flags or (f"--{name.replace('_', '-')}", *(old if config else ()))
            if shown is not None:
                text = f" (default: {shown[name]})" if shown.get(name) else ""
            else:
                text = "" if default in (None, False, "", (), []) else f" (default {shown_default(default)})"
            also = f"; also {', '.join(flags[1:])}" if config and flags[1:] else ""
            kw: dict[str, Any] = dict(dest=name, help=arg.help + text + also, metavar=arg.metavar, annotation=base)
            if scalar is bool:
                kw["kind"] = "flag" if default is False and not arg.flags and not config else "bool"
            else:
                many = _is_list(base)
                kw.update(
                    type=arg.check or {int: integer, float: finite}.get(scalar or str),
                    choices=_choices(base),
                    nargs=arg.nargs,
                    kind="append" if many and arg.nargs is None else "value",
                )
                if many and isinstance(default, tuple):
                    default = list(default)
            positional = not flags[0].startswith("-")
            specs.add(*flags, default=default, required=required and not positional, **kw)
    return specs


@functools.lru_cache(maxsize=None)
def field_checks(cls: type) -> OptionSpecs:
    """The fields of config dataclass ``cls`` that declare their own check (an :class:`Arg`'s
    checker or a ``Literal``'s choices): what its constructor checks, with the words and bounds
    the command line and :func:`attnlab.train` use."""
    specs, hints = declared(cls), typing.get_type_hints(cls, include_extras=True)
    own = [n for n in specs.specs if typing.get_origin(hints[n]) is Annotated or _choices(hints[n])]
    specs.specs = {n: specs.specs[n] for n in own}
    return specs


def check_fields(config: Any) -> None:
    """Check each field of ``config`` (a config dataclass) that declares its check (:func:`field_checks`)."""
    specs = field_checks(type(config))
    for name in specs.specs:
        value = getattr(config, name)
        if value is not None:
            specs.check(name, value)


def checked(verb: Verb) -> Verb:
    """Decorate a verb whose signature declares its options (:class:`Arg`): each keyword so
    declared is checked, with its bounds, choices and words, before the verb runs (None is "not
    given": the default). ``**keywords`` receiving declared options of other verbs are not checked
    here. The command line builds its flags from the same signature (:func:`declared`)."""
    signature = inspect.signature(verb)

    @functools.wraps(verb)
    def checked_verb(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        specs = declared_once(verb)
        for name, value in bound.arguments.items():
            spec = specs.specs.get(name)
            if spec is not None and not spec.positional and value is not None:
                bound.arguments[name] = specs.check(name, value)
        return verb(*bound.args, **bound.kwargs)

    return cast(Verb, checked_verb)


declared_once = functools.lru_cache(maxsize=None)(declared)  # (a verb's options, read once)


# ``--quantize``'s choices (attnlab.generate.quantize implements them; kept here, where no torch is imported,
# so that building the command line stays fast)
QUANTIZE_CHOICES = ("int8", "dynamic-int8", "int4", "packed")
QUANTIZE_HELP = (
    "CPU: int8 weights for every Linear layer, a quarter of fp32's bytes per token: int8 (weights only; 3.2x "
    "HuggingFace fp32 at GPT-2 small here) or dynamic-int8 (activations too; faster, rounds more); int4: 4-bit "
    "weights in groups of 32 with bf16 activations, an eighth of fp32's bytes (a GGUF file's Q4_0, Q4_1 and Q4_K "
    "weights as it stores them, any other model's rounded); or packed: the "
    "same fp32/bf16 weights in the GEMM library's packed layout (1.6-1.9x transformers on a Qwen2-0.5B's bf16 "
    "decoding here, the same tokens)"
)
QuantizeChoice = Literal[QUANTIZE_CHOICES]  # type: ignore[valid-type]
Quantize = Annotated[QuantizeChoice | None, Arg(QUANTIZE_HELP)]
DecodeDtype = Annotated[
    Literal["fp32", "bf16"],
    Arg("weights and activations while decoding; bf16 halves the memory read per token, which bounds generation on "
        "a CPU (about 1.9x faster here; tokens may differ slightly)"),
]  # fmt: skip


# Attribution (attnlab.inspect.attribution; each family's ``attribute`` verb and `attnlab inspect attribution`):
# its methods and the points on the integrated-gradients path, declared once with their defaults
ATTRIBUTION_METHODS = ("integrated_gradients", "gradient_x_input")
ATTRIBUTION_METHOD, ATTRIBUTION_STEPS = ATTRIBUTION_METHODS[0], 32
AttributionMethod = Annotated[
    Literal[ATTRIBUTION_METHODS],
    Arg("attribution: integrated_gradients (captum: pip install 'attnlab[interpret]') or gradient_x_input"),
]
AttributionSteps = Annotated[
    int, Arg("attribution: points on the integrated-gradients path (more: a smaller completeness gap)", positive_int)
]


# What activation patching (attnlab.inspect.patching) can patch: the hook point in every block, and what
# one patch covers: a position of a stream (B, T, D), a head at every position (B, H, T, ...), or a head
# at one position
PATCH_TARGETS = {
    "resid_pre": ("hook_resid_pre", "position"),
    "resid_mid": ("hook_resid_mid", "position"),
    "resid_post": ("hook_resid_post", "position"),
    "attn_out": ("hook_attn_out", "position"),
    "mlp_out": ("hook_mlp_out", "position"),
    "head": ("attn.hook_z", "head"),
    "head_position": ("attn.hook_z", "head_position"),
    "q": ("attn.hook_q", "head"),
    "k": ("attn.hook_k", "head"),
    "v": ("attn.hook_v", "head"),
    "pattern": ("attn.hook_pattern", "head"),
}
PATCH_OVER = tuple(
    k for k, (_, unit) in PATCH_TARGETS.items() if unit != "head_position"
)  # (`attnlab patch` draws 2-D)
PatchOver = Annotated[
    Literal[PATCH_OVER],
    Arg("resid_pre, resid_mid, resid_post, attn_out, mlp_out: layer x position; head (each head's output), q, k, v, "
        "pattern: layer x head"),
]  # fmt: skip
