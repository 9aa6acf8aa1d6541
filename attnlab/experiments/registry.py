"""The registry of the lectures' claims: what a claim is, what its check returns, and the
``@claim`` decorator each topic module (``attention``, ``positions``, ``recurrence``, ``vision``,
``heads``, ``graphs``) registers its claims with, in the order of the lectures."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from .design import design


@dataclass
class Context:
    out: Path  # figures go here
    work: Path  # run folders go here
    size: str = "quick"  # tiny | quick | full
    data_dir: str | None = None
    cache: dict = field(default_factory=dict)  # models trained once and used by several claims
    # the running claim read a setting that depends on the size (steps, seeds) or a model trained
    # with one: below the full size its verdict is a preview, not final (``Result.final``)
    sized: bool = False

    # each cached run's record (:meth:`cached`): key -> (the data it read, the seconds it took)
    runs: dict = field(default_factory=dict)
    # the cached runs the running claim read: key -> the seconds it rests on without spending them (0 for
    # a run it trained itself); reset per claim by the report
    reads: dict = field(default_factory=dict)

    @property
    def cached_seconds(self) -> float:
        """The training seconds of the cached runs the running claim read, trained by earlier claims."""
        return float(sum(self.reads.values()))

    claim: str | None = None  # the claim running (set by the report): its design bounds the full size

    def steps(self, tiny: int, quick: int, full: int) -> int:
        """This size's steps; the full size's must be one its claim's design names (fixed before the run)."""
        self.sized = True
        if self.claim is not None and full not in design(self.claim)["steps"]:
            raise ValueError(
                f"the claim {self.claim!r} runs {full} steps at full size, which its design does not name "
                f"({design(self.claim)['steps']}): change the design first, in a commit of its own"
            )
        return {"tiny": tiny, "quick": quick, "full": full}[self.size]

    def cached(self, key: str, train):
        """A model trained at this size once per report and read by several claims: ``train()`` the
        first time, its value after that. Every read marks the running claim as sized (its verdict
        a preview below the full size); a read from the cache names the data the training read
        (``data_used``) and counts its seconds in :attr:`cached_seconds`, so that a claim that reads a
        cached run reports what it rests on, not "no data, 0 s"."""
        self.sized = True
        used = self.cache.setdefault("data_used", [])
        if key in self.cache:
            data, seconds = self.runs.get(key, ([], 0.0))
            used.extend(data)
            self.reads.setdefault(key, seconds)
            return self.cache[key]
        before, t0 = len(used), time.perf_counter()
        self.cache[key] = train()
        self.runs[key] = (used[before:], time.perf_counter() - t0)
        self.reads[key] = 0.0  # (trained by this claim: its seconds are the claim's own)
        return self.cache[key]


VERDICTS = ("PASS", "FAIL", "INCONCLUSIVE", "SKIPPED", "ERROR", "WITHDRAWN")


CONTROL_KINDS = ("must-fail", "A/A")


@dataclass
class Control:
    """The control run beside a claim, judged by the claim's own criterion through the same
    measurement: ``kind`` "must-fail" (the statement made false: the model before training, the
    mechanism removed, positions removed, a model known to be worse) or "A/A" (nothing differs but the
    seeds). ``cleared``: it met the criterion; ``verdict``: what the criterion says of it where the
    criterion can also be undecided (an interval straddling its bar: INCONCLUSIVE); by default FAIL
    when it did not clear. :func:`decide` reads it."""

    what: str  # the run that makes the statement false, or where nothing differs
    measured: str  # its numbers, in a sentence
    cleared: bool
    verdict: str | None = None
    kind: str = "must-fail"

    def __post_init__(self) -> None:
        self.cleared = bool(self.cleared)  # (a NumPy comparison gives np.bool_, which JSON and `is` reject)
        if self.kind not in CONTROL_KINDS:
            raise ValueError(f"a control's kind is one of {CONTROL_KINDS}, not {self.kind!r}")

    @property
    def status(self) -> str:
        """PASS, FAIL or INCONCLUSIVE: the claim's criterion on this run."""
        return "PASS" if self.cleared else self.verdict or "FAIL"

    def __str__(self) -> str:
        return f"{self.what}: {self.measured} (by the claim's criterion: {self.status})"


def decide(own: str, control: Control | None) -> tuple[str, str]:
    """The one verdict rule of every claim: (verdict, why). ``own``: what the claim's criterion says of
    its run (PASS, FAIL or INCONCLUSIVE; SKIPPED, ERROR and WITHDRAWN pass through). A PASS or FAIL
    stands only where the control does not reach the same verdict through the same measurement, of
    the verdicts the control can speak to: an A/A run (nothing differs but the seeds) that reaches the
    claim's PASS or its FAIL shows that seed noise alone gives it; a must-fail run that passes too
    shows that the criterion cannot tell the statement from its negation. Either way: INCONCLUSIVE.
    (A must-fail run that fails, as it must, says nothing against the claim's FAIL: that FAIL stands.)"""
    if own not in ("PASS", "FAIL"):
        return own, {
            "INCONCLUSIVE": "the criterion cannot decide on this run (seed noise straddles its bar)",
            "SKIPPED": "its data is absent",
            "ERROR": "the check could not run",
            "WITHDRAWN": "this setup cannot test the statement",
        }.get(own, "")
    if control is None:
        return own, "no control run"
    if control.status == own and (control.kind == "A/A" or own == "PASS"):
        return "INCONCLUSIVE", (
            f"the {control.kind} control ({control.what}) reaches the same {own} through the same measurement: "
            + (
                "seed noise alone gives it"
                if control.kind == "A/A"
                else "the criterion cannot tell the statement from its negation"
            )
        )
    if own == "FAIL" and control.kind == "must-fail":
        return own, "the statement fails its criterion; its must-fail control fails too, as it must (it guards a PASS)"
    return own, f"its {control.kind} control reaches {control.status}, not {own}"


@dataclass
class Result:
    """A claim's outcome. ``status`` (:func:`decide`): PASS (the run clears the criterion and its
    control does not), FAIL (the lecture's statement does not hold here, and its control does not
    fail the same way), INCONCLUSIVE (the control reaches the same verdict, or seed noise straddles
    the bar: this setup cannot decide), SKIPPED (its data is
    absent), ERROR (the check itself could not run: no verdict on the statement), WITHDRAWN (this
    setup cannot test the statement: nothing is run, and the report says why). ``verdict`` overrides what ``passed`` and the control say (an interval over seeds
    that straddles its bar; absent data)."""

    measured: str  # the numbers, in a sentence
    passed: bool  # the real run clears the criterion
    criterion: str
    figure: str | None = None  # file name in ctx.out
    table: str | None = None  # Markdown
    note: str = ""
    seconds: float = 0.0
    control: Control | None = None
    verdict: str | None = None
    data: str = ""  # the data it ran on, named in the report
    final: bool = True  # False: run smaller than the full size (fewer seeds or steps), a preview the full size decides
    cached_seconds: float = 0.0  # the training of the cached runs it read (trained by an earlier claim), in seconds
    design: str = ""  # the hash of the design table it ran (design.design_hash)
    # the result saved before under another design of this claim (its verdict, design hash and numbers):
    # the report shows it, since a design changed after a result was seen is no longer fixed before the run
    earlier: str = ""
    machine: str = ""  # what ran it: the CPU's cores and model name, and torch's version (report.this_machine)

    @property
    def own(self) -> str:
        """What the criterion says of the claim's own run, before its control is consulted."""
        return self.verdict or ("PASS" if self.passed else "FAIL")

    @property
    def status(self) -> str:
        """The verdict by :func:`decide`, the one rule."""
        return decide(self.own, self.control)[0]

    @property
    def reason(self) -> str:
        """Why the verdict is what it is (:func:`decide`)."""
        return decide(self.own, self.control)[1]


def skipped(what: str, criterion: str) -> Result:
    """The result of a claim whose data is absent: never run on a substitute."""
    return Result(f"not run: {what}", False, criterion, verdict="SKIPPED")


def withdrawn(why: str, note: str = "") -> Result:
    """The result of a claim this setup cannot test: nothing is run; ``why`` says why and what would
    decide it (the report's measured line begins "withdrawn: ")."""
    return Result(
        f"withdrawn: {why}",
        False,
        "none: the claim is withdrawn (the reason is above)",
        note=note,
        verdict="WITHDRAWN",
        data="none: nothing is run",
    )


# the lecture decks (``../shared/lectures``, their README): a claim's deck lines are cited in them
DECKS = {
    "000": "000_bd2ef584872622f0.txt",  # COMP547: tokens, attention, the positional-encoding zoo, Table 1, ViT, GPT, graphs
    "001": "001_1521457a98367c77.txt",  # CS-433: the worked example, √d_k, multi-head, ViT, pretraining
    "002": "002_a33fead74ad5ceec.txt",  # SUSTech: RNN seq2seq and captioning with attention, positions, BERT
    "004": "004_a1df5acef988171b.txt",  # EE/CS/CNS148: attention, multi-head, ViT against CNNs
}


# the course each deck was taught in (the decks' README): what a teacher cites beside FILE:LINE
COURSES = {
    "000": "COMP547",
    "001": "CS-433",
    "002": "SUSTech lecture",
    "004": "EE/CS/CNS148",
}


@dataclass(frozen=True)
class DeckLine:
    """Where a deck says what a claim checks: ``FILE:LINE`` and the words on that line."""

    deck: str  # a key of DECKS
    line: int
    words: str  # found on that line (checked against the decks by the tests)

    def __str__(self) -> str:
        return f"{COURSES[self.deck]}, {DECKS[self.deck]}:{self.line} (“{self.words}”)"


def deck(*refs: str) -> tuple[DeckLine, ...]:
    """``deck("001:292 58.9", …)``: each reference as DECK:LINE and the words on that line."""
    lines = []
    for ref in refs:
        where, words = ref.split(" ", 1)
        name, line = where.split(":")
        lines.append(DeckLine(name, int(line), words))
    return tuple(lines)


@dataclass
class Claim:
    name: str
    title: str
    statement: str  # what the lecture says
    check: Callable[[Context], Result]
    command: str = ""
    topic: str = ""  # the module (lecture topic) it lives in
    # the deck lines it checks, or (a string) why it is from beyond the decks and where it comes from
    source: tuple[DeckLine, ...] | str = ()
    why: str = ""  # why its bars and margins are what they are (the docs page's table)

    @property
    def deck_line(self) -> str:
        """The report's line: the deck references, or that the claim is from beyond the decks."""
        if isinstance(self.source, str):
            return f"beyond the decks: {self.source}"
        return "; ".join(str(ref) for ref in self.source)


CLAIMS: dict[str, Claim] = {}
# the modules that register the claims, in the lectures' order
TOPICS = ("attention", "positions", "recurrence", "vision", "pretraining", "heads", "graphs")


def registered() -> dict[str, Claim]:
    """:data:`CLAIMS`, every topic module imported (each registers its claims when imported)."""
    import importlib

    for topic in TOPICS:
        importlib.import_module(f"{__package__}.{topic}")
    return CLAIMS


def claim(name: str):
    """Register ``check(ctx) -> Result`` as the claim ``name`` (``attnlab reproduce NAME``), its title,
    statement, deck lines (or why it is beyond the decks) and the reason for its bars read from its
    design table (:mod:`.design`), where they are fixed before it runs."""
    table = design(name)
    source = table["source"] if isinstance(table["source"], str) else deck(*table["source"])
    if not source:
        raise ValueError(f"claim {name!r}: give its deck lines, or say where it comes from if not the decks")
    if not table["margin_reason"]:
        raise ValueError(f"claim {name!r}: say why its bars and margins are what they are")

    def add(fn):
        topic = fn.__module__.rsplit(".", 1)[-1]
        CLAIMS[name] = Claim(
            name, table["title"], table["statement"], fn, f"attnlab reproduce {name}", topic, source,
            table["margin_reason"],
        )  # fmt: skip
        return fn

    return add


def markdown_table(header: list[str], rows: list[list]) -> str:
    fmt = lambda v: f"{v:.4g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(fmt(v) for v in r) + " |" for r in rows])
