"""A random workload of overlapping stores, lookups, loads and touches against a tiny tier, stepped
like vLLM's scheduler; afterwards the index, the store and the events must all agree."""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pytest
from vllm.v1.kv_offload.base import LookupResult, OffloadKey, ReqContext, ScheduleEndContext
from vllm.v1.kv_offload.tiering.base import JobResult

from kvstore.vllm import LMDBTier

from .helpers import NUM_SLOTS, SLOT_BYTES, Harness, finish, job, key, metric

CTX = ReqContext(req_id="workload")
STEP_END = ScheduleEndContext(new_req_ids=(), preempted_req_ids=())
NUM_KEYS = 12


def value_of(offload_key: bytes) -> np.ndarray:
    seed = int.from_bytes(offload_key[:8], "big")
    return np.random.default_rng(seed).integers(0, 256, SLOT_BYTES, dtype=np.uint8)


@dataclass
class Workload:
    """The scheduler side of the test: free primary slots and the jobs in flight."""

    tier: LMDBTier
    primary: np.ndarray
    rng: random.Random
    free_slots: list[int] = field(default_factory=lambda: list(range(NUM_SLOTS)))
    jobs: dict[int, tuple[list[OffloadKey], list[int], bool]] = field(default_factory=dict)
    next_job_id: int = 0
    num_loaded: int = 0

    def store(self) -> None:
        keys = list(dict.fromkeys(key(self.rng.randrange(NUM_KEYS)) for _ in range(3)))
        slots = self._take(len(keys))
        if slots is None:
            return
        for offload_key, slot in zip(keys, slots, strict=True):
            self.primary[slot] = value_of(offload_key)
        self._submit(keys, slots, is_promotion=False)

    def load(self) -> None:
        hits = [k for i in range(NUM_KEYS) if self.tier.lookup(k := key(i), CTX).name == "HIT"]
        keys = self.rng.sample(hits, min(len(hits), self.rng.randint(1, 3)))
        slots = self._take(len(keys))
        if keys and slots is not None:
            self.primary[slots] = 0
            self._submit(keys, slots, is_promotion=True)

    def collect(self) -> None:
        if self.rng.random() < 0.5:  # else take what has finished by now
            self.tier.drain_jobs()
        for result in self.tier.get_finished_jobs():
            self._check(result)

    def _check(self, result: JobResult) -> None:
        keys, slots, is_promotion = self.jobs.pop(result.job_id)
        self.free_slots += slots
        if not is_promotion:
            return
        loaded = set(keys) if result.success else set(result.successful_keys or ())
        for offload_key, slot in zip(keys, slots, strict=True):
            if offload_key in loaded:
                assert np.array_equal(self.primary[slot], value_of(offload_key))
                self.num_loaded += 1

    def _take(self, n: int) -> list[int] | None:
        if n > len(self.free_slots):
            return None
        slots, self.free_slots = self.free_slots[:n], self.free_slots[n:]
        return slots

    def _submit(self, keys: list[OffloadKey], slots: list[int], *, is_promotion: bool) -> None:
        self.next_job_id += 1
        self.jobs[self.next_job_id] = (keys, slots, is_promotion)
        transfer = job(self.next_job_id, keys, slots, is_promotion=is_promotion)
        if is_promotion:
            self.tier.submit_load(transfer)
        else:
            self.tier.submit_store(transfer)


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_index_store_and_events_agree_after_a_random_workload(
    harness: Harness, policy: str
) -> None:
    tier = harness.open(capacity_bytes=5 * SLOT_BYTES, eviction_policy=policy)
    work = Workload(tier, harness.primary, random.Random(7))
    events = []
    for _ in range(400):
        action = work.rng.choice((work.store, work.store, work.load, work.collect))
        action()
        if work.rng.random() < 0.3:
            tier.touch([key(work.rng.randrange(NUM_KEYS))], CTX)
        if work.rng.random() < 0.5:
            tier.on_schedule_end(STEP_END)
        events += tier.take_events()
    tier.drain_jobs()
    work.collect()
    events += tier.take_events()
    tier.on_schedule_end(STEP_END)
    assert not work.jobs and not tier.has_pending_work()
    assert work.num_loaded > 20
    assert metric(tier, "kvstore_evicted_chunks_total", tier="disk") > 20

    held = {key(i) for i in range(NUM_KEYS) if tier.lookup(key(i), CTX) is LookupResult.HIT}
    balance = Counter[bytes]()
    for event in events:
        for offload_key in event.keys:
            balance[offload_key] += -1 if event.removed else 1
            assert balance[offload_key] in (0, 1), "a removal without a store, or a double store"
    assert {k for k, n in balance.items() if n == 1} == held
    tier.drain_jobs()  # the last deletes
    assert set(tier.store.iter_keys(tier.namespace)) == held
    assert tier.store.stats().used_bytes == len(held) * SLOT_BYTES <= 5 * SLOT_BYTES
    tier.submit_load(job(10_000, sorted(held), range(len(held)), is_promotion=True))
    assert finish(tier, 10_000)[10_000].success
