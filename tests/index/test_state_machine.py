"""Random sequences of index operations, as a connector and tier service would issue them.

The machine plays the caller: it remembers what it has in flight (stores, writes, promotions,
loads, holds) and completes or releases only that, in any order, succeeding or failing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from kvstore.index import EntryState, IndexConfig, SeedEntry, TierIndex
from kvstore.keys import BlockKey, Tier
from kvstore.policies import POLICY_NAMES

from .helpers import CHUNK_BYTES, TOKENS, FakeClock, k, replay

# Requests walk a few chains of keys, as prompts sharing prefixes do; some are arbitrary lists.
CHAINS = [[k(10 * chain + i) for i in range(6)] for chain in range(3)]
chain_prefixes = st.builds(
    lambda chain, start, length: CHAINS[chain][start : start + length],
    st.integers(0, len(CHAINS) - 1),
    st.sampled_from([0, 0, 0, 0, 1, 2]),
    st.integers(1, 6),
)
arbitrary = st.lists(
    st.sampled_from([key for chain in CHAINS for key in chain]), min_size=1, max_size=5, unique=True
)
key_lists = st.one_of(chain_prefixes, chain_prefixes, chain_prefixes, arbitrary)


def some(draw: st.DataObject, keys: Iterable[BlockKey]) -> list[BlockKey]:
    """A non-empty sub-list of `keys` (in their order)."""
    pool = sorted(keys)
    chosen = draw.draw(st.lists(st.sampled_from(pool), min_size=1, unique=True))
    return [key for key in pool if key in chosen]


class IndexMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.index: TierIndex
        self.members: dict[Tier, set[BlockKey]] = {Tier.CPU: set(), Tier.DISK: set()}
        self.storing: set[BlockKey] = set()
        self.writing: set[BlockKey] = set()
        self.promoting: set[BlockKey] = set()
        self.holds: Counter[BlockKey] = Counter()
        self.loads: Counter[BlockKey] = Counter()

    @initialize(
        num_cpu_rows=st.integers(1, 4),
        num_disk_chunks=st.sampled_from([0, 1, 3, 6, 12]),
        cpu_policy=st.sampled_from(POLICY_NAMES),
        disk_policy=st.sampled_from(POLICY_NAMES),
        admission_min_sightings=st.sampled_from([1, 2]),
        warm_order=st.permutations(range(len(CHAINS))),
    )
    def setup(
        self,
        num_cpu_rows: int,
        num_disk_chunks: int,
        cpu_policy: str,
        disk_policy: str,
        admission_min_sightings: int,
        warm_order: list[int],
    ) -> None:
        config = IndexConfig(
            num_cpu_rows=num_cpu_rows,
            chunk_bytes=CHUNK_BYTES,
            num_tokens_per_chunk=TOKENS,
            disk_capacity_bytes=num_disk_chunks * CHUNK_BYTES,
            cpu_policy=cpu_policy,
            disk_policy=disk_policy,
            admission_min_sightings=admission_min_sightings,
        )
        self.index = TierIndex(config, clock=FakeClock())
        for chain in (CHAINS[i] for i in warm_order):
            # Start from a used index: later chains push earlier ones out of CPU, onto disk.
            for _ in range(admission_min_sightings):
                self.index.lookup(chain)
            self.write_whole_request(chain)

    def pinned_by_us(self) -> set[BlockKey]:
        return set(self.loads) | set(self.holds) | self.writing

    @rule(keys=key_lists)
    def lookup(self, keys: list[BlockKey]) -> None:
        result = self.index.lookup(keys)
        event(
            "lookup",
            "promotion limited"
            if result.is_promotion_limited
            else "disk hit"
            if result.num_disk_hits
            else "cpu hit"
            if result.num_hits
            else "miss",
        )
        assert result.keys == tuple(keys[: result.num_hits])
        for key, tier in zip(result.keys, result.tiers, strict=True):
            assert self.index.state_of(tier, key) is EntryState.READY
            if tier is Tier.DISK:
                assert self.index.state_of(Tier.CPU, key) is None

    @rule(keys=key_lists)
    def store_and_write_through(self, keys: list[BlockKey]) -> None:
        """A whole store and its write-through, completed at once (reaches deep states sooner)."""
        self.write_whole_request(keys)

    def write_whole_request(self, keys: list[BlockKey]) -> None:
        plan = self.index.prepare_store(keys)
        if plan is not None:
            self.index.complete_store(plan.keys, success=True)
        write = self.index.plan_write_through()
        self.index.complete_write_through(write.keys, success=True)

    @rule(keys=key_lists, with_tokens=st.booleans())
    def prepare_store(self, keys: list[BlockKey], with_tokens: bool) -> None:
        tokens = list(range(len(keys) * TOKENS)) if with_tokens else None
        pinned = self.pinned_by_us()
        plan = self.index.prepare_store(keys, token_ids=tokens)
        if plan is None:
            return
        assert not set(plan.evicted) & (pinned | set(keys))
        assert set(plan.keys) <= set(keys)
        self.storing |= set(plan.keys)

    @precondition(lambda self: self.storing)
    @rule(data=st.data(), success=st.booleans())
    def complete_store(self, data: st.DataObject, success: bool) -> None:
        keys = some(data, self.storing)
        self.index.complete_store(keys, success)
        self.storing -= set(keys)

    @rule(keys=key_lists)
    def touch(self, keys: list[BlockKey]) -> None:
        self.index.touch(keys)

    @rule(keys=key_lists, use_candidates=st.booleans())
    def plan_write_through(self, keys: list[BlockKey], use_candidates: bool) -> None:
        plan = self.index.plan_write_through(None if use_candidates else keys)
        assert not set(plan.evicted) & self.promoting
        for key in plan.keys:
            assert self.index.state_of(Tier.CPU, key) is EntryState.READY
        self.writing |= set(plan.keys)

    @precondition(lambda self: self.writing)
    @rule(data=st.data(), success=st.booleans())
    def complete_write_through(self, data: st.DataObject, success: bool) -> None:
        keys = some(data, self.writing)
        self.index.complete_write_through(keys, success)
        self.writing -= set(keys)

    @rule(keys=key_lists)
    def plan_promotion(self, keys: list[BlockKey]) -> None:
        pinned = self.pinned_by_us()
        lookup = self.index.lookup(keys)
        plan = self.index.plan_promotion(lookup.keys)
        event("promotion", "promoted" if plan.keys else "held only" if plan.held else "nothing")
        assert not set(plan.evicted) & (pinned | set(lookup.keys))
        assert set(plan.keys) | set(plan.held) == set(lookup.keys)  # lookup never over-commits
        self.promoting |= set(plan.keys)
        self.holds.update(plan.keys)
        self.holds.update(plan.held)

    @precondition(lambda self: self.promoting)
    @rule(data=st.data(), success=st.booleans())
    def complete_promotion(self, data: st.DataObject, success: bool) -> None:
        keys = some(data, self.promoting)
        self.index.complete_promotion(keys, success)
        self.promoting -= set(keys)
        if not success:
            self.holds.subtract(keys)
            self.holds = +self.holds

    @precondition(lambda self: self.holds)
    @rule(data=st.data())
    def release(self, data: st.DataObject) -> None:
        keys = some(data, self.holds)
        assert self.index.release(keys) == len(keys)
        self.holds.subtract(keys)
        self.holds = +self.holds

    @rule(keys=key_lists, everything=st.booleans())
    def prepare_load(self, keys: list[BlockKey], everything: bool) -> None:
        if everything:  # pin every ready CPU chunk: leaves no room to promote into
            keys = sorted(self.index.ready_keys(Tier.CPU))
        plan = self.index.prepare_load(keys)
        assert set(plan.keys) | set(plan.missing) == set(keys)
        self.loads.update(plan.keys)

    @precondition(lambda self: self.loads)
    @rule(data=st.data())
    def complete_load(self, data: st.DataObject) -> None:
        keys = some(data, self.loads)
        self.index.complete_load(keys)
        self.loads.subtract(keys)
        self.loads = +self.loads

    @rule(keys=key_lists, tier=st.sampled_from(Tier))
    def discard(self, keys: list[BlockKey], tier: Tier) -> None:
        gone = self.index.discard(keys, tier, "corrupt")
        if tier is Tier.CPU:
            assert not set(gone) & (self.storing | self.promoting)
        else:
            assert not set(gone) & self.writing
        for key in gone:
            assert self.index.state_of(tier, key) in (None, EntryState.REMOVING)

    @rule(num_chunks=st.integers(0, 12))
    def evict_disk_to(self, num_chunks: int) -> None:
        pinned_on_disk = self.promoting | self.writing
        evicted = self.index.evict_disk_to(num_chunks * CHUNK_BYTES)
        assert not set(evicted) & pinned_on_disk

    @precondition(lambda self: self.index.config.has_disk)
    @rule(keys=key_lists, sizes=st.lists(st.integers(1, 2 * CHUNK_BYTES), min_size=6, max_size=6))
    def seed_disk(self, keys: list[BlockKey], sizes: list[int]) -> None:
        """Chunks of varied sizes found in the store (as after a restart)."""
        before = self.index.ready_keys(Tier.DISK)
        seeds = [
            SeedEntry(key, size, float(i))
            for i, (key, size) in enumerate(zip(keys, sizes, strict=False))
        ]
        dropped = self.index.seed_disk(seeds)
        added = self.index.ready_keys(Tier.DISK) - before
        assert not set(dropped) & added
        assert added | set(dropped) <= set(keys)

    @invariant()
    def index_is_consistent(self) -> None:
        self.index.check_invariants()
        stats = self.index.stats()
        for tier_stats in (stats.cpu, stats.disk):
            if tier_stats is not None:
                assert tier_stats.used_bytes + tier_stats.free_bytes == tier_stats.capacity_bytes
                assert tier_stats.used_bytes <= tier_stats.capacity_bytes

    @invariant()
    def events_replay_to_ready_membership(self) -> None:
        replay(self.index.take_events(), self.members)
        for tier in (Tier.CPU, Tier.DISK):  # the tiers the index places (Redis owns remote)
            assert self.members[tier] == self.index.ready_keys(tier)

    @invariant()
    def pinned_chunks_stay(self) -> None:
        for key in self.pinned_by_us():
            assert self.index.state_of(Tier.CPU, key) is not None
        for key in self.promoting | self.writing:
            assert self.index.state_of(Tier.DISK, key) is not None
        for key in self.storing:
            assert self.index.state_of(Tier.CPU, key) is EntryState.STORING
        for key in self.promoting:
            assert self.index.state_of(Tier.CPU, key) is EntryState.STORING
        for key in self.writing:
            assert self.index.state_of(Tier.DISK, key) is EntryState.STORING


IndexMachine.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestIndexMachine = IndexMachine.TestCase
