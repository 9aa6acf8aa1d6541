"""The lectures' claims, each checked on real numbers with a must-fail control beside it:
``attnlab reproduce``. One module per lecture topic registers its claims (``registry.claim``),
imported here in the lectures' order; ``runs`` holds the trained models several claims share,
``stats`` the seeds and intervals, ``report`` the runner and the report."""

from . import attention, positions, recurrence, vision, pretraining, heads, graphs  # noqa: F401  (registers the claims)
from .registry import CLAIMS, Context, Control, Result
from .report import reproduce, run_claims, write_docs, write_report

__all__ = [
    "CLAIMS",
    "Context",
    "Control",
    "Result",
    "reproduce",
    "run_claims",
    "write_docs",
    "write_report",
]
