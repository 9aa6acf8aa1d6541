"""The design of every claim, fixed before it runs: ``design.toml`` beside this module, one table per
claim (what the lecture says and where, what is measured on which scale, the criterion, the reason
for its margins, the control and what it must show, the seeds, steps and data).

The claims' code reads its title, statement, cited lines and margin reasons from here (declared
once), :meth:`Context.steps` refuses a full-size step count the design does not name, every saved
result records :func:`design_hash` of its claim's table, and ``attnlab reproduce --design`` prints the
tables (:func:`design_text`)."""

from __future__ import annotations

import functools
import hashlib
import json
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover (Python 3.10)
    import tomli as tomllib

DESIGN_FILE = Path(__file__).with_name("design.toml")

# every table's keys and their types (the file's header says what each means)
FIELDS: dict[str, type | tuple[type, ...]] = {
    "title": str,
    "statement": str,
    "source": (list, str),  # ["DECK:LINE words", …], or why it is beyond the decks
    "measured": str,
    "criterion": str,
    "margin_reason": str,
    "control": str,
    "control_must_show": str,
    "seeds": int,
    "steps": list,
    "data": str,
}


@functools.cache
def designs() -> dict[str, dict]:
    """{claim: its design table}, in the file's (the lectures') order; a table with a key missing,
    unknown or of the wrong type is refused with its name (a design that cannot be read decides
    nothing)."""
    tables = tomllib.loads(DESIGN_FILE.read_text(encoding="utf-8"))
    for name, table in tables.items():
        missing = [k for k in FIELDS if k not in table]
        unknown = [k for k in table if k not in FIELDS]
        wrong = [k for k, t in FIELDS.items() if k in table and not isinstance(table[k], t)]
        if missing or unknown or wrong:
            raise ValueError(
                f"{DESIGN_FILE.name}: [{name}] has "
                + "; ".join(f"{what} {', '.join(keys)}" for what, keys in
                            (("no", missing), ("unknown keys", unknown), ("the wrong type for", wrong)) if keys)
            )  # fmt: skip
    return tables


def design(name: str) -> dict:
    """Claim ``name``'s design table (a KeyError names a claim the design does not hold)."""
    try:
        return designs()[name]
    except KeyError:
        raise KeyError(f"{DESIGN_FILE.name} has no design for the claim {name!r}: add its table first") from None


def design_hash(name: str) -> str:
    """The first 16 hex digits of the SHA-256 of claim ``name``'s table (its keys sorted, as JSON):
    what a saved result records of the design it ran."""
    text = json.dumps(design(name), sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def design_text(names: list[str]) -> str:
    """The tables of the claims ``names`` as the file writes them, each with its hash."""
    text = DESIGN_FILE.read_text(encoding="utf-8")
    starts = {m.group(1): m.start() for m in re.finditer(r'^\["([^"]+)"\]$', text, re.M)}
    ends = sorted([*starts.values(), len(text)])
    blocks = []
    for name in names:
        start = starts[name]
        block = text[start : next(e for e in ends if e > start)].rstrip()
        blocks.append(f"{block}\n# design hash: {design_hash(name)}")
    return "\n\n".join(blocks)
