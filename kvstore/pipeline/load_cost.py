"""Whether a load pays: loads from the disk and remote tiers only when they are expected to finish
before recomputing the same tokens would (`load_policy: cost`), learned online.

What it learns, from kvstore's own measurements (the median of the last few of each):
- the engine's compute time per token: a step's time (from the metadata kvstore builds for it
  to the output vLLM hands back) over the tokens it computed, for steps that computed at least
  one chunk's worth (a decode-only step says little about prefill);
- per tier, a round trip's latency (remote probes) and the time per byte of a transfer beyond it
  (disk reads into CPU rows; remote fetches and writes, which cross the same link).

A load of `n` chunks from a tier is expected to take `round_trips x latency + n x chunk bytes x
time per byte`; recomputing them `n x tokens per chunk x time per token`. It pays when the load
is at most `margin` x the recompute (a load that only breaks even still costs the request a
scheduler round trip). The decision is all or nothing per lookup: the latency is paid once and
the rest grows with `n` at a fixed rate, so if any prefix pays, the longest does.

Until both sides are measured, or when a tier's figures are older than `stale_s` (a link that
recovers), loads go ahead (the load itself is the measurement), unless the fastest samples seen
so far already put the load past the recompute (`floor_s`). A remote link whose stale figures
said it does not pay (`was_declined`) is measured again aside, with no requester waiting.
Remote writes keep the remote tier's figures fresh while loads from it are declined; a reader
that gave up on a probe fetches a few of the chunks it found anyway, in the background, to
measure the link (`RemoteSteps`).

A load the requester waits on has a budget (`wait_budget_s`): twice its expected time, within
[`EXPLORE_FRACTION`, `margin`] x the recompute. An unmeasured remote link gets the lower end, at
most `EXPLORE_MAX_S` (a Redis across a network is often slower than recomputing; a good link
shows itself within that); an unmeasured disk the upper end (a
local disk almost always pays, and the first disk hits after a restart, before anything is
measured, are the ones a persistent tier is for). Past it the requester stops waiting and
recomputes (counted as `gave_up`) while the transfer goes on in the background, as a
measurement and into the CPU tier. So a tier that is slower than it looks, or not measured yet,
costs a request at most that fraction of its recompute, not the transfer.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from kvstore.keys import Tier
from kvstore.metrics.labels import LOAD_DECISIONS

__all__ = ["LoadCostModel"]

_WINDOW = 9  # recent samples kept per figure
_MIN_SAMPLES = 3
_MIN_TRANSFER_SAMPLES = 1  # one transfer of a few chunks already says what the link does

EXPLORE_FRACTION = 0.05
"""The least a requester may wait on a load, as a fraction of recomputing its tokens: all it
waits when the link's speed is not known (a request then costs at most ~1.05x its recompute),
and never more than `EXPLORE_MAX_S`."""

EXPLORE_MAX_S = 0.1
"""The most a requester waits on a remote link whose speed is not known, however long its
recompute: a probe and the first few chunks (4 MiB) take a few ms on loopback and tens on a LAN.
A slower link is measured in the background while the requester recomputes. Without it, a 9 s
recompute (a 2048-token prefill on a 2-vCPU VM without AVX-512) let the first request on a
4 MB/s link wait 0.47 s, and it cost 1.00-1.11x its recompute in `kvstore bench remote`
(idle 2-vCPU AMD EPYC VM, in-process and multiprocess, `VLLM_CPU_NUM_OF_RESERVED_CPU=1`)."""


STEP_JITTER_S = 0.05
"""The least a requester waits on a load from a measured tier (within `margin` x the recompute):
the requester learns that its load landed at its next scheduler step, and a step, a thread hop
or a busy core can outlast twice the expected time of a small load that is going fine."""


class _Recent:
    """The median of the most recent samples, and when the last came: robust to the odd
    outlier (the first step after start compiles, a GC pause, a connection being opened)."""

    __slots__ = ("_min_samples", "_samples", "updated_s")

    def __init__(self, min_samples: int = _MIN_SAMPLES) -> None:
        self._samples: deque[float] = deque(maxlen=_WINDOW)
        self._min_samples = min_samples
        self.updated_s = -math.inf

    @property
    def num_samples(self) -> int:
        return len(self._samples)

    @property
    def value(self) -> float:
        return statistics.median(self._samples) if self._samples else 0.0

    def add(self, sample: float, now_s: float) -> None:
        self._samples.append(sample)
        self.updated_s = now_s

    def known(self, now_s: float, stale_s: float) -> bool:
        return len(self._samples) >= self._min_samples and now_s - self.updated_s <= stale_s

    def least(self, now_s: float, stale_s: float) -> float | None:
        """The smallest recent sample, even if there are too few for `value` (None: none, or
        stale): a lower bound that one outlier cannot lower (outliers are slow, not fast)."""
        if not self._samples or now_s - self.updated_s > stale_s:
            return None
        return min(self._samples)


@dataclass(slots=True)
class _Link:
    latency_s: _Recent
    s_per_byte: _Recent


class LoadCostModel:
    """See the module docstring. One owner thread (vLLM's scheduler thread) calls everything."""

    def __init__(
        self,
        *,
        chunk_bytes: int,
        tokens_per_chunk: int,
        margin: float = 0.9,
        stale_s: float = 30.0,
        on_decision: Callable[[Tier, str], None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if chunk_bytes <= 0 or tokens_per_chunk <= 0:
            raise ValueError("chunk_bytes and tokens_per_chunk must be > 0")
        if not 0 < margin <= 10:
            raise ValueError(f"margin must be in (0, 10], got {margin}")
        self.chunk_bytes = chunk_bytes
        self.tokens_per_chunk = tokens_per_chunk
        self.margin = margin
        self.stale_s = stale_s
        self.on_decision = on_decision
        self._clock = clock
        self._s_per_token = _Recent()
        self._links = {
            tier: _Link(_Recent(), _Recent(_MIN_TRANSFER_SAMPLES))
            for tier in (Tier.DISK, Tier.REMOTE)
        }

    # -- what it measures ---------------------------------------------------------------------

    def observe_step(self, num_tokens: int, duration_s: float) -> None:
        """One engine step computed `num_tokens` tokens in `duration_s`."""
        if num_tokens >= self.tokens_per_chunk and duration_s > 0:
            self._s_per_token.add(duration_s / num_tokens, self._clock())

    def observe_round_trip(self, tier: Tier, duration_s: float) -> None:
        """A request to `tier` that moved (almost) no bytes: its latency."""
        if duration_s >= 0:
            self._links[tier].latency_s.add(duration_s, self._clock())

    def observe_transfer(self, tier: Tier, num_bytes: int, duration_s: float) -> None:
        """`num_bytes` moved between `tier` and CPU rows in `duration_s` (one request)."""
        if num_bytes <= 0 or duration_s < 0:
            return
        link = self._links[tier]
        latency = link.latency_s.value if link.latency_s.num_samples else 0.0
        link.s_per_byte.add(max(0.0, duration_s - latency) / num_bytes, self._clock())

    # -- what it expects ----------------------------------------------------------------------

    def recompute_s(self, num_chunks: int, *, num_tokens: int | None = None) -> float | None:
        """Expected time to compute `num_chunks` chunks' tokens, or `num_tokens` when given
        (a hybrid engine's entries are one KV cache group's share of a chunk: several stand
        for the same tokens) (None: not measured)."""
        return self._recompute_s(num_chunks, num_tokens, self.stale_s)

    def load_s(self, tier: Tier, num_chunks: int, *, round_trips: int = 1) -> float | None:
        """Expected time to bring `num_chunks` chunks from `tier` into CPU rows (None: not
        measured). The disk's latency is in its time per byte (its reads are not split)."""
        return self._load_s(tier, num_chunks, round_trips, self.stale_s)

    def decide(
        self, tier: Tier, num_chunks: int, *, round_trips: int = 1, num_tokens: int | None = None
    ) -> bool:
        """Whether loading `num_chunks` chunks from `tier` is expected to pay (not counted);
        True when either side is not measured (yet, or lately), unless the load's floor
        (`floor_s`, from the samples there are) already outlasts the recompute.
        `num_tokens`: the tokens the load saves computing, when not `num_chunks` chunks'."""
        return self._decide(tier, num_chunks, round_trips, num_tokens, self.stale_s)

    def was_declined(
        self, tier: Tier, num_chunks: int, *, round_trips: int = 1, num_tokens: int | None = None
    ) -> bool:
        """Whether `decide` goes ahead only because `tier`'s figures went stale, while the
        last of them, however old, said this load does not pay: the tier should be measured
        again, but not by a requester that waits on it (`RemoteSteps` does it aside)."""
        return self._decide(
            tier, num_chunks, round_trips, num_tokens, self.stale_s
        ) and not self._decide(tier, num_chunks, round_trips, num_tokens, math.inf)

    def floor_s(self, tier: Tier, num_chunks: int, *, round_trips: int = 1) -> float | None:
        """The least a load from `tier` can take, from what is measured so far, even one
        sample: its round trips at the fastest latency seen, plus its bytes at the fastest
        transfer seen (None: nothing measured). A link too slow by this alone is decided
        against before its figures are settled, so it is not explored request after request."""
        return self._floor_s(tier, num_chunks, round_trips, self.stale_s)

    def _recompute_s(self, num_chunks: int, num_tokens: int | None, stale_s: float) -> float | None:
        if not self._s_per_token.known(self._clock(), stale_s):
            return None
        tokens = num_chunks * self.tokens_per_chunk if num_tokens is None else num_tokens
        return tokens * self._s_per_token.value

    def _load_s(
        self, tier: Tier, num_chunks: int, round_trips: int, stale_s: float
    ) -> float | None:
        link = self._links[tier]
        now = self._clock()
        if not link.s_per_byte.known(now, stale_s):
            return None
        latency = 0.0
        if tier is Tier.REMOTE:
            if not link.latency_s.known(now, stale_s):
                return None
            latency = round_trips * link.latency_s.value
        return latency + num_chunks * self.chunk_bytes * link.s_per_byte.value

    def _decide(
        self, tier: Tier, num_chunks: int, round_trips: int, num_tokens: int | None,
        stale_s: float,
    ) -> bool:  # fmt: skip
        recompute = self._recompute_s(num_chunks, num_tokens, stale_s)
        if recompute is None:
            return True
        load = self._load_s(tier, num_chunks, round_trips, stale_s)
        if load is None:
            load = self._floor_s(tier, num_chunks, round_trips, stale_s)
        return load is None or load <= self.margin * recompute

    def _floor_s(
        self, tier: Tier, num_chunks: int, round_trips: int, stale_s: float
    ) -> float | None:
        link = self._links[tier]
        now = self._clock()
        latency = link.latency_s.least(now, stale_s) if tier is Tier.REMOTE else None
        s_per_byte = link.s_per_byte.least(now, stale_s)
        if latency is None and s_per_byte is None:
            return None
        return round_trips * (latency or 0.0) + num_chunks * self.chunk_bytes * (s_per_byte or 0.0)

    def needs_transfer_sample(self, tier: Tier) -> bool:
        """Whether `tier`'s time per byte is unknown or stale: a transfer would measure it."""
        return not self._links[tier].s_per_byte.known(self._clock(), self.stale_s)

    def seconds_until(self, deadline_s: float | None) -> float | None:
        """Seconds from now to `deadline_s` on this model's clock (None: no deadline)."""
        return None if deadline_s is None else deadline_s - self._clock()

    def wait_budget_s(
        self, tier: Tier, num_chunks: int, *, round_trips: int = 1, num_tokens: int | None = None
    ) -> float | None:
        """How long a requester may wait for a load of `num_chunks` chunks from `tier` before
        it recomputes instead (None: no limit, the recompute is not measured): twice the
        expected load (at least `STEP_JITTER_S`), at least `EXPLORE_FRACTION` and at most
        `margin` x the recompute; when the tier is not measured, the least (at most
        `EXPLORE_MAX_S`) for the remote tier and the most for the disk (module docstring).
        `num_tokens` as in `decide`."""
        recompute = self.recompute_s(num_chunks, num_tokens=num_tokens)
        if recompute is None:
            return None
        least = EXPLORE_FRACTION * recompute
        most = max(self.margin * recompute, least)
        expected = self.load_s(tier, num_chunks, round_trips=round_trips)
        if expected is None:
            return most if tier is Tier.DISK else min(least, EXPLORE_MAX_S)
        return min(max(2 * expected, least, STEP_JITTER_S), most)

    def deadline_s(
        self, tier: Tier, num_chunks: int, *, round_trips: int = 1, num_tokens: int | None = None
    ) -> float | None:
        """When a requester that starts waiting now on this load stops waiting (this model's
        clock; None: no limit): now + `wait_budget_s`."""
        budget_s = self.wait_budget_s(
            tier, num_chunks, round_trips=round_trips, num_tokens=num_tokens
        )
        return None if budget_s is None else self._clock() + budget_s

    def gives_up(self, tier: Tier, deadline_s: float | None) -> bool:
        """Whether a requester waiting on `tier` is past `deadline_s`; counted (`gave_up`)
        when it is."""
        if deadline_s is None or self._clock() < deadline_s:
            return False
        self.record_gave_up(tier)
        return True

    def pays(
        self, tier: Tier, num_chunks: int, *, round_trips: int = 1, num_tokens: int | None = None
    ) -> bool:
        """`decide`, counted."""
        decision = self.decide(tier, num_chunks, round_trips=round_trips, num_tokens=num_tokens)
        self.record(tier, is_load=decision)
        return decision

    def record(self, tier: Tier, *, is_load: bool) -> None:
        """Count a decision (`kvstore_load_decisions_total`)."""
        self._count(tier, LOAD_DECISIONS[0] if is_load else LOAD_DECISIONS[1])

    def record_gave_up(self, tier: Tier) -> None:
        """Count a load the requester stopped waiting for (past `wait_budget_s`)."""
        self._count(tier, LOAD_DECISIONS[2])

    def _count(self, tier: Tier, decision: str) -> None:
        if self.on_decision is not None:
            self.on_decision(tier, decision)
