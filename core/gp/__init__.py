"""The incremental exact GP: a batch of GPs whose Cholesky factors grow by row appends.

One module per concern (`core.gp.model` explains the mathematics and names them); this file is
the public surface, unchanged from when all of it was one module.
"""

from core.errors import NumericalError
from core.gp.config import LENGTHSCALE_FLOOR, MIN_NOISE, GPConfig, LearnReport
from core.gp.model import IncrementalGP
from core.gp.posterior import GPPosterior
from core.gp.rebuild import REBUILD_BYTES

__all__ = [
    "LENGTHSCALE_FLOOR",
    "MIN_NOISE",
    "REBUILD_BYTES",
    "GPConfig",
    "GPPosterior",
    "IncrementalGP",
    "LearnReport",
    "NumericalError",
]
