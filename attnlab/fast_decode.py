"""The old name of :mod:`attnlab.generate.fast` (generation lives in :mod:`attnlab.generate`): imports of it keep working."""

import sys

from .generate import fast

sys.modules[__name__] = fast
