"""The tier service: an asyncio loop in its own thread that does the scheduler process's I/O."""

from kvstore.service.completions import (
    Completion,
    PromotionDone,
    RemoteFetchDone,
    RemoteMeasureDone,
    RemoteProbeDone,
    RemoteRemoved,
    RemoteWriteDone,
    WriteDone,
)
from kvstore.service.tier_service import TierService

__all__ = [
    "Completion",
    "PromotionDone",
    "RemoteFetchDone",
    "RemoteMeasureDone",
    "RemoteProbeDone",
    "RemoteRemoved",
    "RemoteWriteDone",
    "TierService",
    "WriteDone",
]
