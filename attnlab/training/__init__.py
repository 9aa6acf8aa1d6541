"""The shared trainer."""

from .tasks import LanguageModelTask
from .config import TrainConfig
from .trainer import Trainer, TrainingInterrupted

__all__ = ["TrainConfig", "Trainer", "TrainingInterrupted", "LanguageModelTask"]
