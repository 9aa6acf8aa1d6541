"""The ``attnlab`` command line, generated from the registry of recipes.

attnlab train FAMILY [--data PATH|NAME] [--out DIR] [--resume] ...   (gpt, vit, cnn, seq2seq, ...)
attnlab eval --ckpt DIR [--json]
attnlab inspect WHAT --ckpt DIR --out FILE.png
attnlab sample | translate | predict ...     (commands a family adds)
attnlab bench [--quick]
"""

from __future__ import annotations

import inspect
import os
import sys
import warnings
from typing import Annotated, Any, Literal

from .. import __version__
from ..errors import AttnlabError, Note, a, one_line
from ..options import Arg, Command, DataDir, DecodeDtype, Device, OptionSpecs, PatchOver, Quantize, Which
from cyclopts import App
from cyclopts.exceptions import CycloptsError

from .app import HELP_STYLE, add_command, error_line, new_app, with_defaults


def build_app(argv: list[str] | None = None) -> App:
    """The ``attnlab`` command line (see :func:`_build`)."""
    return _build(argv)[0]


def commands() -> dict[str, Command]:
    """Every command by its words (``"sample"``, ``"train gpt"``, ``"sae eval"``) -> its declaration."""
    return _build(None)[1]


def parse(argv: list[str]) -> tuple[Command, dict[str, Any]]:
    """(the command ``argv`` names, the options typed: name -> value) without running it; a bad
    command line raises cyclopts' error, a command line that names no command a ValueError."""
    app = build_app(argv)
    command, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)
    if not hasattr(command, "declaration"):
        raise ValueError(f"attnlab {' '.join(argv)} names no command")
    return command.declaration, command.typed(*bound.args, **bound.kwargs)


def _build(argv: list[str] | None) -> tuple[App, dict[str, Command]]:
    """The ``attnlab`` command line: ``train FAMILY`` from the registry of recipes, the families'
    own commands, then the commands every model shares (:func:`_commands`), each from its
    declaration. ``argv``: the words it will parse; only the command they name gets its options
    (the others, their name and help: enough to list them and to say which was meant), so that a
    command line is read in a fraction of a second; None: every command with its options
    (completion, tests)."""
    from .. import sae
    from ..recipes import recipes

    words = None if argv is None else [w for w in argv if not w.startswith("-")]

    def wanted(*path: str) -> bool:
        return words is None or words[: len(path)] == list(path)

    app = App(
        name="attnlab",
        help="Transformers the way they are taught: train, sample, evaluate and look inside.",
        version=f"attnlab {__version__}",
        **HELP_STYLE,
    )
    declarations: dict[str, Command] = {}

    def add(parent: App, path: tuple[str, ...], command: Command, call) -> None:
        declarations[" ".join(path)] = command
        add_command(parent, command, wanted(*path), call)

    families = recipes()
    train = new_app("train", f"train a model ({', '.join(r.name for r in families)})",
                    "Train a model with the shared trainer.")  # fmt: skip
    app.command(train)
    for r in families:
        full = wanted("train", r.name)
        command = Command(r.name, r.help, r.description, _train, specs=r.train_specs() if full else OptionSpecs())
        add(train, ("train", r.name), command, lambda given, r=r: _train(r, given))
    named = set()
    shared = [c for r in families for c in r.commands()] + _commands(
        families, claims=words is not None and wanted("reproduce")
    )
    for command in shared:
        if command.name not in named:  # a family built on another shares its commands
            named.add(command.name)
            add(app, (command.name,), command, _caller(command))
    sae_commands = [
        Command(
            "train", "train an SAE on one hook point", "Train a sparse autoencoder.", _sae_train, verbs=(sae.train,)
        ),
        Command(
            "eval",
            "L0, explained variance, dead latents, loss recovered",
            "Evaluate a sparse autoencoder: L0, explained variance, dead latents, and the next-token loss with "
            "the SAE spliced in against the clean model's and zero-ablation's.",
            _sae_eval,
            verbs=(sae.evaluate,),
        ),
        Command(
            "features",
            "an offline HTML page of the SAE's features",
            "Write an offline HTML page of the SAE's features: each latent's top activating contexts and "
            "its logit effects.",
            _sae_features,
            verbs=(sae.features,),
        ),
    ]
    sae_group = new_app("sae", "sparse autoencoders: train one on a hook point, evaluate it, draw its features",
                        SAE_DESCRIPTION)  # fmt: skip
    app.command(sae_group)
    for command in sae_commands:
        add(sae_group, ("sae", command.name), command, _caller(command))
    from ..data.shards import prepare

    data_commands = [
        Command("get", "download named datasets (shakespeare, mnist, ...), checked", DATA_GET_DESCRIPTION, _data_get),
        Command("list", "the named datasets: what each is, whether it is here, where", DATA_LIST_DESCRIPTION,
                _data_list),
        Command("prepare", "stream a corpus into token shards", DATA_DESCRIPTION, _data_prepare, verbs=(prepare,)),
    ]  # fmt: skip
    data_group = new_app("data", "get the lectures' datasets; prepare a corpus larger than memory into token shards")
    app.command(data_group)
    for command in data_commands:
        add(data_group, ("data", command.name), command, _caller(command))
    completion = Command(
        "completion", "print a shell completion script (bash, zsh or fish)", COMPLETION_DESCRIPTION, _completion
    )
    add(app, ("completion",), completion, _caller(completion))
    return app, declarations


def _caller(command: Command):
    """What runs ``command`` given the options typed: its function, with every option it takes (the
    typed value, else the declared default) as keywords."""
    taken = inspect.signature(command.run).parameters
    takes_all = any(p.kind is p.VAR_KEYWORD for p in taken.values())

    def call(given: dict[str, Any]) -> int | None:
        values = _resolve_model_names(with_defaults(command.options, given))
        return command.run(**{n: v for n, v in values.items() if takes_all or n in taken})

    return call


SAE_DESCRIPTION = (
    "A sparse autoencoder (ReLU with an L1 penalty, or top-k) trained on a GPT's activations at one hook point, "
    "streamed from its run's text; evaluated by L0, explained variance, dead latents and the next-token loss with the "
    "SAE spliced in (against the clean model and zero-ablation); its features as an offline HTML page (top activating "
    "contexts, logit effects)."
)
DATA_DESCRIPTION = (
    "Text files, folders, globs, compressed files (.gz, .bz2, .xz, .zst) or hf:NAME streamed, tokenised in batches "
    "and written as fixed-size token shards with an index (token counts, document starts, SHA-256s); memory stays "
    "bounded whatever the corpus's size, and a stopped preparation finishes where it stopped with the same bytes. "
    "Train on the folder with attnlab train gpt --data DIR."
)
DATA_GET_DESCRIPTION = (
    "Download named datasets into the data folder (--data-dir or ATTNLAB_DATA) or, when none is set, the user "
    "cache (ATTNLAB_CACHE moves it); each file is checked against its published SHA-256, and a stopped download "
    "resumes. Without a network it says which file to put where, with the checksum it expects. A file already "
    "here is checked, not downloaded again."
)
DATA_LIST_DESCRIPTION = (
    "The named datasets the trainers read with --data NAME: what each is, how many of its files are here (checked), "
    "where, and the command that trains on it."
)
COMPLETION_DESCRIPTION = (
    "Commands, options and option values completed with Tab. bash: 'eval \"$(attnlab completion bash)\"' in "
    "~/.bashrc; zsh: the same with zsh in ~/.zshrc; fish: 'attnlab completion fish > "
    "~/.config/fish/completions/attnlab.fish'."
)


def _commands(families, claims: bool = False) -> list[Command]:
    """The commands every model shares, each with its declared options and its run (``claims``: the
    help of ``reproduce`` lists them, a line each: their modules import torch, so only when asked)."""
    from .. import bench
    from ..experiments.report import reproduce
    from ..recipes.base import Evaluation, Verbs, explore_input_specs, predict
    from ..recipes.classifier import ImageClassifierVerbs
    from ..recipes.encoder import TextEncoderVerbs
    from ..recipes.gpt import GPTVerbs
    from ..serve import serve

    evaluations = (Evaluation, *(r.evaluate for r in families))  # (every family's eval options)
    inspections: dict[str, dict[str, list[str]]] = {}  # what -> its help -> the families that offer it so
    for r in families:
        for what, h in r.inspections.items():
            inspections.setdefault(what, {}).setdefault(h, []).append(r.name)
    what = OptionSpecs()  # (its choices: every family's inspections)
    what.add("what", choices=list(inspections), help="what to draw")
    return [
        Command("predict", "classify images or texts with a trained classifier",
                "Image classifiers: the top-k classes of each image file. Text classifiers: the label of each text, "
                "with the top-k probabilities.",
                predict, verbs=(ImageClassifierVerbs.predict, TextEncoderVerbs.predict)),
        Command("eval", "evaluate a trained model (loss/perplexity, accuracy, BLEU)",
                "Language models: loss, perplexity and bits per character/byte on the validation split. Image "
                "classifiers: accuracy on the test split and a confusion-matrix PNG. Seq2seq: perplexity and "
                "sacreBLEU on the test split.",
                _evaluate, verbs=evaluations),
        Command("ablate", "how much a metric changes when heads, neurons or sublayers are silenced",
                "Evaluates the model as `attnlab eval` does, then again with the --heads, --neurons and --sublayers "
                "writing nothing (--how zero) or their mean over each batch (--how mean), and prints both and the "
                "change. GPTs: loss and perplexity; image classifiers: accuracy. Give at least one of the three.",
                _ablate, verbs=evaluations),
        Command("patch", "activation patching: which layer and position (or head) carries an answer",
                "Run the corrupted input with one activation at a time taken from the clean run, and draw how much of "
                "the clean preference for --answer (over --wrong) each restores: 1 = all of it, 0 = none. GPTs: texts "
                "of the same token count and single-token answers; ViTs: two image files and class labels.",
                _patch, verbs=(GPTVerbs.patch, ImageClassifierVerbs.patch)),
        Command("inspect", "look inside a trained model (PNG + raw numbers)",
                "Each inspection writes a PNG and its numbers (.npz) beside it.\n\n" + "\n".join(
                    f"{what} ({', '.join(names)}): {h}" for what, helps in inspections.items()
                    for h, names in helps.items()),
                _inspect, verbs=tuple(r.inspect_options for r in families), leading=what),
        Command("explore", "write an offline HTML page to explore a model's attention",
                "One self-contained HTML file (no network, no server): GPT and text encoders (--text): head view, "
                "model view, next-token distribution; ViT (--image): click a patch, class-token attention, rollout, "
                "attention distance; seq2seq (--src [--tgt]): cross-attention per layer and head. Every view shows "
                "its values and saves PNG and JSON.",
                _explore, verbs=(Verbs.explore,), leading=explore_input_specs()),
        Command("serve", "serve the explorer locally, with an input box",
                "The explorer page of `attnlab explore`, served on this machine: type a text (GPT, text encoder), "
                "upload an image (ViT) or a sentence (seq2seq) and the views are recomputed. A GPT run also "
                "generates text (the page's second box), batching the requests that arrive together. Endpoints: GET / "
                "(the page), POST /explore (the page's data); a GPT's POST /generate (JSON {\"prompt\": ..., "
                "\"max_new_tokens\": ..., \"temperature\": ...}), OpenAI's POST /v1/completions and POST "
                "/v1/chat/completions (models with a chat template) and GET /v1/models, vLLM's POST /tokenize, POST "
                "/detokenize and GET /tokenizer_info; POST /reload reads the run's checkpoint again. Bound to "
                "127.0.0.1; requests from other origins are refused.",
                _serve, verbs=(serve,)),
        Command("export", "write a run as a HuggingFace folder (--hf) that transformers loads",
                "Writes config.json, model.safetensors and the tokenizer (with the end-of-sequence ids, sampling "
                "defaults and chat template the run keeps) that transformers' from_pretrained reads: a GPT as "
                "GPT2LMHeadModel (or the Llama, Qwen, Gemma, ... family it was initialised from), a ViT as "
                "ViTForImageClassification, a text encoder as a BERT model. Back: every attnlab command reads the "
                "folder as it is (--ckpt OUT, --init OUT, attnlab.load(OUT)).",
                _export),
        Command("reproduce", "check the lectures' claims on real runs; write a report",
                "Each claim: the lecture's statement, what was run on which data, the figure or table, the measured "
                "numbers, a stated criterion and a must-fail control run beside it; PASS (the control fails the "
                "criterion), FAIL, INCONCLUSIVE (the control clears it too, or seed noise straddles it) or SKIPPED "
                "(its data is absent), in OUT/report.md with its PNGs. The full size decides; --quick is a preview. "
                "attnlab reproduce --list adds where the lectures say each claim." + _claim_lines(claims),
                _reproduce, verbs=(reproduce,)),
        Command("bench", "benchmark attnlab against its peers and this machine's peak",
                "Attention, GPT training and generation, ViT and encoder-decoder training steps, each against a peer "
                "(HuggingFace, torch.nn) measured in the same run, with model FLOPs utilisation against the matmul "
                "peak measured at the start. Runs on CUDA when present.",
                _bench, verbs=(bench.run,)),
    ]  # fmt: skip


def _claim_lines(listed: bool) -> str:
    """The claims, a line each (name, title), after two newlines; "" unless ``listed``."""
    if not listed:
        return ""
    from ..experiments import CLAIMS

    return " The claims:\n\n" + "\n".join(f"  {name:<20} {c.title}" for name, c in CLAIMS.items())


def _train(recipe, given: dict[str, Any]) -> int:
    """``attnlab train NAME``: the options the user typed, passed to :func:`attnlab.api.train`
    (the rest is left to --config, then to the family)."""
    from ..api import train

    given = dict(given)
    out = given.pop("out", recipe.default_out)
    resume, config, data = given.pop("resume", False), given.pop("config", None), given.pop("data", None)
    train(recipe.name, data=data, out=out, resume=resume, config=config, **given)
    return 0


def _family(ckpt: str):
    from ..recipes import checkpoint_recipe

    return checkpoint_recipe(ckpt)


def _evaluated(ckpt: str, which: str | None, device: str, options: dict[str, Any]):
    """(the model in ``ckpt`` (its ``which`` checkpoint), the options of ``eval`` its family reads),
    refusing in one line another family's option given a value."""
    from ..api import load
    from ..checkpoint import pick_checkpoint
    from ..recipes import recipes
    from ..recipes.base import EVALUATION_FIELDS

    model = load(pick_checkpoint(ckpt, which), device=device)
    recipe = model.family_recipe()
    own = _own_options(recipe.name, options, recipe.evaluate, [r.evaluate for r in recipes()])
    return model, {**own, **{n: v for n, v in options.items() if n in EVALUATION_FIELDS}}


def _evaluate(
    ckpt: Annotated[str, Arg("run folder or checkpoint folder")],
    *,
    which: Which = None,
    json: Annotated[bool, Arg("print the metrics as one JSON object")] = False,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab eval``: the family's metrics of the model (``options``: its eval options), printed."""
    import json as json_text

    from ..recipes.base import evaluation

    model, own = _evaluated(ckpt, which, device, options)
    res, line = evaluation(model, own)
    print(json_text.dumps(res) if json else line)
    return 0


def _ablate(
    ckpt: Annotated[str, Arg("run folder of a GPT or a ViT")],
    *,
    heads: Annotated[str | None, Arg("attention heads: LAYER.HEAD, comma-separated (0.1,2.3)")] = None,
    neurons: Annotated[str | None, Arg("MLP neurons after the activation: LAYER.NEURON, comma-separated")] = None,
    sublayers: Annotated[str | None, Arg("whole sublayer outputs: LAYER.attn or LAYER.mlp, comma-separated")] = None,
    how: Annotated[Literal["zero", "mean"], Arg("zero or mean ablation")] = "zero",
    which: Which = None,
    json: Annotated[bool, Arg("print both results and the change as JSON")] = False,
    device: Device = "auto",
    **options: Any,
) -> int:
    """``attnlab ablate``: the family's metrics before and after silencing parts, and the change."""
    import json as json_text

    from ..errors import OptionError
    from ..inspect.patching import check_parts, describe_parts, parse_heads, parse_sublayers

    model, own = _evaluated(ckpt, which, device, options)
    if not (heads or neurons or sublayers):
        raise OptionError("attnlab ablate needs --heads, --neurons or --sublayers (what to silence)")
    parts = {
        "heads": parse_heads(heads) if heads else [],
        "neurons": parse_heads(neurons, "neuron") if neurons else [],
        "outputs": parse_sublayers(sublayers) if sublayers else [],
    }
    check_parts(model, how=how, **parts)
    spec = describe_parts(parts)
    before = model.evaluate(**own)
    after = model.evaluate(ablate=parts, ablation=how, **own)
    keys = [k for k in ("loss", "perplexity", "accuracy", "bleu", "exact_match") if k in before]
    change = {k: after[k] - before[k] for k in keys if isinstance(before[k], (int, float))}
    if json:
        print(json_text.dumps({"ablated": spec, "how": how, "before": before, "after": after, "change": change}))
    else:
        print(f"{how}-ablating {spec}: " + ", ".join(f"{k} {before[k]:.4f} -> {after[k]:.4f} ({change[k]:+.4f})"
                                                     for k in change))  # fmt: skip
    return 0


def _patch(
    ckpt: Annotated[str, Arg("run folder of a GPT or a ViT (or a HuggingFace GPT-2 / ViT folder)")],
    *,
    clean: Annotated[str, Arg("the input where the model gives the answer (text, or an image file)")],
    corrupt: Annotated[str, Arg("the input changed so the answer changes (same number of tokens)")],
    answer: Annotated[str, Arg("the clean input's answer: a next token (GPT) or a class (ViT)")],
    wrong: Annotated[str | None, Arg("the corrupted input's answer; without it the metric is log p(answer)")] = None,
    over: PatchOver = "resid_pre",
    out: Annotated[str, Arg("the heat map (PNG; its numbers in a .npz beside it)")],
    device: Device = "cpu",
) -> int:
    """``attnlab patch``: the loaded model's ``patch`` verb, drawn."""
    import warnings

    import numpy as np

    from ..api import load
    from ..errors import CheckpointError
    from ..inspect.patching import patching_figure, span_note
    from ..outputs import output_file

    out_file = output_file(out, ".png")
    model = load(ckpt, device=device)
    if not hasattr(model, "patch"):
        raise CheckpointError(f"{ckpt} holds {a(model.family_recipe().name)} model; attnlab patch reads GPTs and ViTs")
    with warnings.catch_warnings():  # (a small span is said below, in the report's own words)
        warnings.simplefilter("ignore")
        res = model.patch(clean, corrupt, answer, wrong, over=over)
    r, tokens = res["restored"], res["tokens"]
    patching_figure(r, out_file, over=over, labels=tokens, title=f"patching: answer {answer!r}")
    np.savez(out_file.with_suffix(".npz"), restored=r.numpy(), **({"tokens": np.array(tokens)} if tokens else {}))
    where = [divmod(i, r.shape[1]) for i in r.flatten().abs().topk(min(3, r.numel())).indices.tolist()]
    name = (lambda j: f"position {j} {tokens[j]!r}") if tokens else (lambda j: f"head {j}")
    print("; ".join(f"layer {i} {name(j)}: {r[i, j]:+.3f}" for i, j in where))
    print(f"metric clean {res['clean']:+.4f}, corrupt {res['corrupt']:+.4f}; {span_note(res['span'])}")
    print(f"wrote {out_file} and {out_file.with_suffix('.npz')}", file=sys.stderr)
    return 0


def _inspect(
    what: str,
    *,
    ckpt: Annotated[str, Arg("run folder")],
    out: Annotated[str, Arg("PNG file to write")],
    **options: Any,
) -> int:
    """``attnlab inspect WHAT``: the loaded model's ``inspect`` (``options``: its family's inspect options)."""
    from ..api import load
    from ..errors import CheckpointError
    from ..outputs import output_file
    from ..recipes import recipes

    out_file = output_file(out, ".png")
    recipe = _family(ckpt)
    if what not in recipe.inspections:
        owners = [r.name for r in recipes() if what in r.inspections]
        own = ", ".join(recipe.inspections) or "none"
        raise CheckpointError(
            f"inspect {what} needs {a(', '.join(owners[:-1]) + ' or ' + owners[-1] if len(owners) > 1 else owners[0])} "
            f"checkpoint; {ckpt} holds {a(recipe.name)} model, whose inspections are: {own}"
        )
    path = load(ckpt).inspect(
        what,
        out_file,
        **_own_options(recipe.name, options, recipe.inspect_options, [r.inspect_options for r in recipes()]),
    )
    print(f"wrote {path} and {path.with_suffix('.npz')}")
    return 0


def _own_options(family: str, options: dict[str, Any], own, every: list) -> dict[str, Any]:
    """The options among ``options`` (every family's, parsed) that the family's declaration ``own``
    takes; another family's option given a value other than its default is refused in one line."""
    from ..errors import OptionError
    from ..options import declared

    taken, known = declared(own).specs, declared(*every).specs
    for name, value in options.items():
        if name not in taken and name in known and value != known[name].default:
            raise OptionError(f"{known[name].flags[0]} is not read by {family} models; drop it")
    return {n: v for n, v in options.items() if n in taken}


def _explore(
    *,
    ckpt: Annotated[str, Arg("run folder (or HuggingFace folder)")],
    out: Annotated[str, Arg("HTML file to write")],
    device: Device = "cpu",
    generate: int = 0,
    sae: str | None = None,
    **inputs: str | None,
) -> int:
    """``attnlab explore``: the explorer's page of the model and the inputs given (``inputs``:
    every family's explorer inputs by name, None where not given)."""
    from pathlib import Path

    from ..api import load
    from ..inspect.explorer import write_page
    from ..outputs import output_file
    from ..recipes.base import explored, explored_inputs

    out_file = output_file(out, ".html", also=(".htm",))
    explored_inputs(_family(ckpt), ckpt, inputs, "--")  # (refused before the model is loaded)
    model = load(ckpt, device=device)
    data = explored(model, inputs, generate=generate, sae=sae, spelling="--")
    path = write_page(data, out_file, f"attnlab explorer: {Path(ckpt).name}")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser (it needs no network)")
    return 0


def _serve(
    ckpt: Annotated[str, Arg("run folder (or HuggingFace folder)")],
    *,
    device: Device = "cpu",
    dtype: DecodeDtype = "fp32",
    quantize: Quantize = None,
    **options: Any,
) -> int:
    """``attnlab serve``: the model loaded in the form asked, served (``options``: :func:`attnlab.serve.serve`'s)."""
    from .. import serve as served
    from ..api import load
    from ..recipes import checkpoint_recipe
    from ..recipes.gpt import as_sampled

    checkpoint_recipe(ckpt).required_explorer_form(ckpt)  # (refused before the model is loaded)

    def ready(server):
        host, port = server.server_address[:2]
        print(
            f"serving the explorer of {ckpt} at http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/ "
            "(Ctrl-C stops)",
            flush=True,
        )

    try:
        model = as_sampled(load(ckpt, device=device, dtype=None if dtype == "fp32" else dtype), quantize)
        served.serve(model, ready=ready, **options)
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0


def _reproduce(
    *,
    list: Annotated[bool, Arg("list the claims, one line each (what it checks, where the lectures say it), and exit")] = False,  # noqa: A002
    design: Annotated[bool, Arg("print the design of each claim (or of those named), fixed before it runs: what it measures, its criterion, the reason for its margins, its control and what that must show, its seeds, steps and data, and its hash; then exit")] = False,
    **options: Any,
) -> int:  # fmt: skip
    """``attnlab reproduce``: the claims, their progress on stderr, how many PASS (``--list``: the
    claims; ``--design``: their designs)."""
    from pathlib import Path

    from .. import experiments

    if design:
        from ..experiments.design import design_text
        from ..experiments.report import claim_names

        print(design_text(claim_names(options.get("names"))))
        return 0

    if list:
        from ..experiments.registry import COURSES

        for name, claim in experiments.CLAIMS.items():  # (every topic module imported: torch too)
            if isinstance(claim.source, str):
                where = "beyond the decks"
            else:
                lines: dict = {}
                for r in claim.source:
                    lines.setdefault(r.deck, []).append(str(r.line))
                where = "; ".join(f"{COURSES[d]} {d}:{', '.join(n)}" for d, n in lines.items())
            print(f"{name:<20} {claim.title} [{where}]")
        return 0

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results = experiments.reproduce(**options, log=log)
    passed = sum(r.status == "PASS" for r in results.values())
    print(f"{passed} of {len(results)} claims PASS; report: {Path(options.get('out') or 'reproduce') / 'report.md'}")
    return 0 if passed == len(results) else 1


def _export(
    ckpt: Annotated[str, Arg("the run folder (or checkpoint) to export", flags=("ckpt",))],
    out: Annotated[str, Arg("the folder to write (new, or empty)", flags=("out",))],
    *,
    hf: Annotated[bool, Arg("write a HuggingFace folder (the one format so far; say it, as later ones will)")] = False,
    which: Which = None,
) -> int:
    from pathlib import Path

    from ..api import load
    from ..checkpoint import pick_checkpoint
    from ..errors import OptionError
    from ..interop import export_hf

    if not hf:
        raise OptionError("name the format to write: --hf (a HuggingFace folder, the one format so far)")
    folder = Path(out).expanduser()
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise OptionError(f"{out} exists and is not an empty folder; give a new folder to write")
    model = load(pick_checkpoint(ckpt, which), device="cpu")
    export_hf(model, folder)
    print(f"wrote {out}: transformers' AutoModel*.from_pretrained({str(out)!r}) loads it; attnlab reads it as it is "
          f"(--ckpt {out})")  # fmt: skip
    return 0


def _bench(**options: Any) -> int:
    from .. import bench

    bench.run(**options)
    return 0


def _data_prepare(**options: Any) -> int:
    from ..data import shards

    shards.prepare(**options)
    print(f"wrote {options['out']}: train on it with attnlab train gpt --data {options['out']}")
    return 0


def _data_get(
    names: Annotated[tuple[str, ...], Arg("datasets to get (attnlab data list names them)", flags=("names",))],
    *,
    data_dir: DataDir = None,
    mirror: Annotated[
        str | None,
        Arg("a URL laid out like the data folder to read from instead of the publishers (file:///srv/data, "
            "a teacher's server; default: $ATTNLAB_DATA_MIRROR)"),
    ] = None,
) -> int:  # fmt: skip
    from tqdm import tqdm

    from ..data import sources

    for name in names:  # (an unknown name before any download)
        sources.files_of(name)
    bar: list = []  # (the file being downloaded, its progress bar: on a terminal only)

    def progress(file: str, done: int, total: int | None) -> None:
        if not bar or bar[0] != file:
            for _, shown in bar:
                shown.close()
            bar[:] = [(file, tqdm(total=total, unit="B", unit_scale=True, desc=file, leave=False, disable=None))]
        bar[0][1].update(done - bar[0][1].n)

    for name in names:
        try:
            paths = sources.get(name, data_dir, mirror, progress)
        except sources.DataMissing as e:
            if len(e.missing) > 1:  # (one file: the error line names it)
                for url, path, checksum in e.missing:
                    print(f"  put {url} at {path} ({checksum})", file=sys.stderr)
            raise
        finally:
            for _, shown in bar:
                shown.close()
            bar.clear()
        folder = os.path.commonpath([str(p.parent) for p in paths])
        print(f"{name}: {len(paths)} file{'s' * (len(paths) > 1)} checked in {folder}; {sources.DATASETS[name].use}")
    return 0


def _data_list(*, data_dir: DataDir = None) -> int:
    from ..data import sources

    print(f"{'name':<12} {'here':<6} {'what':<56} where / how to get it")
    for name, about in sources.DATASETS.items():
        held = sources.held(name, data_dir)
        where = str(held.folder) if held.present == held.files else f"attnlab data get {name}"
        print(f"{name:<12} {f'{held.present}/{held.files}':<6} {about.about:<56} {where}")
    print(
        f"looked in {sources.where_looked(data_dir)}. Built in, nothing to get: python-docs (text), digits (images), "
        f"scenes (captions), the synthetic tasks {', '.join(sources.SYNTHETIC)} (seq2seq)"
    )
    return 0


GPT_RUN = Annotated[str, Arg("run folder of a GPT")]
SAE_FOLDER = Annotated[str, Arg("folder written by attnlab sae train")]
SAE_MODEL = Annotated[str | None, Arg("the GPT (default: the run the SAE was trained on)")]


def _sae_model(ckpt: str | None, sae: str, saved: dict, device: str):
    from ..api import load
    from ..errors import CheckpointError

    ckpt = ckpt or saved.get("model")
    if not ckpt:
        raise CheckpointError(f"{sae} does not say which model it reads; give --ckpt")
    return load(ckpt, device=device)


def _sae_train(
    ckpt: GPT_RUN,
    *,
    out: Annotated[str, Arg("folder for sae.safetensors, sae.json and metrics.json")],
    device: Device = "auto",
    **options: Any,
) -> int:
    from .. import sae
    from ..api import load
    from ..inspect.sae import describe

    run = sae.train(load(ckpt, device=device), out=out, **options)
    print(describe(run.metrics))
    print(f"wrote {out}", file=sys.stderr)
    return 0


def _sae_eval(
    sae: SAE_FOLDER,
    *,
    ckpt: SAE_MODEL = None,
    json: Annotated[bool, Arg("print the metrics as one JSON object")] = False,
    device: Device = "auto",
    **options: Any,
) -> int:
    import json as json_text

    from .. import sae as saes
    from ..inspect.sae import describe, load_sae

    model_sae, saved = load_sae(sae)
    metrics = saes.evaluate(_sae_model(ckpt, sae, saved, device), model_sae, **options)
    print(json_text.dumps(metrics) if json else describe(metrics))
    return 0


def _sae_features(
    sae: SAE_FOLDER,
    *,
    out: Annotated[str, Arg("HTML file to write")],
    ckpt: SAE_MODEL = None,
    latents: Annotated[str | None, Arg("which latents, comma-separated (default: the --count most frequent)")] = None,
    device: Device = "auto",
    **options: Any,
) -> int:
    from .. import sae as saes
    from ..errors import OptionError
    from ..inspect.sae import load_sae
    from ..outputs import output_file

    out_file = output_file(out, ".html", also=(".htm",))
    model_sae, saved = load_sae(sae)
    chosen = None
    if latents:
        try:
            chosen = [int(x) for x in latents.split(",") if x.strip()]
        except ValueError:
            raise OptionError(f"--latents {latents!r}: give latent numbers, comma-separated (0,5,9)") from None
    path = saes.write_features(_sae_model(ckpt, sae, saved, device), model_sae, out_file, latents=chosen, **options)
    print(f"wrote {path}")
    return 0


def _completion(
    shell: Annotated[Literal["bash", "zsh", "fish"], Arg("the shell to complete in", flags=("shell",))],
) -> int:
    print(build_app().generate_completion(prog_name="attnlab", shell=shell))
    return 0


def _one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {one_line(message) if isinstance(message, Exception) else message}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # text from the shell that is not valid Unicode prints escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv = sys.argv[1:] if argv is None else list(argv)
    app = build_app(argv)  # (the live declarations: no module that declares an option imports torch)
    before = argv[: argv.index("--")] if "--" in argv else argv  # (after --, "--help" is a value)
    words = [t for t in before if t not in app.help_flags]
    if len(words) < len(before):  # --help or -h: drawn without parsing the options first (half the time)
        _, apps, unused = app.parse_commands(words)
        if apps[-1].default_command is not None or not unused or unused[0].startswith("-"):  # (else: a typo
            return _printed(app.help_print, words)  # of a command, which the parse names with "did you mean")
    try:
        command, bound, _ = app.parse_args(argv, exit_on_error=False, print_error=False)
    except CycloptsError as e:
        _report(f"error: {error_line(e)}")
        return 2
    if not hasattr(command, "declaration"):  # --help, --version, or a group named without its command
        return _printed(command, *bound.args, **bound.kwargs)
    try:
        with warnings.catch_warnings():  # (what the library warns of: one line each, as the errors)
            warnings.simplefilter("always", Note)
            warnings.showwarning = _one_line_warning
            return command(*bound.args, **bound.kwargs) or 0
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # (| head: the reader left; nothing more to say)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except Exception as e:
        interrupted = _imported("attnlab.training.trainer", "TrainingInterrupted")
        if interrupted is not None and isinstance(e, interrupted):  # (Ctrl-C in training: its checkpoint saved)
            print(f"\n{e}", file=sys.stderr)
            return 130
        if isinstance(e, (AttnlabError, ValueError, OSError)):
            _report(f"error: {one_line(e)}")  # (reported first, then cleaned up)
            _abandon_new_runs()
            _let_peers_report()
            return 2
        # a bug, or a case nobody foresaw: still one line, the traceback on request
        _abandon_new_runs()
        if os.environ.get("ATTNLAB_DEBUG"):
            raise
        peer = lost_peer(e)
        if peer:
            _report(f"error: {peer}")
            return 2
        _report(
            f"error: unexpected {type(e).__name__}: {one_line(e)} (set ATTNLAB_DEBUG=1 to see the traceback, "
            "and please report it)"
        )
        return 1
    finally:
        release = _imported("attnlab.checkpoint", "release_runs")
        if release is not None:
            release()


def _printed(show, *args, **kwargs) -> int:
    """0 once ``show`` has printed (help, the version), a reader that left early (``| head``) included."""
    try:
        show(*args, **kwargs)
    except (BrokenPipeError, SystemExit):  # (the reader left, which rich answers with exit 1: nothing to say)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def _imported(module: str, name: str):
    """``name`` of ``module`` when the command has imported that module (one that trains or loads a
    model has), else None: help and completion import no torch to clean up after nothing."""
    found = sys.modules.get(module)
    return getattr(found, name, None) if found is not None else None


def _abandon_new_runs() -> None:
    abandon = _imported("attnlab.checkpoint", "abandon_new_runs")
    if abandon is not None:
        abandon()


# what gloo and NCCL say when another process of the launch died (killed, out of memory, a crash)
PEER_SIGNS = ("Connection closed by peer", "Connection reset by peer", "GLHF", "Broken pipe", "NCCL", "timed out")


def lost_peer(e: BaseException) -> str | None:
    """For an error of a torchrun worker whose cause is another worker's death, the line to say
    instead of the backend's own; None otherwise."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    text = f"{type(e).__name__}: {e}"
    if world <= 1 or not any(sign in text for sign in PEER_SIGNS):
        return None
    rank = os.environ.get("RANK", "?")
    return (
        f"rank {rank} of {world}: another process of this torchrun launch stopped (its own log says why: killed, "
        "out of memory, an error); the last checkpoint is intact: run the same command with --resume"
    )


def _resolve_model_names(values: dict[str, Any]) -> dict[str, Any]:
    """--ckpt, --init and --draft may name a HuggingFace hub model (gpt2): its cached folder."""
    from ..hub import resolve

    for option in ("ckpt", "init", "draft"):
        value = values.get(option)
        if isinstance(value, str) and value:
            values[option] = str(resolve(value))
    return values


def _report(line: str) -> None:
    """One line to stderr in one write: under torchrun every rank shares the stream, and print()'s
    separate write of the newline let two ranks' lines run together."""
    sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _let_peers_report(seconds: float = 1.0) -> None:
    """Under torchrun, a rank that exits makes the launcher stop the others at once. Errors found
    together (a NaN loss is all-reduced, so every rank sees it at the same step) should reach the
    user from every rank, so a failing rank waits a moment before it exits."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        import time

        time.sleep(seconds)


if __name__ == "__main__":
    raise SystemExit(main())
