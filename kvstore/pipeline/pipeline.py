"""`TierPipeline`: the data path engine -> CPU -> disk and back, as prepare/complete operations.

It owns the index (placement), the tier service (disk I/O off the caller's thread) and the
observers (kvstore's metrics, vLLM's per-step counters), and keeps the pipeline's rules in one
place: a lookup that finds disk-only chunks promotes them into CPU rows and answers "pending"
until they land; loads pin CPU rows until they complete; a completed store is written through
to disk; failed work rolls back and is counted; every placement change becomes an event that
every observer sees once. Adapters (vLLM's scheduler half) translate their calls into these
operations and decide nothing about tiers. The disk rules (queueing, roll-back, completions,
discard reasons, touches) are `DiskSteps`, shared with the disk-only `DiskPipeline`.

Threading: one owner thread (vLLM's scheduler thread) calls everything; the service's results
are applied at the owner's next call (`poll`), so the index stays single-threaded.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Protocol

from kvstore.events import TierEvent
from kvstore.index import TierIndex
from kvstore.index.event_log import EventLog
from kvstore.index.plans import LoadPlan, StorePlan
from kvstore.keys import BlockKey, Tier, short_hex
from kvstore.pipeline.disk_steps import DiskSteps, DiskSubmitter, RowsOnDisk
from kvstore.pipeline.load_cost import LoadCostModel
from kvstore.pipeline.lookups import PENDING, LookupAnswer, OwnerState, num_leading
from kvstore.pipeline.observers import Observers, PipelineObserver
from kvstore.pipeline.remote import RemoteSteps, RemoteTierIO
from kvstore.pipeline.waits import LookupWaits
from kvstore.service import (
    PromotionDone,
    RemoteFetchDone,
    RemoteMeasureDone,
    RemoteProbeDone,
    RemoteWriteDone,
    WriteDone,
)
from kvstore.service.completions import Completion, RemoteCompletion

__all__ = ["LookupAnswer", "PipelineObserver", "PipelineService", "TierPipeline"]

logger = logging.getLogger(__name__)


class PipelineService(DiskSubmitter, Protocol):
    """The I/O the pipeline asks for (`kvstore.service.TierService` on threads,
    `kvstore.service.inline.InlineTierService` on the caller's thread)."""

    @property
    def has_disk(self) -> bool: ...

    @property
    def remote(self) -> RemoteTierIO | None: ...

    def publish(self, events: Sequence[TierEvent]) -> None: ...

    def drain_completions(self, timeout_s: float = 0.0) -> list[Completion]: ...


class TierPipeline:
    """See the module docstring."""

    def __init__(
        self,
        index: TierIndex,
        service: PipelineService,
        observers: Sequence[PipelineObserver] = (),
        *,
        num_tokens_per_chunk: int,
        cost: LoadCostModel | None = None,
        promotion_wait_s: float = 0.0,
    ) -> None:
        self._index = index
        self._cost = cost  # None: every hit is loaded
        self._service = service
        self._observers = Observers(observers, service.publish)
        self._num_tokens_per_chunk = num_tokens_per_chunk
        self._owners: dict[str, OwnerState] = {}
        self._promoted_by: dict[BlockKey, str] = {}
        self._disk = DiskSteps(service, RowsOnDisk(index))
        self._remote_log = EventLog(num_tokens_per_chunk)
        self._remote = (
            RemoteSteps(index, service.remote, self._remote_log, cost)
            if service.remote is not None
            else None
        )
        self._waits = LookupWaits(self.poll, cost, promotion_wait_s)

    @property
    def index(self) -> TierIndex:
        return self._index

    @property
    def has_remote(self) -> bool:
        return self._remote is not None

    def add_observer(self, observer: PipelineObserver) -> None:
        self._observers.add(observer)

    # -- lookups ----------------------------------------------------------------------------

    def prepare_lookup(
        self,
        owner: str,
        keys: Sequence[BlockKey],
        *,
        skip_tokens: int = 0,
        may_wait: bool = True,
        token_counts: Sequence[int] | None = None,
        num_asked_chunks: int | None = None,
        remote_tokens: int | None = None,
        is_final: bool = True,
        wait_until_s: float | None = None,
        is_alone: bool = False,
    ) -> LookupAnswer:
        """The longest prefix of `keys` servable from CPU now; disk-only chunks of it are
        promoted first: the answer waits up to `promotion_wait_s` for them to land (a fast
        read then costs the requester no extra scheduler step), else it is pending until they
        do. `skip_tokens` of the first chunk are the requester's own (not counted as served).
        While a promotion runs, and once it landed, the prefix is held until `prepare_load` or
        `release`; a CPU-only hit is not held (one evicted before its load is `missing` there,
        and recomputed). Hit accounting: each key stands for a chunk of tokens and the lookup
        for `len(keys)` chunks, unless `token_counts` (tokens per key) and `num_asked_chunks`
        say otherwise (a hybrid engine's keys are per group: several per chunk, or none);
        `remote_tokens`: the tokens a remote hit of the rest would save computing. Not
        `is_final`: a partial answer is not counted (the requester asks for other keys next).
        A remote probe and then its fetch are waited for within the same `promotion_wait_s`
        (from the first call on: `wait_until_s`), so a fast link costs no scheduler steps.
        `is_alone`: no other request is in the engine, so a promotion, or a probe and its
        fetch, is waited for up to the requester's own budget (`LookupWaits`)."""
        self.poll()
        state = self._owners.setdefault(owner, OwnerState())
        if state.promoting and not self._give_up_if_late(state):
            return PENDING
        self._release_holds(state)  # asked again: start from a clean slate
        result = self._index.lookup(keys)
        num_hits = result.num_hits
        if state.has_given_up:  # what is in CPU now, nothing from below
            num_hits = num_leading(result.tiers, Tier.CPU)
        elif result.num_hits < len(keys) and keys[result.num_hits] in self._promoted_by:
            return PENDING  # another requester is promoting the rest of this prefix
        elif result.num_disk_hits:
            if self._promotion_pays(result.tiers, token_counts) and self._start_promotion(
                owner, state, result.keys, self._hit_tokens(result.tiers, token_counts)
            ):
                if may_wait and self._waits.promotion(
                    state, result.num_disk_hits, is_alone=is_alone
                ):
                    return self.prepare_lookup(
                        owner, keys, skip_tokens=skip_tokens, may_wait=False,
                        token_counts=token_counts, num_asked_chunks=num_asked_chunks,
                        remote_tokens=remote_tokens, is_final=is_final,
                    )  # fmt: skip
                return PENDING
            num_hits = num_leading(result.tiers, Tier.CPU)
        elif self._remote is not None and self._remote.extend(
            owner, keys, num_hits, num_tokens=remote_tokens
        ):
            until_s = self._waits.remote(
                self._remote, owner, wait_until_s, is_alone=is_alone
            ) if may_wait else None
            return PENDING if until_s is None else self.prepare_lookup(
                owner, keys, skip_tokens=skip_tokens, token_counts=token_counts,
                num_asked_chunks=num_asked_chunks, remote_tokens=remote_tokens,
                is_final=is_final, wait_until_s=until_s, is_alone=is_alone,
            )  # fmt: skip
        fetched = self._remote.held_keys(owner) if self._remote is not None else set()
        tiers = tuple(
            Tier.REMOTE if key in fetched else state.sources.get(key, Tier.CPU)
            for key in keys[:num_hits]
        )
        if is_final or len(tiers) == len(keys):
            self._record_lookup(
                state,
                len(keys) if num_asked_chunks is None else num_asked_chunks,
                skip_tokens,
                tiers,
                token_counts,
            )
        if not tiers:
            self._release_holds(state)
        self._pump_events()
        return LookupAnswer(tiers)

    def _promotion_pays(
        self, tiers: Sequence[Tier], token_counts: Sequence[int] | None = None
    ) -> bool:
        """Whether reading the hit's disk-only chunks beats recomputing them (`load_policy`).
        With `token_counts` (a hybrid engine, whose hit is whole or nothing) the read is
        weighed against recomputing the whole hit."""
        if self._cost is None:
            return True
        num_disk = sum(1 for tier in tiers if tier is Tier.DISK)
        num_tokens = self._hit_tokens(tiers, token_counts)
        return self._cost.pays(Tier.DISK, num_disk, num_tokens=num_tokens)

    @staticmethod
    def _hit_tokens(tiers: Sequence[Tier], token_counts: Sequence[int] | None) -> int | None:
        return None if token_counts is None else sum(token_counts[: len(tiers)])

    def _give_up_if_late(self, state: OwnerState) -> bool:
        """Past its deadline, the requester stops waiting for its promotions and takes what is
        in CPU (a slow disk costs it at most the budget); they land in CPU for whoever asks
        next, and are the disk's measurement."""
        if self._cost is None or not self._cost.gives_up(Tier.DISK, state.deadline_s):
            return False
        state.has_given_up = True
        for key in state.promoting:  # no longer its: released when they land
            self._promoted_by.pop(key, None)
            state.sources.pop(key, None)
        state.promoting.clear()
        logger.debug("kvstore: a disk promotion ran past its budget; recomputed instead")
        return True

    def observe_step(self, num_tokens: int, duration_s: float) -> None:
        """An engine step computed `num_tokens` tokens in `duration_s` (the cost of recompute)."""
        if self._cost is not None:
            self._cost.observe_step(num_tokens, duration_s)

    def _start_promotion(
        self, owner: str, state: OwnerState, keys: Sequence[BlockKey], num_tokens: int | None
    ) -> bool:
        plan = self._index.plan_promotion(list(keys))
        state.held.update(plan.held)
        if not plan.keys:
            return False
        if not self._disk.read(list(plan.items())):
            return False
        if self._cost is not None and state.deadline_s is None:
            state.deadline_s = self._cost.deadline_s(
                Tier.DISK, len(plan.keys), num_tokens=num_tokens
            )
        state.promoting.update(plan.keys)
        for key in plan.keys:
            state.sources[key] = Tier.DISK
            self._promoted_by[key] = owner
        self._pump_events()
        return True

    def _record_lookup(
        self,
        state: OwnerState,
        num_chunks: int,
        skip_tokens: int,
        tiers: Sequence[Tier],
        token_counts: Sequence[int] | None = None,
    ) -> None:
        """Count one lookup per requester, in tokens it did not already have."""
        if state.is_lookup_recorded:
            return
        state.is_lookup_recorded = True
        chunk_tokens = self._num_tokens_per_chunk
        hits: dict[Tier, tuple[int, int]] = {tier: (0, 0) for tier in Tier}
        for i, tier in enumerate(tiers):
            key_tokens = chunk_tokens if token_counts is None else token_counts[i]
            if key_tokens == 0:
                continue  # another group's share of a chunk already counted
            chunks, tokens = hits[tier]
            hits[tier] = (
                chunks + key_tokens // chunk_tokens,
                tokens + key_tokens - (skip_tokens if i == 0 else 0),
            )
        self._observers.record_lookup(num_chunks, num_chunks * chunk_tokens - skip_tokens, hits)

    def record_engine_hit(self, keys: Sequence[BlockKey]) -> None:
        """The engine's own prefix cache served these chunks of a request: an access in every
        tier that holds them, so a prefix the engine keeps hot does not age out of kvstore's
        tiers while the engine hides its use (CPU and disk policies now; the disk records'
        hit times and Redis's LRU through the service's batched, asynchronous touches). No I/O
        on the caller's thread. Call it once per request, not once per lookup."""
        if not keys:
            return
        self._index.touch(keys)
        self._disk.served(keys)
        if self._remote is not None:
            self._remote.touch(keys)

    def release(self, owner: str) -> None:
        """The requester will not load what its lookup held (abandoned or asked again)."""
        state = self._owners.get(owner)
        if state is not None:
            self._release_holds(state)
        if self._remote is not None:
            self._remote.release(owner)
            self._write_through()  # what it fetched and held, no longer waiting for its load

    def forget(self, owner: str) -> None:
        """The requester is done; its promotions in flight release their chunks on landing."""
        state = self._owners.pop(owner, None)
        if state is not None:
            self._release_holds(state)
        if self._remote is not None:
            self._remote.forget(owner)
            self._write_through()

    # -- loads ------------------------------------------------------------------------------

    def prepare_load(self, owner: str, keys: Sequence[BlockKey]) -> LoadPlan:
        """Pin the chunks for a CPU -> engine copy (the lookup's holds pass to the pins); a
        chunk gone since the lookup is `missing` (recomputed: counted as a failed load)."""
        plan = self._index.prepare_load(keys)
        state = self._owners.get(owner)
        if state is not None:
            self._release_holds(state)
        if self._remote is not None:
            self._remote.release(owner)
        if plan.missing:
            logger.warning("kvstore: %d chunk(s) vanished before their load; recomputed",
                           len(plan.missing))  # fmt: skip
            self._observers.record_load_failure(len(plan.missing))
        return plan

    def complete_load(self, keys: Sequence[BlockKey], *, ok: bool) -> None:
        """The copy landed (their disk records are touched: a hit) or failed (counted)."""
        self._index.complete_load(keys)
        if ok:
            self._disk.served(keys)
        else:
            self._observers.record_load_failure(len(keys))
        if self._remote is not None:
            self._write_through()  # remote hits it loaded go to the local disk now

    # -- stores -----------------------------------------------------------------------------

    def prepare_store(
        self,
        keys: Sequence[BlockKey],
        *,
        token_ids: Sequence[int] | None = None,
        parent_key: BlockKey | None = None,
    ) -> StorePlan | None:
        """Reserve CPU rows for an engine -> CPU copy (None: no room at all)."""
        plan = self._index.prepare_store(keys, token_ids=token_ids, parent_key=parent_key)
        self._pump_events()
        return plan

    def complete_store(self, keys: Sequence[BlockKey], *, ok: bool) -> None:
        """The copy landed (or failed): the chunks become ready and are written through (to
        the local disk, and to the remote tier)."""
        self._index.complete_store(keys, ok)
        self._write_through()
        if ok and self._remote is not None:
            self._remote.write(keys)
        self._pump_events()

    def _write_through(self) -> None:
        if not self._service.has_disk:
            self._index.plan_write_through()  # drops the candidates: no disk to write to
            return
        plan = self._index.plan_write_through()
        self._disk.write(list(plan.items()), list(plan.evicted))

    # -- completions, events ----------------------------------------------------------------

    @property
    def is_waiting(self) -> bool:
        """Some requester waits on a promotion or a remote probe or fetch in flight."""
        remote = self._remote
        return any(state.promoting for state in self._owners.values()) or (
            remote is not None and remote.is_waiting
        )

    def poll(self, wait_s: float = 0.0) -> None:
        """Apply the tier service's finished work (disk writes, promotions, remote answers).
        With `wait_s`, while a requester waits on that work and nothing has finished, block
        up to `wait_s` for the first answer (see `ConnectorScheduler.build_connector_meta`)."""
        timeout_s = wait_s if wait_s > 0 and self.is_waiting else 0.0
        for done in self._service.drain_completions(timeout_s):
            if isinstance(done, WriteDone):
                self._disk.finish_write(done)
            elif isinstance(done, PromotionDone):
                self._finish_promotion(done)
            else:
                self._finish_remote(done)
        self._pump_events()

    def _finish_remote(self, done: RemoteCompletion) -> None:
        remote = self._remote
        if remote is None:
            return
        if isinstance(done, RemoteProbeDone):
            remote.finish_probe(done)
        elif isinstance(done, RemoteFetchDone):
            # The local disk keeps a copy of what Redis served, written once the requester's
            # load has landed (`complete_load`, `release`, `forget`): a disk write of a whole
            # prompt beside its load and forward slowed that first token by ~27% (in-process).
            if not remote.finish_fetch(done):
                self._write_through()
        elif isinstance(done, RemoteMeasureDone):
            remote.finish_measure(done)
        elif isinstance(done, RemoteWriteDone):
            remote.finish_write(done)
        else:
            remote.removed(done)

    def _finish_promotion(self, done: PromotionDone) -> None:
        if self._cost is not None and done.ok:
            self._cost.observe_transfer(Tier.DISK, done.num_bytes, done.duration_s)
        index = self._index
        lost = self._disk.finish_read(done)
        landed = set(done.ok)
        for key in done.ok + lost:
            owner = self._promoted_by.pop(key, None)
            state = self._owners.get(owner) if owner is not None else None
            if state is None:  # the requester is gone: let the chunk go
                if key in landed:
                    index.release([key])
                continue
            state.promoting.discard(key)
            if key in landed:
                state.held.add(key)
            else:
                state.sources.pop(key, None)
        for key in lost:
            logger.info("kvstore: promotion of chunk %s failed; it will be recomputed",
                        short_hex(key))  # fmt: skip

    def take_events(self) -> list[TierEvent]:
        """Placement events since the last call (already counted by every observer)."""
        self._pump_events()
        return self._observers.take_events()

    def _pump_events(self) -> None:
        self._observers.record_events(self._index.take_events() + self._remote_log.take())

    def settle(self) -> None:
        """Apply finished disk work now (tests and shutdown)."""
        self.poll()
        self._write_through()
        self._pump_events()

    def _release_holds(self, state: OwnerState) -> None:
        if state.held:
            self._index.release(list(state.held))
            state.held.clear()
