"""The shared trainer."""

from .tasks import LanguageModelTask
from .trainer import TrainConfig, Trainer, TrainingInterrupted

__all__ = ["TrainConfig", "Trainer", "TrainingInterrupted", "LanguageModelTask"]
