"""The remote tier's steps in the pipeline: probe, fetch into CPU rows, write-through, removals.

A lookup whose local prefix (CPU and disk) ends before the keys do asks Redis for the rest in
one batched probe (one round trip per node, within `remote_timeout_ms`); the answer is pending
meanwhile. Found chunks get CPU rows (reserved like a store, the requester's local prefix
protected) and are fetched into them; once verified they are ready in CPU, held for the
requester, and written through to the local disk like any stored chunk. A dead remote answers
"nothing found" within the budget, so a request never waits on it longer than that. With
`load_policy: cost` a requester also stops waiting once its probe and fetch run past the load
cost model's budget (`LoadCostModel.wait_budget_s`: a small fraction of the recompute when the
link is not measured yet): it recomputes, and the fetch lands in CPU in the background. While
the link is not measured, a fetch takes a few chunks first (`_SAMPLE_BYTES`) and the rest only
once they land in time, so a slow link that is given up on carries no whole prompt beside the
recompute; a requester that gave up before its probe answered still fetches those few, to
measure the link for the next lookup. When a link's figures go stale after they said it does
not pay, it is measured again the same way aside, with no requester waiting on it.

Chunks the engine stores are written to Redis from their pinned CPU rows (batched, bounded,
droppable); each that lands is reported stored in the remote tier, and Redis's own removals
(evicted, expired, deleted by anyone) are reported removed.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from kvstore.index import TierIndex
from kvstore.index.event_log import EventLog
from kvstore.keys import BlockKey, Tier
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.service import (
    RemoteFetchDone,
    RemoteMeasureDone,
    RemoteProbeDone,
    RemoteRemoved,
    RemoteWriteDone,
)

__all__ = ["RemoteLookup", "RemoteSteps", "RemoteTierIO"]

logger = logging.getLogger(__name__)

_REMEASURE = "kvstore:remeasure"
"""The requester tag of a link measurement that no request waits on (`RemoteSteps._remeasure`)."""

_SAMPLE_BYTES = 4 << 20
"""What a fetch moves at most while the link's speed is not known: the first part of a
requester's fetch (the rest follows once it lands within the requester's budget), or the
measuring fetch of a requester that gave up on its probe (`RemoteSteps._fetch_sample`).
Enough that a round trip does not dominate the measurement, little enough that a slow link
given up on does not go on carrying a whole prompt beside the recompute."""


class RemoteTierIO(Protocol):
    """The remote tier's I/O the pipeline asks for (`kvstore.service.remote_io.RemoteIO` on the
    tier service's loop, `kvstore.service.inline_remote.InlineRemoteIO` on the caller's thread).
    Each answers through the service's completions: `RemoteProbeDone`, `RemoteFetchDone`,
    `RemoteMeasureDone`, `RemoteWriteDone`, and `RemoteRemoved` for the tier's own removals."""

    def submit_probe(self, keys: Sequence[BlockKey], tag: object) -> None:
        """Which of `keys` the tier holds (not an access to them)."""
        ...

    def submit_fetch(self, items: Sequence[tuple[BlockKey, int]], tag: object) -> None:
        """Copy each chunk into its CPU row (pinned by the caller until the answer)."""
        ...

    def submit_measure(self, keys: Sequence[BlockKey], tag: object) -> None:
        """Read the chunks and drop them: the link's speed (`RemoteMeasureDone`)."""
        ...

    def submit_write(self, items: Sequence[tuple[BlockKey, int]]) -> bool:
        """Write chunks from their pinned CPU rows; False = dropped (the caller unpins)."""
        ...

    def submit_touch(self, keys: Sequence[BlockKey]) -> None:
        """Record an access to each chunk the tier holds (Redis's LRU); no answer, best effort."""
        ...


@dataclass(slots=True)
class RemoteLookup:
    """One requester's remote state: what the probe found, what is being fetched."""

    is_probing: bool = False
    found: dict[BlockKey, bool] = field(default_factory=dict)
    fetching: set[BlockKey] = field(default_factory=set)
    held: set[BlockKey] = field(default_factory=set)
    fetched: set[BlockKey] = field(default_factory=set)
    deadline_s: float | None = None  # when the requester stops waiting (cost model's clock)
    has_given_up: bool = False  # waited past the deadline: no more remote for this requester
    is_measuring: bool = False  # a read that only measures the link is out (`_fetch_sample`)

    @property
    def is_pending(self) -> bool:
        """The requester waits on a probe or a fetch."""
        return not self.has_given_up and (self.is_probing or bool(self.fetching))


class RemoteSteps:
    """Owned by `TierPipeline`; same thread, same index."""

    def __init__(
        self, index: TierIndex, io: RemoteTierIO, log: EventLog, cost: LoadCostModel | None = None
    ) -> None:
        self._index = index
        self._io = io
        self._log = log
        self._cost = cost  # None: every hit is loaded
        self._lookups: dict[str, RemoteLookup] = {}
        self._writing: set[BlockKey] = set()

    @property
    def is_waiting(self) -> bool:
        """Some requester waits on a probe or a fetch."""
        return any(state.is_pending for state in self._lookups.values())

    # -- lookups ----------------------------------------------------------------------------

    def extend(
        self,
        owner: str,
        keys: Sequence[BlockKey],
        num_local: int,
        *,
        num_tokens: int | None = None,
    ) -> bool:
        """Try to serve `keys[num_local:]` from the remote tier; True = pending (ask again).
        `keys[:num_local]` are ready in CPU. `num_tokens`: the tokens a remote hit saves
        computing, when not a chunk's per key (the load cost model weighs them)."""
        state = self._lookups.setdefault(owner, RemoteLookup())
        if state.has_given_up:
            return False
        if state.is_pending:
            return not self._give_up_if_late(state)
        rest = [key for key in keys[num_local:] if key not in state.fetched]
        if not rest:
            return False
        if rest[0] not in state.found:
            if not self._may_pay(rest, num_tokens):
                return False  # even if Redis held all of it, recomputing is faster
            self._start_clock(state, len(rest), round_trips=2, num_tokens=num_tokens)
            state.is_probing = True
            self._io.submit_probe(rest, owner)
            return True
        num_found = _leading_found(rest, state.found)
        if num_found == 0 or not self._fetch_pays(state, num_found, num_tokens):
            return False
        self._start_clock(state, num_found, round_trips=1, num_tokens=num_tokens)
        wanted = rest[:num_found]
        if (
            self._cost is not None
            and num_tokens is None
            and self._cost.needs_transfer_sample(Tier.REMOTE)
        ):  # an unmeasured link: a few chunks first, the rest once they land in time
            wanted = wanted[: max(1, _SAMPLE_BYTES // self._cost.chunk_bytes)]
        return self._fetch(owner, state, keys[:num_local], wanted)

    def _fetch_pays(self, state: RemoteLookup, num_found: int, num_tokens: int | None) -> bool:
        """Whether to fetch the `num_found` chunks the probe found (counted), or the rest of
        them once a measuring first part landed (decided on the measurement, not counted
        again; the requester's budget starts over from it)."""
        if self._cost is None:
            return True
        if not state.fetched:
            return self._cost.pays(Tier.REMOTE, num_found, num_tokens=num_tokens)
        if not self._cost.decide(Tier.REMOTE, num_found, num_tokens=num_tokens):
            return False
        state.deadline_s = None
        return True

    def _start_clock(
        self,
        state: RemoteLookup,
        num_chunks: int,
        *,
        round_trips: int,
        num_tokens: int | None = None,
    ) -> None:
        """The requester's deadline, from its first remote request on (probe and fetch)."""
        if self._cost is None or state.deadline_s is not None:
            return
        state.deadline_s = self._cost.deadline_s(
            Tier.REMOTE, num_chunks, round_trips=round_trips, num_tokens=num_tokens
        )

    def _give_up_if_late(self, state: RemoteLookup) -> bool:
        """Past its deadline, the requester recomputes; what is in flight lands in CPU for
        whoever asks next (and is the link's measurement)."""
        if self._cost is None or not self._cost.gives_up(Tier.REMOTE, state.deadline_s):
            return False
        state.has_given_up = True
        logger.debug("kvstore: a remote load ran past its budget; recomputed instead")
        return True

    def _may_pay(self, keys: Sequence[BlockKey], num_tokens: int | None = None) -> bool:
        """Before a probe: whether a probe and a fetch of all `keys` could pay (a slow or
        distant Redis is decided against before a request waits on it; counted when not).
        A link whose figures went stale after they said it does not pay is measured again
        aside (`_remeasure`), and the requester recomputes meanwhile."""
        cost = self._cost
        if cost is None:
            return True
        n = len(keys)
        if cost.was_declined(Tier.REMOTE, n, round_trips=2, num_tokens=num_tokens):
            self._remeasure(keys)
        elif cost.decide(Tier.REMOTE, n, round_trips=2, num_tokens=num_tokens):
            return True
        cost.record(Tier.REMOTE, is_load=False)
        return False

    def _remeasure(self, keys: Sequence[BlockKey]) -> None:
        """Probe `keys` and fetch a few found (`_fetch_sample`) for no requester: the link's
        figures become fresh again, and nobody waits on it. One at a time."""
        if _REMEASURE in self._lookups:
            return
        self._lookups[_REMEASURE] = RemoteLookup(is_probing=True, has_given_up=True)
        logger.debug("kvstore: measuring the remote link again (its figures went stale)")
        self._io.submit_probe(list(keys), _REMEASURE)

    def _fetch(
        self, owner: str, state: RemoteLookup, local: Sequence[BlockKey], wanted: list[BlockKey]
    ) -> bool:
        # Rows for the remote chunks only; the requester's local prefix is protected.
        plan = self._index.prepare_store(list(local) + wanted)
        if plan is None or not plan.keys:
            return False
        remote_keys = set(wanted)
        items = [(key, row) for key, row in plan.items() if key in remote_keys]
        others = [key for key, _ in plan.items() if key not in remote_keys]
        if others:  # a local chunk left CPU meanwhile: give its row back, serve less
            self._index.complete_store(others, False)
        if not items:
            return False
        state.fetching.update(key for key, _ in items)
        self._io.submit_fetch(items, owner)
        return True

    def seconds_left(self, owner: str) -> float | None:
        """How long `owner` may still wait on its probe or fetch (its deadline on the load
        cost model's clock); None: no deadline."""
        state = self._lookups.get(owner)
        if self._cost is None or state is None:
            return None
        return self._cost.seconds_until(state.deadline_s)

    def num_waited_chunks(self, owner: str) -> int | None:
        """What `owner` waits on: None (nothing), 0 (a probe), else the chunks being fetched."""
        state = self._lookups.get(owner)
        if state is None or not state.is_pending:
            return None
        return 0 if state.is_probing else len(state.fetching)

    def held_keys(self, owner: str) -> set[BlockKey]:
        state = self._lookups.get(owner)
        return set() if state is None else state.fetched

    def release(self, owner: str) -> None:
        state = self._lookups.get(owner)
        if state is not None and state.held:
            self._index.release(list(state.held))
            state.held.clear()

    def forget(self, owner: str) -> None:
        self.release(owner)
        self._lookups.pop(owner, None)

    # -- completions ------------------------------------------------------------------------

    def finish_probe(self, done: RemoteProbeDone) -> None:
        """The probe's answer: what it found, for its requester; its round trip, and where the
        link's speed is not known a few of the chunks found (`_fetch_sample`), for the next
        lookup, also when the requester gave up and even finished meanwhile (a request that
        recomputes in one step is gone before its probe's answer is applied: without this, a
        link whose round trip outlasts the exploring budget would be explored by every
        request and measured by none)."""
        cost = self._cost
        if cost is not None and done.answered:  # not a timeout's or a breaker's
            cost.observe_round_trip(Tier.REMOTE, done.duration_s)
        tag = str(done.tag)
        state = self._lookups.get(tag)
        if state is None:  # its requester is gone
            if (
                cost is None
                or _REMEASURE in self._lookups
                or not cost.needs_transfer_sample(Tier.REMOTE)
            ):
                return
            tag, state = _REMEASURE, RemoteLookup(is_probing=True, has_given_up=True)
            self._lookups[_REMEASURE] = state
        state.is_probing = False
        state.found.update(zip(done.keys, done.found, strict=True))
        if cost is None:
            return
        if state.has_given_up and cost.needs_transfer_sample(Tier.REMOTE):
            self._fetch_sample(tag, state, done.keys)
        self._end_remeasure(tag, state)  # nothing found to fetch: done

    def _fetch_sample(self, owner: str, state: RemoteLookup, keys: Sequence[BlockKey]) -> None:
        """The requester gave up while its probe was out, and the link's speed is not known:
        fetch a few of the chunks found (into CPU, held by nobody), so that the next lookup
        can decide on a measured link instead of exploring it again. Without this, a link
        whose round trip outlasts the exploring budget would never be measured, and every
        request would pay that budget."""
        assert self._cost is not None
        num_sample = max(1, _SAMPLE_BYTES // self._cost.chunk_bytes)
        found = keys[: min(_leading_found(keys, state.found), num_sample)]
        if not found:
            return
        logger.debug("kvstore: fetching %d remote chunk(s) to measure the link", len(found))
        if not self._fetch(owner, state, [], list(found)):
            # In CPU already (the requester recomputed and stored them before the probe's
            # answer was applied) or no rows: read them only to measure the link.
            state.is_measuring = True
            self._io.submit_measure(list(found), owner)

    def finish_measure(self, done: RemoteMeasureDone) -> None:
        if self._cost is not None and done.num_bytes:
            self._cost.observe_transfer(Tier.REMOTE, done.num_bytes, done.duration_s)
        state = self._lookups.get(str(done.tag))
        if state is None:
            return
        state.is_measuring = False
        self._end_remeasure(str(done.tag), state)

    def _end_remeasure(self, tag: str, state: RemoteLookup) -> None:
        """The measurement aside is done once nothing of it is out any more."""
        if tag == _REMEASURE and not state.fetching and not state.is_measuring:
            del self._lookups[_REMEASURE]

    def finish_fetch(self, done: RemoteFetchDone) -> bool:
        """Verified chunks become ready in CPU (and go to the local disk by write-through);
        they are held for the requester, or let go if it is gone. True when a requester holds
        some of them for its load (their write-through waits for it: `TierPipeline`)."""
        self._index.complete_store(done.ok, True)
        self._index.complete_store(done.failed, False)
        if self._cost is not None and done.ok:
            self._cost.observe_transfer(Tier.REMOTE, done.num_bytes, done.duration_s)
        state = self._lookups.get(str(done.tag))
        if state is None:
            return False
        state.fetching.difference_update(done.ok + done.failed)
        for key in done.failed:
            state.found[key] = False
        if done.failed:
            logger.info("kvstore: %d remote chunk(s) could not be fetched; recomputed",
                        len(done.failed))  # fmt: skip
        held: list[BlockKey] = []
        if not state.has_given_up:  # else the requester recomputes: nothing to hold for it
            held = self._index.hold(done.ok)
            state.held.update(held)
            state.fetched.update(held)
        self._end_remeasure(str(done.tag), state)
        return bool(held)

    def finish_write(self, done: RemoteWriteDone) -> None:
        keys = [key for key in done.ok + done.failed if key in self._writing]
        self._writing.difference_update(keys)
        self._index.unpin_rows(keys)
        self._log.stored_keys(Tier.REMOTE, done.ok)
        if self._cost is not None and done.ok:  # the same link: keeps its figures fresh
            self._cost.observe_transfer(Tier.REMOTE, done.num_bytes, done.duration_s)

    def removed(self, done: RemoteRemoved) -> None:
        self._log.removed(Tier.REMOTE, done.keys, "evicted")

    # -- write-through ----------------------------------------------------------------------

    def touch(self, keys: Sequence[BlockKey]) -> None:
        """The engine served these chunks from its own cache: an access in Redis too."""
        self._io.submit_touch(list(keys))

    def write(self, keys: Sequence[BlockKey]) -> None:
        """Write chunks the engine just stored (ready in CPU) to the remote tier."""
        wanted = [key for key in keys if key not in self._writing]
        if not wanted:
            return
        plan = self._index.pin_rows(wanted)  # while the write reads them
        if not plan.keys:
            return
        if self._io.submit_write(list(plan.items())):
            self._writing.update(plan.keys)
        else:
            self._index.unpin_rows(plan.keys)


def _leading_found(keys: Sequence[BlockKey], found: dict[BlockKey, bool]) -> int:
    count = 0
    for key in keys:
        if not found.get(key, False):
            break
        count += 1
    return count
