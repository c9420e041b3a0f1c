"""The data path engine -> CPU -> {disk, remote} and back, as prepare/complete operations.

`TierPipeline` is the connector's full pipeline; `DiskPipeline` its disk-only configuration
(LMDBTier's); both move bytes to and from disk by the same rules (`disk_steps.DiskSteps`) and
report through the same observers (`observers.Observers`). `disk_tier.open_disk_tier` starts
the disk tier for either.
"""

from kvstore.pipeline.disk import DiskPipeline
from kvstore.pipeline.lookups import LookupAnswer
from kvstore.pipeline.observers import PipelineObserver
from kvstore.pipeline.pipeline import TierPipeline

__all__ = ["DiskPipeline", "LookupAnswer", "PipelineObserver", "TierPipeline"]
