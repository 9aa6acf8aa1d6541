"""Running claims and writing what they found: ``OUT/report.md`` (every claim's statement, run,
numbers, criterion, control and data, with its figure) and the documentation page that lists
what each claim judges (``attnlab reproduce --docs docs/reproduce.md``)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Annotated, Sequence

from ..options import Arg, checked
from .design import design_hash
from .registry import CLAIMS, VERDICTS, Context, Control, Result, registered

TOPICS = {
    "attention": "Attention",
    "positions": "Positional encodings",
    "recurrence": "Sequence to sequence: the bottleneck and alignment",
    "vision": "Vision transformers",
    "pretraining": "Pretraining and fine-tuning",
    "heads": "Heads and circuits",
    "graphs": "Graphs",
}


@checked
def reproduce(
    names: Annotated[
        Sequence[str], Arg("claims to check (default: all)", flags=("names",), nargs="*", metavar="NAME")
    ] = (),
    *,
    quick: Annotated[
        bool,
        Arg(
            "a preview: two seeds and at most a tenth of the full size's steps, all claims in about 9 minutes "
            "on 2 CPU cores; each claim says whether its verdict could be final (the full size decides)"
        ),
    ] = False,
    out: Annotated[str | Path, Arg("report folder")] = "reproduce",
    resume: Annotated[
        bool,
        Arg(
            "keep the claims already judged at this size in OUT/results.json (each claim's result is saved there as "
            "it ends, so a stopped run continues where it stopped) and run the others"
        ),
    ] = False,
    data_dir: Annotated[str | None, Arg("folder holding named datasets (default: $ATTNLAB_DATA)")] = None,
    docs: Annotated[
        str | Path | None,
        Arg("also write the documentation page: what each claim judges, its control and verdict", metavar="FILE.md"),
    ] = None,
    log=print,
) -> dict[str, Result]:
    """Check the claims ``names`` (default all; "all" too) at the full size (``quick``: small runs),
    in a temporary work folder; write ``out/report.md`` with its figures (and the documentation
    page ``docs`` when given); ``log``: where each claim's progress line goes. Each result is saved
    in ``out/results.json`` as its claim ends; ``resume``: keep those already there at this size
    and run only the others. Returns {name: Result}."""
    import tempfile

    from ..outputs import output_file
    from ..training.trainer import TrainingInterrupted

    names = claim_names(names)
    docs = output_file(docs, ".md", "--docs") if docs else None  # checked before the runs, not after
    size = "quick" if quick else "full"
    saved = load_results(Path(out), size) if resume else {}
    try:
        with tempfile.TemporaryDirectory(prefix="attnlab-reproduce-") as work:
            ctx = Context(out=Path(out), work=Path(work), size=size, data_dir=data_dir)
            results = run_claims(names, ctx, log=log, saved=saved)
    except (KeyboardInterrupt, TrainingInterrupted):  # (a claim's own training checkpoint went with its folder)
        judged = len(load_results(Path(out), size))
        log(
            f"stopped: the {judged} claim(s) judged so far are saved in {Path(out) / RESULTS}; the same command "
            "with --resume continues from the claim that was running"
        )
        raise KeyboardInterrupt from None
    write_report(results, ctx)
    if docs is not None:
        write_docs(results, ctx, docs, this_machine())
    return results


def claim_names(names: Sequence[str] | None) -> list[str]:
    """The claims ``names`` asks for, in its order (none, or "all": every claim); an unknown name is
    refused in one line, naming the claims there are."""
    from ..errors import OptionError

    registered()
    chosen = [n for n in names or () if n != "all"] or list(CLAIMS)
    unknown = [n for n in chosen if n not in CLAIMS]
    if unknown:
        raise OptionError(f"unknown claim {unknown[0]!r}; choose from {', '.join(CLAIMS)} (or all)")
    return chosen


def this_machine() -> str:
    """What runs the claims, as each saved result records it: the CPU's cores and model name, a GPU's
    name where one is used, and torch's version."""
    import os
    import platform

    import torch

    gpu = f", {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""
    return f"{os.cpu_count() or 1} CPU cores ({cpu_name() or platform.machine()}){gpu}, torch {torch.__version__}"


def cpu_name() -> str:
    """The CPU's model name (Linux), for the docs page; '' where the system does not say."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "")
    except OSError:
        return ""


RESULTS = "results.json"  # in the report folder: every claim's result at one size, saved as each ends


def load_results(out: Path, size: str) -> dict[str, Result]:
    """The results saved in ``out/results.json`` at ``size`` ({} when there are none), less those
    that could not run (ERROR: they run again); a file of another size is refused in one line (its
    runs are not this size's)."""
    import json

    from ..errors import OptionError

    path = out / RESULTS
    if not path.is_file():
        return {}
    try:
        saved = json.loads(path.read_text(encoding="utf-8"))
        results = {
            name: result_from_json(r)
            for name, r in saved["claims"].items()
            # (a result of another design than the claim's now runs again: the design comes first)
            if name in CLAIMS and r["verdict"] != "ERROR" and r.get("design") == design_hash(name)
        }
    except (ValueError, KeyError, TypeError) as e:
        raise OptionError(f"--resume: {path} is not a results file ({e}); drop --resume to run every claim again")
    if saved.get("size") != size:
        raise OptionError(
            f"--resume: {path} holds {saved.get('size')}-size results, not {size}-size ones; give "
            f"{'--quick' if saved.get('size') == 'quick' else 'the full size (no --quick)'} or drop --resume"
        )
    return results


def result_from_json(r: dict) -> Result:
    """A result as :func:`save_results` wrote it (a control saved before controls kept their verdict: FAIL
    when it did not clear)."""
    return Result(**{**r, "control": Control(**r["control"]) if r.get("control") else None})


def earlier_results(out: Path) -> dict[str, Result]:
    """The results already in ``out/results.json`` at any size ({} when it is absent or unreadable): the
    report names one whose claim's design has changed since (``Result.earlier``)."""
    import json

    try:
        saved = json.loads((out / RESULTS).read_text(encoding="utf-8"))["claims"]
        return {name: result_from_json(r) for name, r in saved.items() if name in CLAIMS}
    except (OSError, ValueError, KeyError, TypeError):
        return {}


def save_results(out: Path, size: str, results: dict[str, Result]) -> Path:
    """``results`` in ``out/results.json``, written whole or not at all."""
    import dataclasses
    import json

    from ..outputs import atomic_write_text

    claims = {name: dataclasses.asdict(r) for name, r in results.items()}
    return atomic_write_text(out / RESULTS, json.dumps({"size": size, "claims": claims}, indent=1, ensure_ascii=False))


def _figures(folder: Path) -> dict[Path, int]:
    """Each PNG in ``folder`` and when it was last written (ns)."""
    return {png: png.stat().st_mtime_ns for png in sorted(folder.glob("*.png"))}


def run_claims(names: list[str], ctx: Context, log=print, saved: dict[str, Result] | None = None) -> dict[str, Result]:
    """Check the claims ``names`` in order, each timed; a claim that raises is reported as ERROR
    ("could not run: …"), never lost with the others and never counted as the statement failing.
    ``saved``: results kept from an earlier run (:func:`load_results`), not run again. Every result,
    kept and new, is saved in ``ctx.out/results.json`` as each claim ends."""
    from ..figures import add_banner
    from ..training.trainer import TrainingInterrupted

    ctx.out.mkdir(parents=True, exist_ok=True)
    ctx.work.mkdir(parents=True, exist_ok=True)
    saved = saved or {}
    before_this_run, machine = earlier_results(ctx.out), this_machine()
    # every kept result is in the file from the start: a run stopped before reaching a kept claim
    # (one that comes after a claim being run again) must not drop it from the file
    results = dict(saved)
    for name in names:
        if name in saved:  # (already in results)
            log(f"[{name}] {saved[name].status}: kept from {ctx.out / RESULTS}")
            continue
        c = CLAIMS[name]
        t0, before = time.perf_counter(), _figures(ctx.out)
        ctx.sized, ctx.reads, ctx.claim = False, {}, name
        log(f"[{name}] {c.title} …")
        ctx.cache["data_used"] = []  # what the shared runs read for this claim (runs.corpus, runs.digits)
        try:
            r = c.check(ctx)
        except TrainingInterrupted:  # Ctrl-C in a claim's training: the report stops (it is not the claim's error)
            raise
        except Exception as e:  # one claim failing to run must not lose the others
            r = Result(
                f"could not run: {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                False,
                "the check runs",
                verdict="ERROR",
            )
        ctx.claim = None
        r.design, r.machine = design_hash(name), machine
        seen = before_this_run.get(name)
        if seen is not None and seen.design != r.design:
            seen_design = f"design {seen.design}" if seen.design else "no design hash (it predates the design file)"
            r.earlier = f"{seen.status} under {seen_design}: {seen.measured}"
        elif seen is not None:
            r.earlier = seen.earlier  # (the same design: what was seen before it stays named)
        r.data = r.data or "; ".join(dict.fromkeys(ctx.cache["data_used"])) or "computed: no data"
        r.final = ctx.size == "full" or not ctx.sized
        r.seconds, r.cached_seconds = time.perf_counter() - t0, ctx.cached_seconds
        for png, written in _figures(ctx.out).items():  # the figures this claim drew: its verdict above each
            if before.get(png) != written:
                add_banner(png, c.title, r.status, "" if r.final else f"a preview at the {ctx.size} size")
        results[name] = r
        save_results(ctx.out, ctx.size, {n: results[n] for n in CLAIMS if n in results})  # (in the claims' order)
        log(f"[{name}] {r.status} ({r.seconds:.0f}s): {r.measured}")
    return {n: results[n] for n in names}


def _counts(results: dict[str, Result]) -> str:
    counts = {v: sum(r.status == v for r in results.values()) for v in VERDICTS}
    return f"{counts['PASS']} of {len(results)} claims PASS" + "".join(
        f", {n} {v}" for v, n in counts.items() if v != "PASS" and n
    )


def _finality(r: Result, ctx: Context, long: bool = False) -> str:
    """Whether ``r``'s verdict could be final at this size: "yes" (the full size, or a claim that
    computes the same at every size), else "no" (a preview; ``long``: and why)."""
    if r.final or ctx.size == "full":
        return "yes" + (
            " (the full size)" if long and ctx.size == "full" else " (the same at every size)" if long else ""
        )
    return "no" + (f": a preview (fewer seeds or steps at the {ctx.size} size); the full size decides" if long else "")


def _seconds(r: Result, long: bool = False) -> str:
    """A claim's time: its own seconds, and those of the cached runs it read (trained by an earlier
    claim of the report, their seconds counted there)."""
    if r.cached_seconds < 0.5:
        return f"{r.seconds:.0f}" + (" s" if long else "")
    if long:
        return f"{r.seconds:.0f} s, and cached runs of earlier claims that took {r.cached_seconds:.0f} s to train"
    return f"{r.seconds:.0f} + cached run {r.cached_seconds:.0f}"


def write_report(results: dict[str, Result], ctx: Context) -> Path:
    lines = [
        "# attnlab reproduce",
        "",
        f"Size `{ctx.size}`; {_counts(results)}; {sum(r.seconds for r in results.values()):.0f} s in all. Each "
        "item: the lecture's statement, what was run on which data, the measured numbers, the criterion and the "
        "must-fail control beside it (PASS: the run clears the criterion and the control fails it; INCONCLUSIVE: "
        "the control clears it too, or seed noise straddles the bar).",
        "",
        *(
            [
                f"**The {ctx.size} size is a preview, not the judge.** A claim that trains runs two seeds where "
                "the full size runs five, and 2 to 10 % of its steps: its verdict here is a preview "
                '("final": no), and can differ from the full size\'s, which decides. A claim that computes '
                "without training runs the same at every size: its verdict here is final.",
                "",
            ]
            if ctx.size != "full"
            else []
        ),
        "| claim | result | final | control's verdict | data | seconds |",
        "|---|---|---|---|---|---|",
    ]
    lines += [
        f"| [{CLAIMS[n].title}](#{n}) | {r.status} | {_finality(r, ctx)} | "
        f"{'none' if r.control is None else r.control.status} | {r.data} | "
        f"{_seconds(r)} |"
        for n, r in results.items()
    ]
    for n, r in results.items():
        c = CLAIMS[n]
        lines += [
            "",
            f'<a id="{n}"></a>',
            f"## {c.title} — {r.status}",
            "",
            f"> {c.statement}",
            "",
            f"- **Deck**: {c.deck_line}",
            f"- **Run**: `{c.command}{' --quick' if ctx.size == 'quick' else ''}` ({_seconds(r, long=True)})",
            f"- **Data**: {r.data}",
            f"- **Final at this size**: {_finality(r, ctx, long=True)}",
            f"- **Measured**: {r.measured}",
            f"- **Criterion**: {r.criterion}",
            f"- **Control**: {r.control if r.control is not None else 'none'}",
            f"- **Verdict**: {r.status}: {r.reason} (one rule for every claim: attnlab.experiments.registry.decide)",
            f"- **Design**: {r.design or 'not recorded'} (`attnlab reproduce --design {n}`)",
            f"- **Machine**: {r.machine or 'not recorded'}",
        ]
        if r.earlier:
            lines.append(f"- **Design changed after a result was seen**: the earlier result was {r.earlier}")
        if r.note:
            lines.append(f"- **Note**: {r.note}")
        if r.table:
            lines += ["", r.table]
        if r.figure:
            lines += ["", f"![{c.title}]({r.figure})"]
    path = ctx.out / "report.md"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


DOCS_INTRO = """\
# The lectures' claims, checked: `attnlab reproduce`

```bash
attnlab reproduce --quick --out reproduce/     # every claim, a preview: under 10 minutes on 2 CPU cores
attnlab reproduce scaling table1 length        # some of them, full size
attnlab reproduce --resume                     # a stopped run: keeps the claims it judged, runs the rest
```

Each claim is a function in `attnlab.experiments.<topic>` registered with `@claim` (the topics are
the lectures': attention, positions, recurrence, vision, pretraining, heads, graphs). It computes or trains
what it needs, then judges the lecture's statement against a stated criterion **and** runs a
must-fail control beside it, judged by the claim's own criterion: a run where the statement is made
false (the mechanism removed, positions removed, heads tied, an arm that should not extrapolate in
the extrapolating arm's place, the attention maps shuffled across inputs), or, for a claim that one
side beats another, an A/A run: the better side trained again, its initial weights from other seeds
(a draw of its own per claim) and its batches the claim's own, paired like the claim and judged
against itself, which only noise or a vacuous criterion lets clear; its spread is also a floor on the
claim's interval. Every control goes through the claim's own measurement and can clear; the report
shows its result beside the claim's. No control relabels the measured run. Each claim names the deck
lines (FILE:LINE in the four lecture decks) that state it, or says it is beyond the decks and names
its paper. The verdicts:

One rule decides every claim (`attnlab.experiments.registry.decide`): the claim's criterion gives
its run PASS, FAIL or INCONCLUSIVE, and a PASS or FAIL stands only where the control, through the same
measurement, does not reach the same verdict. The verdicts:

- **PASS**: the run clears the criterion and the control does not.
- **FAIL**: the run fails the criterion (the statement does not hold here, with the numbers) and the
  control does not fail it the same way.
- **INCONCLUSIVE**: the control reaches the claim's verdict too (it cannot tell the statement from
  its control here), or, for comparative claims, the 95 % interval over seeds straddles the bar; the
  note says what would decide.
- **SKIPPED**: the claim's data is absent (it never runs on a substitute).
- **ERROR**: the check itself could not run (the exception, in one line): no verdict on the
  statement, unlike FAIL.
- **WITHDRAWN**: this setup cannot test the statement; nothing is run, and the claim says why and
  what would decide it.

Each claim's design (what it measures, its criterion, the reason for any margin, its control and what
that must show, its seeds, steps and data) is fixed before it runs, in one file that `attnlab
reproduce --design` prints; each result records the hash of the design it ran, and the report marks a
claim whose design changed after a result was seen, with the earlier result. Every trained claim runs
five seeds at full size (two with
`--quick`, which the report says), each seed its own pipeline, pretraining included. `--quick` is a preview: its trained claims also run 2
to 10 % of the full size's steps, and the report marks each verdict final or not (a claim
that computes without training is the same at every size). Comparative claims decide on the 95 % t-interval of the
paired differences (each seed sets both models' initial weights and batches), over seeds and test
items at once where every seed is scored on the same test items or validation windows (a seed × item mixed model,
`attnlab.experiments.stats.seeds_items_interval`, its coverage checked by simulation); threshold claims are
judged in every seed's models (PASS in all, FAIL in all, INCONCLUSIVE when the seeds disagree). The claims whose verdict can turn on the training budget
(bottleneck, locality, data-hunger, image-positions) measure along their runs as well and state
the verdict at a quarter, half, three quarters and all of them, with the curve in their figure. `OUT/report.md` names the data of every claim; the exit
code is 0 only when every claim passes. The committed reports, each run alone on {machine}:

{reports}

What each claim judges, and its verdict at the {size} size, as the report states it:
"""

REPORTS = {  # the committed reports beside the docs page: (folder under docs/, command)
    "quick": ("reproduce", "attnlab reproduce --quick --out docs/reproduce"),
    "full": ("reproduce/full", "attnlab reproduce --out docs/reproduce/full --docs docs/reproduce.md"),
}


def _report_lines(docs: Path) -> str:
    """A line per committed report beside the docs page: its size, command, counts and wall time."""
    lines = []
    for size, (folder, command) in REPORTS.items():
        report = docs.parent / folder / "report.md"
        text = report.read_text(encoding="utf-8") if report.is_file() else ""
        found = re.search(rf"Size `{size}`; (.*?); (\d+) s in all", text)
        if found:
            lines.append(
                f"- {size} size, `{command}`: [docs/{folder}/report.md]({folder}/report.md), {found[1]}; "
                f"{int(found[2]):,} s"
            )
    return "\n".join(lines)


def write_docs(results: dict[str, Result], ctx: Context, path: str | Path, machine: str) -> Path:
    """The documentation page: the intro (with the committed reports found beside ``path``: write the
    report first), then per topic each claim's statement, criterion, control and verdict in this run
    (generated, so it says exactly what is judged)."""
    path = Path(path)
    intro = DOCS_INTRO.format(machine=machine, reports=_report_lines(path), size=ctx.size)
    lines = [intro]
    for topic, heading in TOPICS.items():
        names = [n for n in results if CLAIMS[n].topic == topic]
        if not names:
            continue
        lines += [f"## {heading}", ""]
        for n in names:
            c, r = CLAIMS[n], results[n]
            lines += [
                f"### `{n}`: {c.title}",
                "",
                f"> {c.statement}",
                "",
                f"- **Deck**: {c.deck_line}",
                f"- **Criterion**: {r.criterion}",
                f"- **Control**: {r.control.what if r.control is not None else 'none'}",
                f"- **Data**: {r.data}",
                f"- **Verdict at the {ctx.size} size**: {r.status}"
                + (f" ({r.note})" if r.status != "PASS" and r.note else ""),
                "",
            ]
    lines += [
        "## Bars and margins",
        "",
        "Every claim's criterion (its bars and margins, as judged in this run) and why they are what they are.",
        "",
        "| claim | criterion | why these bars |",
        "|---|---|---|",
    ]
    cell = lambda text: text.replace("|", "\\|").replace("\n", " ")  # noqa: E731
    lines += [f"| `{n}` | {cell(r.criterion)} | {cell(CLAIMS[n].why)} |" for n, r in results.items()]
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines), encoding="utf-8")
    return path
