from __future__ import annotations

import json
import multiprocessing
import random
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from tiers_testlib import (
    LAYOUTS,
    cpu_backend,
    make_caches,
    reference_gather,
    scatter_in_child,
    zeros_like_caches,
)

from tiers.cpu import CPURegion
from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout
from tiers.paged import ChunkCopy, PagedKVView, find_block_dim

DTYPES = [torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.float8_e5m2]
NUM_BLOCKS = 11
NUM_LAYERS = 3


def _id_lists(seed: int) -> list[list[int]]:
    rng = random.Random(seed)
    return [
        [5],
        [2, 3, 4, 5],  # one consecutive run
        [9, 1, 4, 4, 0],  # unsorted with a repeat
        [rng.randrange(NUM_BLOCKS) for _ in range(7)],
        [7, 8, 9, 10, 0, 1, 2],  # two runs
    ]


def _assert_same_bytes(a: torch.Tensor, b: torch.Tensor) -> None:
    assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: str(d).removeprefix("torch."))
@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_gather_matches_reference_and_scatter_round_trips(layout: str, dtype: torch.dtype) -> None:
    caches = make_caches(layout, NUM_LAYERS, NUM_BLOCKS, dtype, seed=1)
    view = PagedKVView(caches, NUM_BLOCKS)
    for ids in _id_lists(seed=2):
        out = torch.empty(view.buffer_bytes(len(ids)), dtype=torch.uint8)
        assert view.gather(ids, out) == out.numel()
        _assert_same_bytes(out, reference_gather(caches, NUM_BLOCKS, ids))

        restored = zeros_like_caches(layout, NUM_LAYERS, NUM_BLOCKS, dtype)
        PagedKVView(restored, NUM_BLOCKS).scatter(ids, out)
        unique = sorted(set(ids))
        _assert_same_bytes(
            reference_gather(restored, NUM_BLOCKS, unique),
            reference_gather(caches, NUM_BLOCKS, unique),
        )
        untouched = [b for b in range(NUM_BLOCKS) if b not in unique]
        if untouched:
            assert not reference_gather(restored, NUM_BLOCKS, untouched).any()


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16])
def test_nan_and_inf_bit_patterns_survive(dtype: torch.dtype) -> None:
    caches = make_caches("cpu_backend", 2, NUM_BLOCKS, dtype, seed=3)
    patterns = torch.tensor([0x7F, 0xFF, 0x7C, 0xFC, 0x7E, 0x80], dtype=torch.uint8)
    first = next(iter(caches.values())).view(torch.uint8)
    first[4].flatten()[: patterns.numel()] = patterns
    view = PagedKVView(caches, NUM_BLOCKS)
    out = torch.empty(view.buffer_bytes(1), dtype=torch.uint8)
    view.gather([4], out)
    assert torch.equal(out[: patterns.numel()], patterns)
    restored = zeros_like_caches("cpu_backend", 2, NUM_BLOCKS, dtype)
    PagedKVView(restored, NUM_BLOCKS).scatter([4], out)
    _assert_same_bytes(next(iter(restored.values()))[4], first[4])


def test_shared_storage_layers_are_stacked_into_one_group() -> None:
    caches = cpu_backend(4, NUM_BLOCKS)
    storages = {t.untyped_storage().data_ptr() for t in caches.values()}
    assert len(storages) == 1
    assert PagedKVView(caches, NUM_BLOCKS).num_groups == 1
    assert (
        PagedKVView(make_caches("cross_layer", 4, NUM_BLOCKS, torch.bfloat16, 0), 11).num_groups
        == 1
    )
    assert PagedKVView(make_caches("kv_split", 4, NUM_BLOCKS, torch.float16, 0), 11).num_groups == 4


def test_repeated_block_ids_take_the_last_occurrence_on_scatter() -> None:
    caches = zeros_like_caches("kv_split", 2, NUM_BLOCKS, torch.float16)
    view = PagedKVView(caches, NUM_BLOCKS)
    src = torch.empty(view.buffer_bytes(3), dtype=torch.uint8)
    layout = view.chunk_layout(3)
    for name, tensor in layout.decode(src).items():
        for position in range(3):
            tensor.view(torch.uint8)[:, position] = position + 1
        assert name in caches
    view.scatter([6, 2, 6], src)
    for tensor in caches.values():
        assert torch.all(tensor.view(torch.uint8)[:, 6] == 3)
        assert torch.all(tensor.view(torch.uint8)[:, 2] == 2)


def test_first_block_copies_into_the_middle_of_a_chunk() -> None:
    caches = make_caches("cpu_backend", 2, NUM_BLOCKS, torch.bfloat16, seed=4)
    view = PagedKVView(caches, NUM_BLOCKS)
    full = torch.empty(view.buffer_bytes(4), dtype=torch.uint8)
    view.gather([3, 4, 5, 6], full)
    partial = torch.zeros_like(full)
    view.gather([5, 6], partial, first_block=2)
    whole = view.chunk_layout(4).decode(full)
    part = view.chunk_layout(4).decode(partial)
    for name in whole:
        _assert_same_bytes(part[name][2:], whole[name][2:])
        assert not part[name][:2].view(torch.uint8).any()
    restored = zeros_like_caches("cpu_backend", 2, NUM_BLOCKS, torch.bfloat16)
    PagedKVView(restored, NUM_BLOCKS).scatter([8, 9], full, first_block=2)
    for name in caches:
        _assert_same_bytes(restored[name][8:10], caches[name][5:7])


@settings(max_examples=40, deadline=None)
@given(ids=st.lists(st.integers(0, NUM_BLOCKS - 1), min_size=1, max_size=12))
def test_round_trip_for_any_block_id_list(ids: list[int]) -> None:
    caches = make_caches("cross_layer", 2, NUM_BLOCKS, torch.bfloat16, seed=5)
    view = PagedKVView(caches, NUM_BLOCKS)
    out = torch.empty(view.buffer_bytes(len(ids)), dtype=torch.uint8)
    view.gather(ids, out)
    _assert_same_bytes(out, reference_gather(caches, NUM_BLOCKS, ids))


def test_chunk_layout_is_json_safe_and_decodes_typed_tensors() -> None:
    caches = make_caches("kv_split", 2, NUM_BLOCKS, torch.float16, seed=6)
    view = PagedKVView(caches, NUM_BLOCKS)
    ids = [3, 1]
    out = torch.empty(view.buffer_bytes(2), dtype=torch.uint8)
    view.gather(ids, out)
    layout = ChunkLayout.from_dict(json.loads(json.dumps(view.chunk_layout(2).to_dict())))
    assert layout == view.chunk_layout(2)
    assert layout.buffer_bytes == out.numel()
    decoded = layout.decode(bytes(out.numpy()))
    for name, tensor in caches.items():
        assert decoded[name].dtype == torch.float16
        assert decoded[name].shape == (2, 2, 4, 2, 8)
        _assert_same_bytes(decoded[name], tensor[:, ids])
    assert layout.layers[0].num_parts == 2
    assert layout.layers[1].offset_bytes == layout.layers[0].section_bytes(2)


def test_chunk_layout_rejects_malformed_descriptions() -> None:
    good = PagedKVView(cpu_backend(1, NUM_BLOCKS), NUM_BLOCKS).chunk_layout(2).to_dict()
    with pytest.raises(TierConfigError, match="version"):
        ChunkLayout.from_dict({**good, "version": 99})
    with pytest.raises(TierConfigError, match="buffer_bytes"):
        ChunkLayout.from_dict({**good, "buffer_bytes": 1})
    with pytest.raises(TierConfigError, match="dtype"):
        ChunkLayout.from_dict({**good, "layers": [{**good["layers"][0], "dtype": "nope"}]})
    with pytest.raises(TierConfigError, match="malformed"):
        ChunkLayout.from_dict({"version": 1})


def test_block_dim_rule() -> None:
    assert find_block_dim((2, 2, 16, 8), 2) == 1  # K/V split first, then blocks
    assert find_block_dim((2, 7, 16, 8), 7) == 1
    assert find_block_dim((7, 2, 16, 8), 7) == 0
    assert find_block_dim((2, 5, 5), 5) == 1  # first match wins
    assert find_block_dim((2, 16), 2) == 0  # a lone size-2 dim is the block dim
    assert find_block_dim((3, 4), 5) == -1


def test_bad_layouts_and_arguments_are_rejected() -> None:
    with pytest.raises(TierConfigError, match="no block dim of size 9"):
        PagedKVView({"l": torch.zeros(4, 8)}, 9)
    with pytest.raises(TierConfigError, match="last-dim stride"):
        PagedKVView({"l": torch.zeros(8, 4, 6).transpose(1, 2)}, 8)
    with pytest.raises(TierConfigError, match="num_blocks"):
        PagedKVView({"l": torch.zeros(4, 8)}, 0)
    view = PagedKVView(cpu_backend(1, NUM_BLOCKS), NUM_BLOCKS)
    out = torch.empty(view.buffer_bytes(2), dtype=torch.uint8)
    with pytest.raises(TierConfigError, match="out of range"):
        view.gather([0, NUM_BLOCKS], out)
    with pytest.raises(TierConfigError, match="whole number of blocks"):
        view.gather([0], out[:-1])
    with pytest.raises(TierConfigError, match="do not fit"):
        view.gather([0, 1], out, first_block=1)
    with pytest.raises(TierConfigError, match="uint8"):
        view.gather([0], torch.empty(view.buffer_bytes(1) // 2, dtype=torch.int16))
    with pytest.raises(TierConfigError, match="empty"):
        view.gather([], out)


def test_gather_into_region_and_scatter_in_another_process(tmp_path: Path) -> None:
    """Real CPU-backend geometry (8 kv heads x 32 tokens x 2 x 128 bf16 = 128 KiB per layer
    block): gather into a shared row here, scatter in a spawned process that attaches."""
    num_layers, num_blocks = 8, 24
    ids = [17, 3, 4, 5, 11, 11, 0, 23]
    caches = cpu_backend(num_layers, num_blocks, heads=8, block_size=32, head=128)
    generator = torch.Generator().manual_seed(7)
    for tensor in caches.values():
        raw = tensor.view(torch.uint8)
        raw.copy_(torch.randint(0, 256, raw.shape, dtype=torch.uint8, generator=generator))
    view = PagedKVView(caches, num_blocks)
    size = view.buffer_bytes(len(ids))
    with CPURegion.create("paged-xproc", 2, size, directory=tmp_path) as region:
        view.gather(ids, region.row_tensor(0))
        context = multiprocessing.get_context("spawn")
        child = context.Process(
            target=scatter_in_child,
            args=(str(tmp_path), "paged-xproc", num_layers, num_blocks, ids),
        )
        child.start()
        child.join(timeout=120)
        assert child.exitcode == 0
        # The child wrote the bytes of its own caches' blocks, as it scattered them, to row 1.
        expected = reference_gather(caches, num_blocks, ids)
        assert torch.equal(region.row_tensor(1), expected)
        assert torch.equal(region.row_tensor(0), expected)


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_batched_gather_and_scatter_match_one_by_one(layout: str) -> None:
    """gather_many/scatter_many (one torch call for a whole job) == gather/scatter per chunk."""
    caches = make_caches(layout, NUM_LAYERS, NUM_BLOCKS, torch.bfloat16, seed=6)
    view = PagedKVView(caches, NUM_BLOCKS)
    chunks = [([3, 4], 0), ([9, 0], 0), ([7], 1)]  # the last fills positions 1.. of its chunk
    size = view.buffer_bytes(2)
    batched = [torch.zeros(size, dtype=torch.uint8) for _ in chunks]
    single = [torch.zeros(size, dtype=torch.uint8) for _ in chunks]
    items = [ChunkCopy(ids, buf, first) for (ids, first), buf in zip(chunks, batched, strict=True)]
    assert view.gather_many(items) == sum(view.buffer_bytes(len(ids)) for ids, _ in chunks)
    for (ids, first), buf in zip(chunks, single, strict=True):
        view.gather(ids, buf, first_block=first)
    for got, want in zip(batched, single, strict=True):
        _assert_same_bytes(got, want)
    restored = zeros_like_caches(layout, NUM_LAYERS, NUM_BLOCKS, torch.bfloat16)
    back = PagedKVView(restored, NUM_BLOCKS)
    back.scatter_many(items)
    for name in caches:
        for block in (3, 4, 9, 0, 7):
            _assert_same_bytes(
                restored[name].select(view_block_dim(caches[name]), block),
                caches[name].select(view_block_dim(caches[name]), block),
            )


def view_block_dim(tensor: torch.Tensor) -> int:
    return find_block_dim(tuple(tensor.shape), NUM_BLOCKS)
