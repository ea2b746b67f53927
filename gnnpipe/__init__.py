"""gnnpipe: distributed full-graph training of deep graph neural networks.

Implements GNNPipe (Chen, Chen, Qian, arXiv 2308.10087) — layer-level model parallelism with
dependent graph chunks and historical embeddings — next to the exact graph-parallel baseline and a
hybrid of both, as a pipeline runtime with pluggable partitioners, schedulers, correctors and models.
"""

__version__ = "0.1.0"

from .errors import (  # noqa: F401
    ConfigError,
    DataValidationError,
    DistributedError,
    GnnpipeError,
    ScheduleError,
    UnknownComponentError,
)
