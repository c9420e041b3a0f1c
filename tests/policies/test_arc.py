"""ARC specifics: T1/T2, ghost lists, the adaptive target."""

from __future__ import annotations

from kvstore.keys import BlockKey
from kvstore.policies import ARCPolicy, LRUPolicy


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(4, "big"))


def test_frequent_keys_survive_a_scan() -> None:
    arc = ARCPolicy(capacity=4)
    for i in range(2):
        arc.insert(k(i))
        arc.touch(k(i))  # seen twice: T2
    for i in range(100, 110):  # a one-time scan through T1
        if len(arc) == 4:
            assert arc.evict(1, set()) is not None
        arc.insert(k(i))
    assert k(0) in arc and k(1) in arc


def test_lru_loses_frequent_keys_to_a_scan() -> None:
    lru = LRUPolicy()
    for i in range(2):
        lru.insert(k(i))
        lru.touch(k(i))
    for i in range(100, 110):
        if len(lru) == 4:
            lru.evict(1, set())
        lru.insert(k(i))
    assert k(0) not in lru and k(1) not in lru


def test_b1_ghost_hit_grows_target_and_enters_t2() -> None:
    arc = ARCPolicy(capacity=2)
    arc.insert(k(0))
    arc.insert(k(1))
    assert arc.evict(1, set()) == [k(0)]  # T1 victim -> B1 ghost
    assert arc.num_ghosts == 1
    arc.insert(k(0))
    assert arc.target_t1_size == 1.0
    assert arc.num_ghosts == 0
    # k(0) went to T2, so the T1 key k(1) is evicted first while |T1| > p is false -> T2 first.
    arc.insert(k(2))
    assert arc.evict(1, set()) == [k(1)]


def test_b2_ghost_hit_shrinks_target() -> None:
    arc = ARCPolicy(capacity=2)
    arc.insert(k(0))
    arc.insert(k(1))
    assert arc.evict(1, set()) == [k(0)]
    arc.insert(k(0))  # B1 hit: p = 1, k(0) in T2
    assert arc.evict(2, set()) is not None  # empties the cache into ghosts
    assert k(0) not in arc
    arc.insert(k(0))  # k(0) was evicted from T2: B2 hit
    assert arc.target_t1_size == 0.0


def test_ghosts_are_bounded_by_capacity() -> None:
    arc = ARCPolicy(capacity=3)
    for i in range(50):
        if len(arc) == 3:
            arc.evict(1, set())
        arc.insert(k(i))
        if i % 3 == 0:
            arc.touch(k(i))
        assert arc.num_ghosts <= 3
        assert len(arc) <= 3
