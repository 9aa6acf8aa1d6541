"""The ``attnlab`` command line, generated from the registry of recipes.

attnlab train FAMILY [--data PATH|NAME] [--out DIR] [--resume] ...   (gpt, vit, cnn, seq2seq, ...)
attnlab eval --ckpt DIR [--json]
attnlab inspect WHAT --ckpt DIR --out FILE.png
attnlab sample | translate | predict ...     (commands a family adds)
attnlab bench [--quick]
"""

from __future__ import annotations

import argparse
import os
import sys

from .. import __version__
from ..errors import AttnlabError, a, one_line
from ..options import Command, OptionSpecs, keywords_of
from .parser import EPILOG, Parser, option_parser


def build_parser() -> argparse.ArgumentParser:
    """The ``attnlab`` parser: ``train FAMILY`` from the registry of recipes, the families' own
    commands, then the commands every model shares (:func:`_commands`), each from its declaration."""
    from ..recipes import recipes
    from ..sae import eval_specs, features_specs, train_specs

    p = Parser(
        prog="attnlab",
        epilog=EPILOG,
        description="Transformers the way they are taught: train, sample, evaluate and look inside.",
    )
    p.add_argument("--version", action="version", version=f"attnlab {__version__}")
    sub = p.add_subparsers(dest="command", metavar="COMMAND", parser_class=Parser)
    families = recipes()
    train = [
        Command(r.name, r.help, r.description, r.train_specs(), lambda args, r=r: _train(r, args)) for r in families
    ]
    _group(sub, "train", "model", f"train a model ({', '.join(r.name for r in families)})", train,
           description="Train a model with the shared trainer.")  # fmt: skip
    for r in families:
        for command in r.commands():
            if command.name not in sub.choices:  # a family built on another shares its commands
                _command(sub, command)
    for command in _commands(families):
        if command.name == "inspect":  # (its description lists every family's inspections, a line each)
            _command(sub, command, formatter_class=argparse.RawDescriptionHelpFormatter)
        else:
            _command(sub, command)
    sae = [
        Command("train", "train an SAE on one hook point", "Train a sparse autoencoder.", train_specs(), _sae_train),
        Command(
            "eval",
            "L0, explained variance, dead latents, loss recovered",
            "Evaluate a sparse autoencoder: L0, explained variance, dead latents, and the next-token loss with "
            "the SAE spliced in against the clean model's and zero-ablation's.",
            eval_specs(),
            _sae_eval,
        ),
        Command(
            "features",
            "an offline HTML page of the SAE's features",
            "Write an offline HTML page of the SAE's features: each latent's top activating contexts and "
            "its logit effects.",
            features_specs(),
            _sae_features,
        ),
    ]
    _group(sub, "sae", "sae_command", "sparse autoencoders: train one on a hook point, evaluate it, draw its features",
           sae, metavar="WHAT", description=SAE_DESCRIPTION)  # fmt: skip
    from ..data.shards import prepare_specs

    prepare = Command("prepare", "stream a corpus into token shards", DATA_DESCRIPTION, prepare_specs(), _data_prepare)
    _group(sub, "data", "data_command", "prepare a corpus larger than memory into token shards", [prepare],
           metavar="WHAT", description=DATA_DESCRIPTION)  # fmt: skip
    shells = OptionSpecs()
    shells.add("shell", choices=["bash", "zsh", "fish"], help="the shell to complete in")
    _command(sub, Command("completion", "print a shell completion script (bash, zsh or fish)", COMPLETION_DESCRIPTION,
                          shells, _completion))  # fmt: skip
    return p


def _command(sub, command: Command, **kw) -> None:
    """``command`` as a subcommand of ``sub``: its flags from its declared options."""
    parser = option_parser(sub, command.name, command.options, help=command.help, description=command.description, **kw)
    parser.set_defaults(func=command.run)


def _group(sub, name: str, dest: str, help: str, commands: list[Command], metavar: str | None = None, **kw) -> None:
    """A command ``name`` whose subcommands are ``commands`` (``attnlab train gpt``, ``attnlab sae eval``)."""
    group = sub.add_parser(name, help=help, epilog=EPILOG, **kw)
    inner = group.add_subparsers(dest=dest, metavar=metavar or dest.upper(), parser_class=Parser)
    for command in commands:
        _command(inner, command)


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
COMPLETION_DESCRIPTION = (
    "Commands, options and option values completed with Tab. bash: 'eval \"$(attnlab completion bash)\"' in "
    "~/.bashrc; zsh: the same with zsh in ~/.zshrc; fish: 'attnlab completion fish > "
    "~/.config/fish/completions/attnlab.fish'."
)


def _commands(families) -> list[Command]:
    """The commands every model shares, each with its declared options and its run."""
    from ..bench import bench_specs
    from ..experiments import CLAIMS, reproduce_specs
    from ..recipes.base import explore_specs, patch_specs, predict_specs
    from ..serve import serve_specs

    ablations = _eval_options(families, "run folder of a GPT or a ViT", "print both results and the change as JSON")
    ablations.add("--heads", default=None, help="attention heads: LAYER.HEAD, comma-separated (0.1,2.3)")
    ablations.add("--neurons", default=None, help="MLP neurons after the activation: LAYER.NEURON, comma-separated")
    ablations.add("--sublayers", default=None, help="whole sublayer outputs: LAYER.attn or LAYER.mlp, comma-separated")
    ablations.add("--how", choices=["zero", "mean"], default="zero", help="zero (default) or mean ablation")
    inspections: dict[str, dict[str, list[str]]] = {}  # what -> its help -> the families that offer it so
    for r in families:
        for what, h in r.inspections.items():
            inspections.setdefault(what, {}).setdefault(h, []).append(r.name)
    inspects = OptionSpecs()
    inspects.add("what", choices=list(inspections), help="what to draw")
    inspects.add("--ckpt", required=True, help="run folder")
    inspects.add("--out", required=True, help="PNG file to write")
    inspects.add("--data-dir", default=None, help="folder holding named datasets (default: $ATTNLAB_DATA)")
    for r in families:
        r.add_inspect_arguments(inspects)
    return [
        Command("predict", "classify images or texts with a trained classifier",
                "Image classifiers: the top-k classes of each image file. Text classifiers: the label of each text, "
                "with the top-k probabilities.",
                predict_specs(), lambda args: _family(args.ckpt).predict(args)),
        Command("eval", "evaluate a trained model (loss/perplexity, accuracy, BLEU)",
                "Language models: loss, perplexity and bits per character/byte on the validation split. Image "
                "classifiers: accuracy on the test split and a confusion-matrix PNG. Seq2seq: perplexity and "
                "sacreBLEU on the test split.",
                _eval_options(families, "run folder or checkpoint folder", "print the metrics as one JSON object"),
                _evaluate),
        Command("ablate", "how much a metric changes when heads, neurons or sublayers are silenced",
                "Evaluates the model as `attnlab eval` does, then again with the --heads, --neurons and --sublayers "
                "writing nothing (--how zero) or their mean over each batch (--how mean), and prints both and the "
                "change. GPTs: loss and perplexity; image classifiers: accuracy. Give at least one of the three.",
                ablations, _ablate),
        Command("patch", "activation patching: which layer and position (or head) carries an answer",
                "Run the corrupted input with one activation at a time taken from the clean run, and draw how much of "
                "the clean preference for --answer (over --wrong) each restores: 1 = all of it, 0 = none. GPTs: texts "
                "of the same token count and single-token answers; ViTs: two image files and class labels.",
                patch_specs(), _patch),
        Command("inspect", "look inside a trained model (PNG + raw numbers)",
                "Each inspection writes a PNG and its numbers (.npz) beside it.\n\n" + "\n".join(
                    f"{what} ({', '.join(names)}): {h}" for what, helps in inspections.items()
                    for h, names in helps.items()),
                inspects, _inspect),
        Command("explore", "write an offline HTML page to explore a model's attention",
                "One self-contained HTML file (no network, no server): GPT and text encoders (--text): head view, "
                "model view, next-token distribution; ViT (--image): click a patch, class-token attention, rollout, "
                "attention distance; seq2seq (--src [--tgt]): cross-attention per layer and head. Every view shows "
                "its values and saves PNG and JSON.",
                explore_specs(), _explore),
        Command("serve", "serve the explorer locally, with an input box",
                "The explorer page of `attnlab explore`, served on this machine: type a text (GPT, text encoder), "
                "upload an image (ViT) or a sentence (seq2seq) and the views are recomputed. A GPT run also "
                "generates text (the page's second box, or POST /generate with JSON {\"prompt\": ..., "
                "\"max_new_tokens\": ..., \"temperature\": ...}), batching the requests that arrive together. Bound "
                "to 127.0.0.1; requests from other origins are refused.",
                serve_specs(), _serve),
        Command("reproduce", "check the lectures' claims on real runs; write a report",
                "Each claim: the lecture's statement, what was run on which data, the figure or table, the measured "
                "numbers, a stated criterion and a must-fail control run beside it; PASS (the control fails the "
                "criterion), FAIL, INCONCLUSIVE (the control clears it too, or seed noise straddles it) or SKIPPED "
                "(its data is absent), in OUT/report.md with its PNGs. Claims: " + ", ".join(CLAIMS),
                reproduce_specs(), _reproduce),
        Command("bench", "benchmark attnlab against its peers and this machine's peak",
                "Attention, GPT training and generation, ViT and encoder-decoder training steps, each against a peer "
                "(HuggingFace, torch.nn) measured in the same run, with model FLOPs utilisation against the matmul "
                "peak measured at the start. Runs on CUDA when present.",
                bench_specs(), _bench),
    ]  # fmt: skip


def _eval_options(families, ckpt_help: str, json_help: str) -> OptionSpecs:
    """The options of ``eval`` (and ``ablate``): the checkpoint, every family's eval options, --json."""
    from ..recipes import Recipe

    specs = OptionSpecs()
    specs.add("--ckpt", required=True, help=ckpt_help)
    Recipe.add_common_eval_arguments(specs)
    specs.add("--json", kind="flag", help=json_help)
    specs.add_device()
    for r in families:
        r.add_eval_arguments(specs)
    return specs


def _train(recipe, args) -> int:
    """``attnlab train NAME``: the options the user gave, passed to :func:`attnlab.api.train`."""
    from ..api import train

    specs = recipe.train_specs()
    typed = _typed_flags(getattr(args, "argv", []), specs)
    # what the user gave: the flags typed, and any value that is not the flag's default (an
    # abbreviated flag); the rest is left to --config, then to the family
    given = {
        k: getattr(args, k)
        for k, spec in specs.specs.items()
        if k in typed or getattr(args, k, None) not in (None, spec.default)
    }
    for passed_apart in ("data", "out", "resume", "config"):
        given.pop(passed_apart, None)
    if args.config is None:  # the command line's own defaults where Python's differ (--sample-chars 300)
        from ..api import PYTHON_DEFAULTS

        given.update({k: getattr(args, k) for k in PYTHON_DEFAULTS if k in specs and k not in given})
    train(recipe.name, data=getattr(args, "data", None), out=args.out, resume=args.resume, config=args.config, **given)
    return 0


def _typed_flags(argv: list[str], specs) -> set[str]:
    """The options among ``specs`` whose flag (or --no- flag) appears in ``argv``."""
    words = {w.split("=", 1)[0] for w in argv if w.startswith("--")}
    return {
        spec.dest
        for spec in specs
        if any(f in words or f"--no-{f[2:]}" in words for f in spec.flags if f.startswith("--"))
    }


def _family(ckpt: str):
    from ..recipes import checkpoint_recipe

    return checkpoint_recipe(ckpt)


def _evaluate(args) -> int:
    import json

    res, line = _family(args.ckpt).evaluate_checkpoint(args)
    print(json.dumps(res) if args.json else line)
    return 0


def _ablate(args) -> int:
    import json

    from ..api import load
    from ..errors import OptionError
    from ..inspect.patching import check_parts, describe_parts, parse_heads, parse_sublayers

    model = load(args.ckpt, device=args.device)
    if not (args.heads or args.neurons or args.sublayers):
        raise OptionError("attnlab ablate needs --heads, --neurons or --sublayers (what to silence)")
    parts = {
        "heads": parse_heads(args.heads) if args.heads else [],
        "neurons": parse_heads(args.neurons, "neuron") if args.neurons else [],
        "outputs": parse_sublayers(args.sublayers) if args.sublayers else [],
    }
    check_parts(model, how=args.how, **parts)
    spec = describe_parts(parts)
    own = model.family_recipe().eval_specs().specs  # this family's eval options (others have defaults too)
    options = {k: getattr(args, k) for k in own if k not in ("data", "split") and getattr(args, k, None) is not None}
    before = model.evaluate(args.data, split=args.split, **options)
    after = model.evaluate(args.data, split=args.split, ablate=parts, ablation=args.how, **options)
    keys = [k for k in ("loss", "perplexity", "accuracy", "bleu", "exact_match") if k in before]
    change = {k: after[k] - before[k] for k in keys if isinstance(before[k], (int, float))}
    if args.json:
        print(json.dumps({"ablated": spec, "how": args.how, "before": before, "after": after, "change": change}))
    else:
        print(
            f"{args.how}-ablating {spec}: "
            + ", ".join(f"{k} {before[k]:.4f} -> {after[k]:.4f} ({change[k]:+.4f})" for k in change)
        )
    return 0


def _patch(args) -> int:
    """``attnlab patch``: the loaded model's ``patch`` verb, drawn."""
    import numpy as np

    from ..api import load
    from ..errors import CheckpointError
    import warnings

    from ..inspect.patching import patching_figure, span_note
    from ..outputs import output_file

    out = output_file(args.out, ".png")
    model = load(args.ckpt, device=args.device)
    if not hasattr(model, "patch"):
        raise CheckpointError(
            f"{args.ckpt} holds {a(model.family_recipe().name)} model; attnlab patch reads GPTs and ViTs"
        )
    with warnings.catch_warnings():  # (a small span is said below, in the report's own words)
        warnings.simplefilter("ignore")
        res = model.patch(args.clean, args.corrupt, args.answer, args.wrong, over=args.over)
    r, tokens = res["restored"], res["tokens"]
    patching_figure(r, out, over=args.over, labels=tokens, title=f"patching: answer {args.answer!r}")
    np.savez(out.with_suffix(".npz"), restored=r.numpy(), **({"tokens": np.array(tokens)} if tokens else {}))
    where = [divmod(i, r.shape[1]) for i in r.flatten().abs().topk(min(3, r.numel())).indices.tolist()]
    name = (lambda j: f"position {j} {tokens[j]!r}") if tokens else (lambda j: f"head {j}")
    print("; ".join(f"layer {i} {name(j)}: {r[i, j]:+.3f}" for i, j in where))
    print(f"metric clean {res['clean']:+.4f}, corrupt {res['corrupt']:+.4f}; {span_note(res['span'])}")
    print(f"wrote {out} and {out.with_suffix('.npz')}", file=sys.stderr)
    return 0


def _inspect(args) -> int:
    from ..errors import CheckpointError
    from ..recipes import recipes

    from ..outputs import output_file

    args.out = str(output_file(args.out, ".png"))
    recipe = _family(args.ckpt)
    if args.what not in recipe.inspections:
        owners = [r.name for r in recipes() if args.what in r.inspections]
        raise CheckpointError(
            f"inspect {args.what} needs {a(' or '.join(owners))} checkpoint; {args.ckpt} holds {a(recipe.name)} model"
        )
    return recipe.inspect(args)


def _explore(args) -> int:
    from pathlib import Path

    from ..errors import OptionError
    from ..inspect.explorer import write_page
    from ..outputs import output_file
    from ..recipes.base import explore_inputs, explored_inputs

    args.out = str(output_file(args.out, ".html", also=(".htm",)))
    recipe = _family(args.ckpt)
    explored_inputs(recipe, args.ckpt, {name: getattr(args, name) for name in explore_inputs()}, "--")
    if args.sae and recipe.name != "gpt":
        raise OptionError(f"--sae shows an SAE's latents on a GPT's text; {args.ckpt} holds {a(recipe.name)} model")
    data = recipe.explore(args)
    path = write_page(data, args.out, f"attnlab explorer: {Path(args.ckpt).name}")
    print(f"wrote {path} ({path.stat().st_size / 1e6:.2f} MB); open it in a browser (it needs no network)")
    return 0


def _serve(args) -> int:
    from ..api import load
    from ..serve import serve

    _family(args.ckpt).required_explorer_form(args.ckpt)  # (refused before the model is loaded)

    def ready(server):
        host, port = server.server_address[:2]
        print(
            f"serving the explorer of {args.ckpt} at http://{'127.0.0.1' if host == '0.0.0.0' else host}:{port}/ "
            "(Ctrl-C stops)",
            flush=True,
        )

    from ..recipes.gpt import as_sampled

    try:
        model = as_sampled(
            load(args.ckpt, device=args.device, dtype=None if args.dtype == "fp32" else args.dtype), args
        )
        serve(model, **keywords_of(serve, args, ready=ready))
    except KeyboardInterrupt:
        print("stopped", file=sys.stderr)
    return 0


def _reproduce(args) -> int:
    from pathlib import Path

    from ..experiments import reproduce

    log = lambda m: print(m, file=sys.stderr, flush=True)  # noqa: E731
    results = reproduce(**keywords_of(reproduce, args, log=log))
    passed = sum(r.status == "PASS" for r in results.values())
    print(f"{passed} of {len(results)} claims PASS; report: {Path(args.out) / 'report.md'}")
    return 0 if passed == len(results) else 1


def _bench(args) -> int:
    from ..bench import run

    run(**keywords_of(run, args))
    return 0


def _data_prepare(args) -> int:
    from ..data.shards import prepare

    prepare(**keywords_of(prepare, args))
    print(f"wrote {args.out}: train on it with attnlab train gpt --data {args.out}")
    return 0


def _sae_model(args, saved: dict):
    from ..api import load
    from ..errors import CheckpointError

    ckpt = args.ckpt or saved.get("model")
    if not ckpt:
        raise CheckpointError(f"{args.sae} does not say which model it reads; give --ckpt")
    return load(ckpt, device=args.device)


def _sae_train(args) -> int:
    from .. import sae
    from ..api import load

    run = sae.train(load(args.ckpt, device=args.device), **keywords_of(sae.train, args))
    from ..inspect.sae import describe

    print(describe(run.metrics))
    print(f"wrote {args.out}", file=sys.stderr)
    return 0


def _sae_eval(args) -> int:
    import json

    from .. import sae
    from ..inspect.sae import describe, load_sae

    model_sae, saved = load_sae(args.sae)
    metrics = sae.evaluate(_sae_model(args, saved), model_sae, data=args.data)
    print(json.dumps(metrics) if args.json else describe(metrics))
    return 0


def _sae_features(args) -> int:
    from .. import sae
    from ..errors import OptionError
    from ..inspect.sae import load_sae
    from ..outputs import output_file

    out = output_file(args.out, ".html", also=(".htm",))
    model_sae, saved = load_sae(args.sae)
    latents = None
    if args.latents:
        try:
            latents = [int(x) for x in args.latents.split(",") if x.strip()]
        except ValueError:
            raise OptionError(f"--latents {args.latents!r}: give latent numbers, comma-separated (0,5,9)") from None
    path = sae.write_features(
        _sae_model(args, saved), model_sae, out, latents=latents, count=args.count, data=args.data
    )
    print(f"wrote {path}")
    return 0


def _completion(args) -> int:
    from .completion import script
    from .manifest import load

    print(script(args.shell, load()))
    return 0


def answers_from_manifest(argv: list[str]) -> bool:
    """Whether ``argv`` asks only for help, the version or a completion script: what the plain
    data of :mod:`attnlab.cli.manifest` answers without importing torch."""
    return not argv or argv[0] == "completion" or any(a in ("-h", "--help", "--version") for a in argv)


def _answer_from_manifest(argv: list[str]) -> int:
    """Help, version or a completion script, from the command line's plain data (no torch)."""
    from .manifest import load, rebuild

    parser = rebuild(load())
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, or a bad option (already reported in one line)
        return e.code if isinstance(e.code, int) else 0
    try:
        if args.command == "completion":
            return _completion(args)
        parser.print_help()
    except BrokenPipeError:  # (| head: the reader left; nothing more to say)
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


def main(argv: list[str] | None = None) -> int:
    for stream in (sys.stdout, sys.stderr):  # text from the shell that is not valid Unicode prints escaped
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors="backslashreplace")
    argv = sys.argv[1:] if argv is None else list(argv)
    if answers_from_manifest(argv):
        return _answer_from_manifest(argv)
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        args.argv = argv
        if not getattr(args, "func", None):
            if args.command:  # e.g. `attnlab train` without a model: show that command's help
                parser.parse_args([args.command, "--help"])
            parser.print_help()
            return 0
    except SystemExit as e:  # --help, --version, or a bad option (already reported in one line)
        return e.code if isinstance(e.code, int) else 0
    from ..checkpoint import abandon_new_runs, release_runs
    from ..training.trainer import TrainingInterrupted

    try:
        _resolve_model_names(args)
        return args.func(args) or 0
    except TrainingInterrupted as e:
        print(f"\n{e}", file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130
    except (AttnlabError, ValueError, OSError) as e:
        _report(f"error: {one_line(e)}")  # (reported first, then cleaned up)
        abandon_new_runs()
        _let_peers_report()
        return 2
    except Exception as e:  # a bug, or a case nobody foresaw: still one line, the traceback on request
        abandon_new_runs()
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
        release_runs()


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


def _resolve_model_names(args) -> None:
    """--ckpt, --init and --draft may name a HuggingFace hub model (gpt2): its cached folder."""
    from ..hub import resolve

    for option in ("ckpt", "init", "draft"):
        value = getattr(args, option, None)
        if isinstance(value, str) and value:
            setattr(args, option, str(resolve(value)))


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
