"""Record formats and transaction helpers of `LMDBStore` (see `tiers.lmdb` for the layout)."""

from __future__ import annotations

import logging
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeGuard

import lmdb
import msgspec

from tiers._lmdb_env import SharedEnv
from tiers.errors import CorruptionError, NamespaceError, StoreDamagedError
from tiers.store import (
    MAX_DESCRIPTOR_DEPTH,
    META_BYTES,
    EntryMeta,
    check_namespace,
    checksum,
    nesting_depth,
)

__all__ = [
    "COUNTS",
    "FORMAT_VERSION",
    "MAX_ORDINAL",
    "MIN_ORDINAL",
    "ORDINAL",
    "NamespaceRecord",
    "add_counts",
    "all_namespaces",
    "check_format",
    "counts",
    "damaged",
    "decode_capacity",
    "decode_namespace",
    "format_version",
    "namespace_record",
    "next_free_ordinal",
    "ordinal",
    "parse_meta",
    "prefix",
    "recount",
    "scan",
    "stored_size",
    "total_used",
    "verify",
]

logger = logging.getLogger(__name__)

FORMAT_VERSION = 1
ORDINAL = struct.Struct(">I")
COUNTS = struct.Struct("<QQ")
MIN_ORDINAL, MAX_ORDINAL = 1, (1 << 32) - 1
SCAN_BATCH = 512


def check_format(shared: SharedEnv, capacity_bytes: int | None, *, readonly: bool) -> int:
    """Check (or, for a new store, write) the format record; returns the recorded capacity.

    A store of another format version raises NamespaceError (saying whether it is newer); a
    record that cannot be decoded raises StoreDamagedError."""
    store_db = shared.dbs[b"store"]
    with shared.read_txn() if readonly else shared.write_txn() as txn:
        raw = txn.get(b"format", db=store_db)
        if raw is None and not readonly:
            record = {"format_version": FORMAT_VERSION, "created_s": time.time()}
            txn.put(b"format", msgspec.msgpack.encode(record), db=store_db)
        elif raw is None:  # kvstore's databases exist (see _lmdb_env), its record does not
            raise damaged(
                shared.path, "format record", "it is missing (creation interrupted, or lost)"
            )
        else:
            _check_version(shared.path, format_version(shared.path, raw))
        if not readonly:
            txn.put(b"capacity_bytes", msgspec.msgpack.encode(capacity_bytes), db=store_db)
            return int(capacity_bytes or 0)
        recorded = txn.get(b"capacity_bytes", db=store_db)
        return 0 if recorded is None else decode_capacity(shared.path, recorded)


def _check_version(path: Path, version: int) -> None:
    if version > FORMAT_VERSION:
        raise NamespaceError(
            f"store {path} has format version {version}, written by a newer kvstore; this code "
            f"reads only version {FORMAT_VERSION}: upgrade kvstore to open it"
        )
    if version != FORMAT_VERSION:
        raise NamespaceError(
            f"store {path} has format version {version}; this code reads only version "
            f"{FORMAT_VERSION}"
        )


def _decode(path: Path, what: str, raw: bytes | memoryview) -> Any:
    """A msgpack record of the store; StoreDamagedError (naming `what`) if it is not one."""
    try:
        return msgspec.msgpack.decode(raw)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise damaged(path, what, f"not msgpack ({exc})") from exc


def damaged(path: Path, what: str, why: str) -> StoreDamagedError:
    return StoreDamagedError(
        f"the {what} of store {path} is damaged: {why}; inspect it with `kvstore verify {path}` "
        "or move the store aside"
    )


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def format_version(path: Path, raw: bytes | memoryview) -> int:
    """The version in a format record (`{"format_version": int, ...}`)."""
    record = _decode(path, "format record", raw)
    version = record.get("format_version") if isinstance(record, dict) else None
    if not _is_int(version) or version < 0:
        why = f"expected {{'format_version': int}}, got {record!r:.80}"
        raise damaged(path, "format record", why)
    return version


def decode_capacity(path: Path, raw: bytes | memoryview) -> int:
    capacity = _decode(path, "capacity record", raw)
    if capacity is None:
        return 0
    if not _is_int(capacity) or capacity < 0:
        why = f"expected a byte count >= 0, got {capacity!r:.80}"
        raise damaged(path, "capacity record", why)
    return capacity


@dataclass(frozen=True, slots=True)
class NamespaceRecord:
    """A namespace registration: its key prefix ordinal and its descriptor."""

    name: str
    ordinal: int
    descriptor: dict[str, Any]


def decode_namespace(path: Path, name: bytes, raw: bytes | memoryview) -> NamespaceRecord:
    """A registration record (`{"ordinal": u32 >= 1, "descriptor": map}`) under id `name`."""
    try:
        text = bytes(name).decode()
    except UnicodeDecodeError as exc:
        raise damaged(path, f"namespace id {bytes(name)[:40]!r}", "not UTF-8") from exc
    what = f"registration of namespace {text[:64]!r}"
    record = _decode(path, what, raw)
    if not isinstance(record, dict):
        raise damaged(path, what, f"expected a map, got {type(record).__name__}")
    ordinal, descriptor = record.get("ordinal"), record.get("descriptor")
    if not _is_int(ordinal) or not MIN_ORDINAL <= ordinal <= MAX_ORDINAL:
        raise damaged(path, what, f"ordinal {ordinal!r:.40} is not in {MIN_ORDINAL}..{MAX_ORDINAL}")
    if not isinstance(descriptor, dict):
        raise damaged(path, what, f"descriptor is a {type(descriptor).__name__}, not a map")
    if nesting_depth(descriptor) > MAX_DESCRIPTOR_DEPTH:
        raise damaged(path, what, f"descriptor nests deeper than {MAX_DESCRIPTOR_DEPTH} levels")
    return NamespaceRecord(text, ordinal, descriptor)


def namespace_record(
    txn: lmdb.Transaction[Any], shared: SharedEnv, namespace: str
) -> NamespaceRecord | None:
    """`namespace`'s registration, or None. Raises StoreDamagedError if it is damaged, or if
    which ordinal it owns cannot be trusted: another registration claims the same one, another
    registration is damaged (it may have owned this ordinal: "B damaged, A at ordinal 1" and
    "A's record lost its bytes, B's rewritten to ordinal 1" look the same), or chunks are stored
    under an ordinal no registration claims (a registration lost or rewritten). A flipped bit
    there would otherwise hand one namespace's chunks, checksums intact, to another: two models
    can share keys."""
    name = check_namespace(namespace)
    raw = txn.get(name, db=shared.dbs[b"namespaces"])
    if raw is None:
        return None
    record = decode_namespace(shared.path, name, raw)
    what = f"registration of namespace {namespace[:64]!r}"
    claimed = {record.ordinal}
    for key, value in txn.cursor(db=shared.dbs[b"namespaces"]):
        if bytes(key) == name:
            continue
        other = bytes(key).decode(errors="replace")[:64]
        other_ordinal = _claimed_ordinal(value)
        if other_ordinal is None:
            why = f"namespace {other!r}'s registration is damaged: the ordinal it owns is unknown"
            raise damaged(shared.path, what, why)
        if other_ordinal == record.ordinal:
            why = f"namespace {other!r} claims the same ordinal {record.ordinal}"
            raise damaged(shared.path, what, why)
        claimed.add(other_ordinal)
    unclaimed = _unclaimed_ordinal(txn, shared, claimed)
    if unclaimed is not None:
        why = f"chunks are stored under ordinal {unclaimed}, which no registration claims"
        raise damaged(shared.path, what, why)
    return record


def _claimed_ordinal(raw: bytes | memoryview) -> int | None:
    """The ordinal a registration record (its descriptor damaged or not) names; None when the
    record is too damaged to say."""
    try:
        record = msgspec.msgpack.decode(raw)
    except (msgspec.DecodeError, RecursionError):
        return None
    ordinal = record.get("ordinal") if isinstance(record, dict) else None
    if _is_int(ordinal) and MIN_ORDINAL <= ordinal <= MAX_ORDINAL:
        return ordinal
    return None


def _unclaimed_ordinal(
    txn: lmdb.Transaction[Any], shared: SharedEnv, claimed: set[int]
) -> int | None:
    """An ordinal that entries or counts are stored under but no registration claims (one seek
    per ordinal in use), or None. Keys too short to hold an ordinal are left to `verify`."""
    for name in (b"meta", b"data", b"counts"):
        cursor = txn.cursor(db=shared.dbs[name])
        found = cursor.first()
        while found:
            key = bytes(cursor.key())
            if len(key) < ORDINAL.size:
                found = cursor.next()
                continue
            (stored,) = ORDINAL.unpack_from(key)
            if stored not in claimed:
                return int(stored)
            if stored >= MAX_ORDINAL:
                break
            found = cursor.set_range(ORDINAL.pack(stored + 1))
    return None


def all_namespaces(txn: lmdb.Transaction[Any], shared: SharedEnv) -> list[NamespaceRecord]:
    """Every registration, in id order; StoreDamagedError for any that cannot be decoded, or
    for two that claim one ordinal."""
    cursor = txn.cursor(db=shared.dbs[b"namespaces"])
    records = [decode_namespace(shared.path, bytes(key), value) for key, value in cursor]
    by_ordinal: dict[int, str] = {}
    for record in records:
        other = by_ordinal.setdefault(record.ordinal, record.name)
        if other != record.name:
            names = f"namespaces {other[:64]!r} and {record.name[:64]!r}"
            raise damaged(shared.path, "namespace registrations", f"{names} share one ordinal")
    return records


def next_free_ordinal(txn: lmdb.Transaction[bytes], shared: SharedEnv) -> int:
    """The ordinal for a new namespace: the recorded next one, but never one in use (a damaged
    `next_ordinal` record must not make two namespaces share keys)."""
    raw = txn.get(b"next_ordinal", db=shared.dbs[b"store"])
    recorded = ORDINAL.unpack(raw)[0] if raw is not None and len(raw) == ORDINAL.size else 1
    in_use = [record.ordinal for record in all_namespaces(txn, shared)]
    candidate = max([recorded, MIN_ORDINAL, *(o + 1 for o in in_use)])
    while candidate <= MAX_ORDINAL and _has_keys(txn, shared, ORDINAL.pack(candidate)):
        candidate += 1  # keys left by a damaged registration stay unreachable
    if candidate > MAX_ORDINAL:
        raise damaged(shared.path, "namespace ordinals", f"none is left above {recorded}")
    return candidate


def _has_keys(txn: lmdb.Transaction[bytes], shared: SharedEnv, prefix: bytes) -> bool:
    for name in (b"meta", b"data", b"counts"):
        cursor = txn.cursor(db=shared.dbs[name])
        if cursor.set_range(prefix) and bytes(cursor.key()).startswith(prefix):
            return True
    return False


def ordinal(txn: lmdb.Transaction[Any], shared: SharedEnv, namespace: str) -> int:
    record = namespace_record(txn, shared, namespace)
    if record is None:
        raise NamespaceError(f"namespace {namespace!r} is not registered in {shared.path}")
    return record.ordinal


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


def counts(txn: lmdb.Transaction[Any], shared: SharedEnv) -> dict[int, tuple[int, int]]:
    """`ordinal -> (num_entries, used_bytes)` of every namespace with entries; a damaged counts
    record is recounted from the meta records (an O(n) scan of that namespace)."""
    found: dict[int, tuple[int, int]] = {}
    for key, value in txn.cursor(db=shared.dbs[b"counts"]):
        if len(key) != ORDINAL.size:
            logger.warning("ignoring a counts record under a bad key %r in %s", key, shared.path)
            continue
        found[ORDINAL.unpack(key)[0]] = _decode_counts(txn, shared, bytes(key), value)
    return found


def _decode_counts(
    txn: lmdb.Transaction[Any], shared: SharedEnv, prefix: bytes, raw: bytes | memoryview
) -> tuple[int, int]:
    why = _implausible(shared, raw)
    if not why:
        num_entries, used_bytes = COUNTS.unpack(raw)
        return int(num_entries), int(used_bytes)
    logger.warning(
        "counts record of ordinal %d in %s is damaged (%s); recounting it",
        ORDINAL.unpack(prefix)[0], shared.path, why,
    )  # fmt: skip
    return recount(txn, shared, prefix)


def _implausible(shared: SharedEnv, raw: bytes | memoryview) -> str:
    """Why a counts record cannot be right ("" if it can): its size, or more bytes used than
    the whole data file holds (which would refuse every write as 'full')."""
    if len(raw) != COUNTS.size:
        return f"{len(raw)} bytes"
    used_bytes = COUNTS.unpack(raw)[1]
    file_bytes = os.fstat(shared.data_fd).st_size if shared.data_fd >= 0 else used_bytes
    if used_bytes > file_bytes:
        return f"{used_bytes} bytes used in a {file_bytes}-byte data file"
    return ""


def recount(txn: lmdb.Transaction[Any], shared: SharedEnv, prefix: bytes) -> tuple[int, int]:
    """`(num_entries, used_bytes)` of the namespace with key prefix `prefix`, from its metas."""
    num_entries, used_bytes = 0, 0
    cursor = txn.cursor(db=shared.dbs[b"meta"])
    found = cursor.set_range(prefix)
    while found and bytes(cursor.key()).startswith(prefix):
        num_entries += 1
        used_bytes += stored_size(txn, shared, bytes(cursor.key()), cursor.value())
        found = cursor.next()
    return num_entries, used_bytes


def total_used(txn: lmdb.Transaction[bytes], shared: SharedEnv) -> int:
    return sum(used for _, used in counts(txn, shared).values())


def add_counts(
    txn: lmdb.Transaction[bytes],
    shared: SharedEnv,
    prefix: bytes,
    num_entries: int,
    size_bytes: int,
) -> None:
    """Add to a namespace's counts, after this transaction changed its entries. A damaged
    counts record is recounted instead; counts that would fall below zero (a meta record that
    lied about its size) are clamped and logged, so deleting damaged entries still works."""
    counts_db = shared.dbs[b"counts"]
    raw = txn.get(prefix, db=counts_db)
    if raw is not None and _implausible(shared, raw):  # recounted: includes this change
        txn.put(prefix, COUNTS.pack(*_decode_counts(txn, shared, prefix, raw)), db=counts_db)
        return
    entries, used = (0, 0) if raw is None else COUNTS.unpack(raw)
    new_entries, new_used = entries + num_entries, used + size_bytes
    if new_entries < 0 or new_used < 0 or max(new_entries, new_used) >= 1 << 64:
        logger.warning(
            "counts of ordinal %d in %s went out of range (%d entries, %d bytes); clamped",
            ORDINAL.unpack(prefix)[0], shared.path, new_entries, new_used,
        )  # fmt: skip
        new_entries = min(max(new_entries, 0), (1 << 64) - 1)
        new_used = min(max(new_used, 0), (1 << 64) - 1)
    txn.put(prefix, COUNTS.pack(new_entries, new_used), db=counts_db)


def meta_size(raw: bytes | memoryview) -> int:
    """The value size a meta record states (raises struct.error if it is too short)."""
    return int(struct.unpack_from("<Q", raw)[0])


def stored_size(
    txn: lmdb.Transaction[Any], shared: SharedEnv, full_key: bytes, raw_meta: bytes | memoryview
) -> int:
    """The size an entry counts for: its meta's, or, if that record is damaged, its value's."""
    if len(raw_meta) == META_BYTES:
        return meta_size(raw_meta)
    value = txn.get(full_key, db=shared.dbs[b"data"])
    return 0 if value is None else len(value)


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
