"""What a hybrid engine stores and asks for, group by group (`kvstore.vllm.hybrid`)."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.keys import BlockKey, group_key, split_group_key
from kvstore.vllm.geometry import FULL, SLIDING, KVGroup
from kvstore.vllm.hybrid import HybridPlanner

CHUNK = 32
# the tiny Gemma-3-style model: three 64-token sliding-window groups, then one full
GEMMA = (
    KVGroup(0, SLIDING, 64, ("l0",)),
    KVGroup(1, SLIDING, 64, ("l1",)),
    KVGroup(2, SLIDING, 64, ("l2",)),
    KVGroup(3, FULL, 0, ("l3",)),
)


def planner(retention_chunks: int = 0, groups: tuple[KVGroup, ...] = GEMMA) -> HybridPlanner:
    return HybridPlanner(groups, CHUNK, retention_chunks)


def test_a_sliding_group_needs_the_chunks_its_window_reaches_back_to() -> None:
    # the token computed at boundary t attends t-63..t: chunks ceil(63/32) = 2 back
    assert planner().window(0) == 2
    assert planner().window(3) == 0
    exact = HybridPlanner((KVGroup(0, SLIDING, 33, ("l",)),), CHUNK, 0)
    assert exact.window(0) == 1  # 32 tokens back fit in the last chunk
    wide = HybridPlanner((KVGroup(0, SLIDING, 65, ("l",)),), CHUNK, 0)
    assert wide.window(0) == 2


def test_full_groups_store_every_chunk_sliding_ones_the_windows_of_retained_boundaries() -> None:
    p = planner(retention_chunks=4)
    prompt_boundary = 6  # a 200-token prompt: 6 full chunks before its last token
    stored = {g: [c for c in range(10) if p.is_stored(g, c, prompt_boundary)] for g in range(4)}
    assert stored[3] == list(range(10))
    # boundary 4 (retention) needs 2, 3; boundary 6 (the prompt) 4, 5; boundary 8: 6, 7
    assert stored[0] == stored[1] == stored[2] == [2, 3, 4, 5, 6, 7]
    only_prompt = planner(retention_chunks=0)
    assert [c for c in range(10) if only_prompt.is_stored(0, c, prompt_boundary)] == [4, 5]


def test_a_hit_needs_every_full_chunk_and_each_sliding_groups_window() -> None:
    p = planner()
    assert p.needed(6, 0) == [(c, 3) for c in range(4)] + [(c, g) for c in (4, 5) for g in range(4)]
    # the engine holds chunks 0-4: kvstore supplies chunk 5 of every group
    assert p.needed(6, 5) == [(5, g) for g in range(4)]


def test_the_longest_hit_is_the_last_boundary_every_group_serves() -> None:
    p = planner()
    present = {(c, 3) for c in range(8)} | {(c, g) for c in (2, 3, 4, 5) for g in range(3)}

    def has(chunk: int, group: int) -> bool:
        return (chunk, group) in present

    assert p.longest_hit(0, 8, has) == 6  # windows 4-5 serve boundary 6 (and 2-3 boundary 4)
    present -= {(5, 1)}
    assert p.longest_hit(0, 8, has) == 5  # 3-4 serve boundary 5
    present -= {(3, 0)}
    assert p.longest_hit(0, 8, has) == 0  # no boundary has a whole window in every group
    present -= {(2, 3)}
    assert p.longest_hit(0, 8, has) == 0
    # the full group bounds it: a missing chunk 1 caps every boundary at 1
    present = {(c, g) for c in range(8) for g in range(4)} - {(1, 3)}
    assert p.longest_hit(0, 8, has) == 1
    assert p.longest_hit(3, 8, lambda c, g: c >= 3) == 8  # from chunk 3 the engine holds


def test_tokens_count_each_chunk_once() -> None:
    p = planner()
    needed = p.needed(6, 0)
    tokens = p.tokens_of(needed, 0, 6)
    assert sum(tokens) == 6 * CHUNK
    assert [t for t in tokens if t] == [CHUNK] * 6
    sliding_only = HybridPlanner(GEMMA[:1], CHUNK, 0)
    needed = sliding_only.needed(6, 0)
    assert needed == [(4, 0), (5, 0)]
    assert sliding_only.tokens_of(needed, 0, 6) == [5 * CHUNK, CHUNK]


@pytest.mark.parametrize("size", [16, 32])
def test_group_keys_keep_groups_apart_and_leave_one_group_engines_as_they_were(size: int) -> None:
    key = BlockKey(bytes(range(size)))
    assert group_key(key, 0, 1) == key
    keys = {group_key(key, g, 4) for g in range(4)}
    assert len(keys) == 4 and key not in keys
    assert [split_group_key(group_key(key, g, 4)) for g in range(4)] == [(key, g) for g in range(4)]
    with pytest.raises(ValueError, match="group 256"):
        group_key(key, 256, 300)


def test_an_engine_with_groups_kvstore_cannot_store_is_refused_naming_them() -> None:
    import torch
    from vllm.v1.kv_cache_interface import (
        ChunkedLocalAttentionSpec,
        FullAttentionSpec,
        KVCacheGroupSpec,
        SlidingWindowSpec,
    )

    from kvstore.errors import ConfigError
    from kvstore.vllm.geometry import _kv_groups

    shape: dict[str, Any] = {"num_kv_heads": 2, "head_size": 32, "dtype": torch.float32}
    full = KVCacheGroupSpec(["model.layers.1.attn"], FullAttentionSpec(block_size=32, **shape))
    sliding = KVCacheGroupSpec(
        ["model.layers.0.attn"], SlidingWindowSpec(block_size=32, sliding_window=64, **shape)
    )
    groups = _kv_groups([sliding, full])
    assert [(g.kind, g.window_tokens, g.layer_names) for g in groups] == [
        (SLIDING, 64, ("model.layers.0.attn",)),
        (FULL, 0, ("model.layers.1.attn",)),
    ]
    chunked = KVCacheGroupSpec(
        ["model.layers.2.attn"],
        ChunkedLocalAttentionSpec(block_size=32, attention_chunk_size=128, **shape),
    )
    with pytest.raises(ConfigError, match=r"group 1 \(model.layers.2.attn.*ChunkedLocalAttention"):
        _kv_groups([full, chunked])
    wide = KVCacheGroupSpec(
        ["model.layers.3.attn"],
        FullAttentionSpec(block_size=32, num_kv_heads=4, head_size=32, dtype=torch.float32),
    )
    with pytest.raises(ConfigError, match="same block size and bytes per block"):
        _kv_groups([sliding, wide])


def test_the_longest_hit_agrees_with_its_definition_on_random_placements() -> None:
    import random

    rng = random.Random(7)
    groups = (*GEMMA[:2], KVGroup(2, SLIDING, 130, ("l2",)), GEMMA[3])
    p = planner(groups=groups)
    for _ in range(300):
        start, stop = rng.randrange(0, 4), rng.randrange(4, 14)
        present = {(c, g) for c in range(stop) for g in range(4) if rng.random() < 0.8}

        def has(chunk: int, group: int, present: set[tuple[int, int]] = present) -> bool:
            return (chunk, group) in present

        served = [
            n for n in range(start + 1, stop + 1) if all(has(c, g) for c, g in p.needed(n, start))
        ]
        assert p.longest_hit(start, stop, has) == max(served, default=start)
