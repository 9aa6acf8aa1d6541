"""The old name of :mod:`attnlab.generate.quantize` (generation lives in :mod:`attnlab.generate`): imports of it keep working."""

import sys

from .generate import quantize

sys.modules[__name__] = quantize
