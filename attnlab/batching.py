"""The old name of :mod:`attnlab.generate.batching` (generation lives in :mod:`attnlab.generate`): imports of it keep working."""

import sys

from .generate import batching

sys.modules[__name__] = batching
