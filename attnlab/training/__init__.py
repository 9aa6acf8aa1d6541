"""The shared trainer. Each name below is imported from its module on first use: the trainer's
options (:mod:`.config`) are read without importing torch."""

from typing import TYPE_CHECKING

from ..compat import lazy_names

_MODULES = {"TrainConfig": ".config", "Trainer": ".trainer", "TrainingInterrupted": ".trainer",
            "LanguageModelTask": ".tasks"}  # fmt: skip
__all__ = list(_MODULES)
__getattr__ = lazy_names(__name__, _MODULES)

if TYPE_CHECKING:
    from .config import TrainConfig as TrainConfig
    from .tasks import LanguageModelTask as LanguageModelTask
    from .trainer import Trainer as Trainer, TrainingInterrupted as TrainingInterrupted
