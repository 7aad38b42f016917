"""The incremental exact GP; see `core.gp.model` for the mathematics."""

from core.errors import NumericalError
from core.gp.model import (
    LENGTHSCALE_FLOOR,
    MIN_NOISE,
    REBUILD_BYTES,
    GPConfig,
    GPPosterior,
    IncrementalGP,
    LearnReport,
)

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
