"""Every trained claim of `attnlab reproduce` at the quick size, as a check of their verdicts
(the test suite runs them at the tiny size only, where a verdict means nothing): each claim must
run, and the script lists the claims whose control clears its criterion, which the suite used to
assert never happens at this size (about 9 minutes on 2 cores; docs/reproduce's quick report).

    python benchmarks/reproduce_quick.py --out runs/reproduce-quick [--json quick.json]

Exit status 1 when a claim could not run, 0 otherwise.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from attnlab.experiments import CLAIMS, Context, run_claims, write_report
from common import print_table, save_json


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/reproduce-quick", help="report and work folder")
    ap.add_argument("--json", default=None, help="also write the rows as JSON")
    ap.add_argument("claims", nargs="*", help="claims to run (default: every one)")
    args = ap.parse_args()
    out = Path(args.out)
    ctx = Context(out=out / "out", work=out / "work", size="quick")
    start = time.perf_counter()
    results = run_claims(args.claims or list(CLAIMS), ctx, log=lambda m: print(m, file=sys.stderr, flush=True))
    rows = [
        {
            "claim": name,
            "verdict": r.status,
            "control clears": "-" if r.control is None else ("yes" if r.control.cleared else "no"),
            "seconds": f"{r.seconds:.0f}",
        }
        for name, r in results.items()
    ]
    print_table(rows, ["claim", "verdict", "control clears", "seconds"])
    print(f"report: {write_report(results, ctx)}; {time.perf_counter() - start:.0f} s wall")
    save_json(rows, args.json)
    broken = [n for n, r in results.items() if r.measured.startswith("could not run")]
    cleared = [n for n, r in results.items() if r.control is not None and r.control.cleared]
    print(f"controls that clear their criterion at the quick size: {', '.join(cleared) or 'none'}")
    if broken:
        print(f"could not run: {', '.join(broken)}", file=sys.stderr)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
