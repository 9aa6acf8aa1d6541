"""The lectures' claims, each checked on real numbers with a must-fail control beside it:
``attnlab reproduce``. One module per lecture topic registers its claims (``registry.claim``),
imported in the lectures' order when the claims are first asked for (:func:`registry.registered`);
``runs`` holds the trained models several claims share, ``stats`` the seeds and intervals,
``report`` the runner and the report. Each name below is imported from its module on first use."""

from typing import TYPE_CHECKING

from ..compat import lazy_names

_MODULES = {"Context": ".registry", "Control": ".registry", "Result": ".registry", "reproduce": ".report",
            "run_claims": ".report", "write_docs": ".report", "write_report": ".report"}  # fmt: skip
__all__ = ["CLAIMS", *_MODULES]
_named = lazy_names(__name__, _MODULES)


def __getattr__(name: str) -> object:
    if name == "CLAIMS":  # every claim, its topic modules imported
        from .registry import registered

        return registered()
    return _named(name)


if TYPE_CHECKING:
    from .registry import CLAIMS as CLAIMS, Context as Context, Control as Control, Result as Result
    from .report import (
        reproduce as reproduce,
        run_claims as run_claims,
        write_docs as write_docs,
        write_report as write_report,
    )
