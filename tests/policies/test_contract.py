"""The contract every eviction policy keeps, run against each of them."""

from __future__ import annotations

import pytest

from kvstore.errors import ConfigError
from kvstore.keys import BlockKey
from kvstore.policies import POLICY_NAMES, EvictionPolicy, make_policy


def k(i: int) -> BlockKey:
    return BlockKey(i.to_bytes(4, "big"))


@pytest.fixture(params=POLICY_NAMES)
def policy(request: pytest.FixtureRequest) -> EvictionPolicy:
    return make_policy(request.param, capacity=8)


def filled(policy: EvictionPolicy, n: int) -> EvictionPolicy:
    for i in range(n):
        policy.insert(k(i))
    return policy


def test_is_an_eviction_policy(policy: EvictionPolicy) -> None:
    assert isinstance(policy, EvictionPolicy)
    assert policy.name in POLICY_NAMES


def test_len_and_contains_track_insert_remove_evict(policy: EvictionPolicy) -> None:
    filled(policy, 4)
    assert len(policy) == 4
    assert k(2) in policy and k(9) not in policy
    policy.insert(k(2))  # again: an access, not a second copy
    assert len(policy) == 4
    assert policy.remove(k(2)) is True
    assert policy.remove(k(2)) is False
    assert k(2) not in policy and len(policy) == 3
    victims = policy.evict(2, set())
    assert victims is not None and len(victims) == 2
    assert len(policy) == 1
    assert all(victim not in policy for victim in victims)


def test_evicts_in_insertion_order_without_accesses(policy: EvictionPolicy) -> None:
    filled(policy, 5)
    assert policy.evict(3, set()) == [k(0), k(1), k(2)]


def test_touched_key_is_evicted_after_untouched_ones(policy: EvictionPolicy) -> None:
    filled(policy, 4)
    policy.touch(k(0))
    victims = policy.evict(3, set())
    assert victims is not None and k(0) not in victims
    assert k(0) in policy


def test_touch_of_unknown_key_is_ignored(policy: EvictionPolicy) -> None:
    filled(policy, 2)
    policy.touch(k(99))
    assert len(policy) == 2 and k(99) not in policy


def test_evict_skips_protected_keys(policy: EvictionPolicy) -> None:
    filled(policy, 5)
    protected = {k(0), k(2)}
    victims = policy.evict(3, protected)
    assert victims == [k(1), k(3), k(4)]
    assert k(0) in policy and k(2) in policy


def test_evict_is_atomic_when_it_cannot_satisfy(policy: EvictionPolicy) -> None:
    filled(policy, 4)
    before = list(policy.victims(set()))
    assert policy.evict(3, {k(0), k(1)}) is None
    assert policy.evict(5, set()) is None
    assert len(policy) == 4
    assert list(policy.victims(set())) == before


def test_evict_zero_and_negative(policy: EvictionPolicy) -> None:
    filled(policy, 2)
    assert policy.evict(0, set()) == []
    with pytest.raises(ValueError, match="-1"):
        policy.evict(-1, set())
    assert len(policy) == 2


def test_victims_preview_matches_evict_and_changes_nothing(policy: EvictionPolicy) -> None:
    filled(policy, 6)
    policy.touch(k(1))
    policy.touch(k(4))
    protected = {k(2)}
    preview = list(policy.victims(protected))
    assert len(policy) == 6
    assert k(2) not in preview and len(preview) == 5
    assert policy.evict(4, protected) == preview[:4]


def test_removed_key_is_never_a_victim(policy: EvictionPolicy) -> None:
    filled(policy, 3)
    policy.remove(k(0))
    assert policy.evict(2, set()) == [k(1), k(2)]
    assert policy.evict(1, set()) is None


def test_reinserted_key_is_held_again(policy: EvictionPolicy) -> None:
    filled(policy, 3)
    victims = policy.evict(1, set())
    assert victims == [k(0)]
    policy.insert(k(0))
    assert k(0) in policy and len(policy) == 3


def test_make_policy_rejects_unknown_name() -> None:
    with pytest.raises(ConfigError, match=r"'mru'.*allowed: 'lru', 'arc'"):
        make_policy("mru", 4)


def test_make_policy_rejects_bad_capacity() -> None:
    with pytest.raises(ConfigError, match="got 0"):
        make_policy("lru", 0)
