"""One contract suite, run against every `BlockStore` (LMDB in a tmp dir, and in memory)."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from tiers_testlib import CAPACITY_BYTES, StoreHarness

from tiers.errors import CorruptionError, NamespaceError, StoreFullError, TierConfigError
from tiers.store import BlockStore, checksum

DESCRIPTOR = {"model": "tiny-llama", "dtype": "bfloat16", "shapes": [[2, 4], [2, 4]]}


def _ready(harness: StoreHarness) -> BlockStore:
    harness.store.register_namespace("ns", DESCRIPTOR)
    return harness.store


def test_satisfies_protocol(harness: StoreHarness) -> None:
    assert isinstance(harness.store, BlockStore)
    assert harness.store.capacity_bytes == CAPACITY_BYTES


def test_register_is_idempotent_and_rejects_a_different_descriptor(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.register_namespace("ns", {**DESCRIPTOR, "shapes": ((2, 4), (2, 4))})  # same after msgpack
    assert store.namespaces() == {"ns": DESCRIPTOR}
    with pytest.raises(NamespaceError, match="different descriptor"):
        store.register_namespace("ns", {**DESCRIPTOR, "dtype": "float16"})
    with pytest.raises(TierConfigError, match="msgpack"):
        store.register_namespace("other", {"bad": object()})
    with pytest.raises(TierConfigError, match="non-empty"):
        store.register_namespace("", DESCRIPTOR)


def test_unknown_namespace_is_an_error(harness: StoreHarness) -> None:
    store = _ready(harness)
    with pytest.raises(NamespaceError, match="nope"):
        store.put_many("nope", [(b"k", b"v")])
    with pytest.raises(NamespaceError):
        store.get_into("nope", b"k", bytearray(4))
    with pytest.raises(NamespaceError):
        list(store.iter_meta("nope"))


@pytest.mark.parametrize("out_kind", ["bytearray", "memoryview", "tensor", "ndarray"])
def test_put_and_get_into_round_trip(harness: StoreHarness, out_kind: str) -> None:
    store = _ready(harness)
    values = {f"key{i}".encode(): os.urandom(1000 + i) for i in range(5)}
    written = store.put_many("ns", list(values.items()), now_s=100.0)
    assert written == sum(len(v) for v in values.values())
    for key, value in values.items():
        backing = bytearray(2000)
        out: object = {
            "bytearray": backing,
            "memoryview": memoryview(backing),
            "tensor": torch.frombuffer(backing, dtype=torch.uint8),
            "ndarray": np.frombuffer(backing, dtype=np.uint8),
        }[out_kind]
        assert store.get_into("ns", key, out) == len(value)  # type: ignore[arg-type]
        assert bytes(backing[: len(value)]) == value
        entry = store.meta("ns", key)
        assert entry is not None
        assert (entry.size_bytes, entry.checksum) == (len(value), checksum(value))
        assert (entry.created_s, entry.last_access_s, entry.num_hits) == (100.0, 100.0, 0)
    assert store.get_into("ns", b"absent", bytearray(10)) is None
    with pytest.raises(TierConfigError, match="read-only"):
        store.get_into("ns", b"key0", b"\0" * 2000)  # type: ignore[arg-type]
    with pytest.raises(TierConfigError, match="out has 10 bytes"):
        store.get_into("ns", b"key0", bytearray(10))


def test_values_from_memoryviews_of_tensors(harness: StoreHarness) -> None:
    store = _ready(harness)
    row = torch.arange(4096, dtype=torch.int32).view(torch.uint8)
    store.put_many("ns", [(b"row", memoryview(row.numpy()))])
    out = torch.zeros_like(row)
    assert store.get_into("ns", b"row", out) == row.numel()
    assert torch.equal(out, row)


def test_overwrite_and_duplicates_keep_accounting_right(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.put_many("ns", [(b"a", b"x" * 100), (b"b", b"y" * 50)])
    store.put_many("ns", [(b"a", b"z" * 30), (b"c", b"1" * 10), (b"c", b"2" * 20)])
    stats = store.stats()
    assert (stats.num_entries, stats.used_bytes) == (3, 30 + 50 + 20)
    assert stats.namespaces["ns"].num_entries == 3
    out = bytearray(100)
    assert store.get_into("ns", b"c", out) == 20 and bytes(out[:20]) == b"2" * 20
    assert store.get_into("ns", b"a", out) == 30 and bytes(out[:30]) == b"z" * 30


def test_touch_updates_meta_and_reads_do_not(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.put_many("ns", [(b"a", b"x" * 10)], now_s=1.0)
    store.get_into("ns", b"a", bytearray(10))
    entry = store.meta("ns", b"a")
    assert entry is not None and entry.num_hits == 0 and entry.last_access_s == 1.0
    store.touch_many("ns", [b"a", b"missing", b"a"], now_s=5.0)
    entry = store.meta("ns", b"a")
    assert entry is not None
    assert (entry.created_s, entry.last_access_s, entry.num_hits) == (1.0, 5.0, 2)


def test_delete_many_and_delete_namespace(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.register_namespace("other", {"x": 1})
    store.put_many("ns", [(bytes([i]), b"v" * 10) for i in range(1, 6)])
    store.put_many("other", [(b"\x01", b"w" * 7)])
    assert store.delete_many("ns", [b"\x01", b"\x02", b"\x02", b"\x09"]) == 2
    assert not store.contains("ns", b"\x01") and store.contains("ns", b"\x03")
    assert store.stats().namespaces["ns"].used_bytes == 30
    assert store.delete_namespace("ns") == 3
    assert set(store.namespaces()) == {"other"}
    stats = store.stats()
    assert (stats.num_entries, stats.used_bytes) == (1, 7)
    assert store.contains("other", b"\x01")
    store.register_namespace("ns", DESCRIPTOR)  # a fresh namespace under the old id is empty
    assert list(store.iter_keys("ns")) == []


def test_scans_and_find_keys(harness: StoreHarness) -> None:
    store = _ready(harness)
    keys = [bytes([0xAB, i % 7]) + i.to_bytes(2, "big") for i in range(600)] + [b"\xcd\x00"]
    store.put_many("ns", [(key, b"v") for key in keys])
    assert list(store.iter_keys("ns")) == sorted(keys)
    metas = list(store.iter_meta("ns"))
    assert [m.key for m in metas] == sorted(keys)
    assert all(m.namespace == "ns" and m.size_bytes == 1 for m in metas)
    assert store.find_keys("ns", "cd") == [b"\xcd\x00"]
    assert store.find_keys("ns", "ab03") == sorted(k for k in keys if k[:2] == b"\xab\x03")
    assert store.find_keys("ns", "AB0") == sorted(k for k in keys if k[0] == 0xAB)
    assert len(store.find_keys("ns", "a", limit=5)) == 5
    assert store.find_keys("ns", "ff") == []
    with pytest.raises(TierConfigError, match="hexadecimal"):
        store.find_keys("ns", "xyz")


def test_corruption_is_detected_never_returned(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.put_many("ns", [(b"good", b"g" * 64), (b"bad", b"b" * 64)])
    harness.corrupt("ns", b"bad")
    store = harness.store
    with pytest.raises(CorruptionError) as caught:
        store.get_into("ns", b"bad", bytearray(64))
    assert (caught.value.namespace, caught.value.key) == ("ns", b"bad")
    out = bytearray(64)
    assert store.get_into("ns", b"good", out) == 64 and bytes(out) == b"g" * 64
    assert store.delete_many("ns", [b"bad"]) == 1  # the caller's recovery: delete it


def test_get_many_into_reports_per_key(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.put_many("ns", [(b"good", b"g" * 64), (b"bad", b"b" * 64), (b"more", b"m" * 32)])
    harness.corrupt("ns", b"bad")
    store = harness.store
    outs = [bytearray(64) for _ in range(4)]
    keys = [b"good", b"bad", b"gone", b"more"]
    results = store.get_many_into("ns", list(zip(keys, outs, strict=True)))
    assert results[0] == 64 and bytes(outs[0]) == b"g" * 64
    assert isinstance(results[1], CorruptionError) and results[1].key == b"bad"
    assert results[2] is None
    assert results[3] == 32 and bytes(outs[3][:32]) == b"m" * 32


def test_large_values_read_into_every_buffer_kind_and_corruption_is_still_caught(
    harness: StoreHarness,
) -> None:
    """Values from 64 KiB on are copied without the GIL (`tiers.store.copy_into`): the bytes
    land exactly, in a buffer larger than the value too, and a flipped byte is still caught."""
    store = _ready(harness)
    sizes = {b"row": 512 << 10, b"odd": (64 << 10) + 3, b"bad": 256 << 10}
    values = {key: os.urandom(size) for key, size in sizes.items()}
    store.put_many("ns", list(values.items()))
    harness.corrupt("ns", b"bad")
    store = harness.store
    outs = [
        torch.zeros(512 << 10, dtype=torch.uint8),
        np.zeros((128 << 10) + 7, dtype=np.uint8),
        bytearray(256 << 10),
    ]
    keys = [b"row", b"odd", b"bad"]
    results = store.get_many_into("ns", list(zip(keys, outs, strict=True)))
    assert results[0] == 512 << 10 and bytes(outs[0].numpy()) == values[b"row"]
    odd = values[b"odd"]
    assert results[1] == len(odd) and bytes(outs[1][: len(odd)]) == odd
    assert not outs[1][len(odd) :].any()  # nothing past the value is touched
    assert isinstance(results[2], CorruptionError) and results[2].key == b"bad"
    out = bytearray(512 << 10)
    assert store.get_into("ns", b"row", out) == 512 << 10 and bytes(out) == values[b"row"]


def test_full_store_refuses_puts_and_writes_nothing(harness: StoreHarness) -> None:
    store = _ready(harness)
    store.put_many("ns", [(b"a", b"x" * (CAPACITY_BYTES - 100))])
    before = store.stats()
    with pytest.raises(StoreFullError) as caught:
        store.put_many("ns", [(b"b", b"y" * 60), (b"c", b"z" * 60)])
    assert (caught.value.requested_bytes, caught.value.free_bytes) == (120, 100)
    assert store.stats() == before
    assert not store.contains("ns", b"b") and not store.contains("ns", b"c")
    store.put_many("ns", [(b"b", b"y" * 60)])  # still usable
    store.put_many("ns", [(b"a", b"x" * 10), (b"c", b"z" * 60)])  # an overwrite frees room
    assert store.stats().used_bytes == 130
    assert store.stats().free_bytes == CAPACITY_BYTES - 130


def test_bad_keys_are_rejected(harness: StoreHarness) -> None:
    store = _ready(harness)
    with pytest.raises(TierConfigError, match="bytes"):
        store.put_many("ns", [(b"", b"v")])
    with pytest.raises(TierConfigError, match="bytes"):
        store.put_many("ns", [(b"k" * 401, b"v")])
    with pytest.raises(TierConfigError):
        store.contains("ns", "text")  # type: ignore[arg-type]
