"""The old name of :mod:`attnlab.generate.beam` (generation lives in :mod:`attnlab.generate`): imports of it keep working."""

import sys

from .generate import beam

sys.modules[__name__] = beam
