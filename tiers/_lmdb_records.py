"""Record formats and transaction helpers of `LMDBStore` (see `tiers.lmdb` for the layout)."""

from __future__ import annotations

import struct
import time
from collections.abc import Iterator
from typing import Any

import lmdb
import msgspec

from tiers._lmdb_env import SharedEnv
from tiers.errors import CorruptionError, NamespaceError, TierConfigError
from tiers.store import EntryMeta, check_namespace, checksum

__all__ = [
    "COUNTS",
    "FORMAT_VERSION",
    "ORDINAL",
    "add_counts",
    "check_format",
    "meta_size",
    "ordinal",
    "parse_meta",
    "prefix",
    "scan",
    "total_used",
    "verify",
]

FORMAT_VERSION = 1
ORDINAL = struct.Struct(">I")
COUNTS = struct.Struct("<QQ")
SCAN_BATCH = 512


def check_format(shared: SharedEnv, capacity_bytes: int | None, *, readonly: bool) -> int:
    """Check (or, for a new store, write) the format record; returns the recorded capacity."""
    store_db = shared.dbs[b"store"]
    with shared.env.begin(write=not readonly) as txn:
        raw = txn.get(b"format", db=store_db)
        if raw is None and not readonly:
            record = {"format_version": FORMAT_VERSION, "created_s": time.time()}
            txn.put(b"format", msgspec.msgpack.encode(record), db=store_db)
        elif raw is None:
            raise TierConfigError(f"{shared.path} is not a kvstore store (no format record)")
        else:
            version = msgspec.msgpack.decode(raw).get("format_version")
            if version != FORMAT_VERSION:
                raise NamespaceError(
                    f"store {shared.path} has format version {version}; this code reads only "
                    f"version {FORMAT_VERSION}"
                )
        if not readonly:
            txn.put(b"capacity_bytes", msgspec.msgpack.encode(capacity_bytes), db=store_db)
            return int(capacity_bytes or 0)
        recorded = txn.get(b"capacity_bytes", db=store_db)
        return 0 if recorded is None else int(msgspec.msgpack.decode(recorded))


def ordinal(txn: lmdb.Transaction[Any], shared: SharedEnv, namespace: str) -> int:
    raw = txn.get(check_namespace(namespace), db=shared.dbs[b"namespaces"])
    if raw is None:
        raise NamespaceError(f"namespace {namespace!r} is not registered in {shared.path}")
    return int(msgspec.msgpack.decode(bytes(raw))["ordinal"])


def prefix(txn: lmdb.Transaction[Any], shared: SharedEnv, namespace: str) -> bytes:
    """The key prefix of `namespace`'s entries, read in `txn`."""
    return ORDINAL.pack(ordinal(txn, shared, namespace))


def scan(shared: SharedEnv, namespace: str, start: bytes) -> Iterator[tuple[bytes, bytes]]:
    """`(key, meta record)` pairs of `namespace` whose keys start with `start`, in key order,
    read in batches of short read transactions (a long scan never pins old pages)."""
    last: bytes | None = None
    while True:
        batch: list[tuple[bytes, bytes]] = []
        with shared.read_txn() as txn:
            ns_prefix = prefix(txn, shared, namespace)
            cursor = txn.cursor(db=shared.dbs[b"meta"])
            found = cursor.set_range(ns_prefix + (start if last is None else last))
            while found and len(batch) < SCAN_BATCH:
                full_key = bytes(cursor.key())
                if not full_key.startswith(ns_prefix + start):
                    break
                if full_key[len(ns_prefix) :] != last:
                    batch.append((full_key[len(ns_prefix) :], bytes(cursor.value())))
                found = cursor.next()
        yield from batch
        if len(batch) < SCAN_BATCH:
            return
        last = batch[-1][0]


def total_used(txn: lmdb.Transaction[bytes], shared: SharedEnv) -> int:
    return sum(COUNTS.unpack(value)[1] for _, value in txn.cursor(db=shared.dbs[b"counts"]))


def add_counts(
    txn: lmdb.Transaction[bytes],
    shared: SharedEnv,
    prefix: bytes,
    num_entries: int,
    size_bytes: int,
) -> None:
    counts_db = shared.dbs[b"counts"]
    raw = txn.get(prefix, db=counts_db)
    entries, used = (0, 0) if raw is None else COUNTS.unpack(raw)
    txn.put(prefix, COUNTS.pack(entries + num_entries, used + size_bytes), db=counts_db)


def meta_size(raw: bytes) -> int:
    return int(struct.unpack_from("<Q", raw)[0])


def parse_meta(namespace: str, key: bytes, raw: bytes | memoryview) -> EntryMeta:
    try:
        return EntryMeta.unpack(namespace, key, raw)
    except struct.error as exc:
        raise CorruptionError(
            f"meta record of key {key.hex()[:16]} in namespace {namespace!r} is damaged: {exc}",
            namespace=namespace,
            key=key,
        ) from exc


def verify(namespace: str, key: bytes, raw_meta: bytes | None, value: memoryview) -> None:
    if raw_meta is None:
        raise CorruptionError(
            f"key {key.hex()[:16]} in namespace {namespace!r} has data but no meta record",
            namespace=namespace,
            key=key,
        )
    entry = parse_meta(namespace, key, raw_meta)
    if entry.size_bytes != value.nbytes or checksum(value) != entry.checksum:
        raise CorruptionError(
            f"value of key {key.hex()[:16]} in namespace {namespace!r} fails its checksum "
            f"(size {value.nbytes}, recorded {entry.size_bytes})",
            namespace=namespace,
            key=key,
        )
