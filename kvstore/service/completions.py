"""Results the tier service hands back to the index's owner (vLLM's scheduler thread).

The service never touches the index: it posts these, and the scheduler thread applies them at
its next entry, so the index stays single-threaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kvstore.keys import BlockKey

__all__ = [
    "Completion",
    "PromotionDone",
    "RemoteCompletion",
    "RemoteFetchDone",
    "RemoteMeasureDone",
    "RemoteProbeDone",
    "RemoteRemoved",
    "RemoteWriteDone",
    "WriteDone",
]


@dataclass(frozen=True, slots=True)
class WriteDone:
    """A write batch finished: `ok` keys are on disk, `failed` are not. Queued writes are merged
    into one transaction, so one WriteDone may answer several `submit_write` calls (match by
    key); `num_bytes` and `duration_s` describe the whole batch."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    num_bytes: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class PromotionDone:
    """Disk -> CPU reads finished. `corrupt` and `missing` keys are gone from disk (the bytes of
    their rows are undefined). `tag` is what `submit_promotion` was given; `num_bytes` and
    `duration_s` describe the read."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    corrupt: tuple[BlockKey, ...] = field(default=())
    missing: tuple[BlockKey, ...] = field(default=())
    tag: object = None
    num_bytes: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RemoteProbeDone:
    """Which of `keys` the remote tier holds (all False when it did not answer in time)."""

    keys: tuple[BlockKey, ...]
    found: tuple[bool, ...]
    tag: object = None
    duration_s: float = 0.0  # the round trip (the timeout when it did not answer)
    answered: bool = False  # every node answered: `duration_s` is the link's round trip


@dataclass(frozen=True, slots=True)
class RemoteFetchDone:
    """Remote -> CPU row copies: `ok` rows hold their chunk (verified); `failed` do not.
    `num_bytes` (of the `ok` rows) and `duration_s` describe the fetch."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    tag: object = None
    num_bytes: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RemoteMeasureDone:
    """A read that only measured the link: `num_bytes` of values read (and dropped) in
    `duration_s`; 0 bytes when nothing could be read."""

    num_bytes: int = 0
    duration_s: float = 0.0
    tag: object = None


@dataclass(frozen=True, slots=True)
class RemoteWriteDone:
    """CPU row -> remote writes: `ok` landed (report them stored), `failed` did not.
    `num_bytes` (of the `ok` rows) and `duration_s` describe the write."""

    ok: tuple[BlockKey, ...]
    failed: tuple[BlockKey, ...] = ()
    num_bytes: int = 0
    duration_s: float = 0.0


@dataclass(frozen=True, slots=True)
class RemoteRemoved:
    """Redis removed these chunks (evicted, expired, deleted), whoever stored them."""

    keys: tuple[BlockKey, ...]


RemoteCompletion = (
    RemoteProbeDone | RemoteFetchDone | RemoteMeasureDone | RemoteWriteDone | RemoteRemoved
)

Completion = WriteDone | PromotionDone | RemoteCompletion
