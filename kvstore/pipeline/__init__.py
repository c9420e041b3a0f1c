"""The data path engine -> CPU -> {disk, remote} and back, as prepare/complete operations."""

from kvstore.pipeline.pipeline import LookupAnswer, PipelineObserver, TierPipeline

__all__ = ["LookupAnswer", "PipelineObserver", "TierPipeline"]
