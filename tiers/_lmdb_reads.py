"""`LMDBStore`'s value reads: copy straight from the map into the caller's buffer, then verify.

The copy happens inside the read transaction (the map's bytes are only valid there), without
the GIL for large values (`tiers.store.copy_into`); each value's checksum is verified on the
caller's buffer right after its copy, while its bytes are still in the CPU's cache (verifying a
32 MiB batch after the copies read it all from memory again). A read transaction held while
hashing costs the writer nothing: LMDB readers never block it.
"""

from __future__ import annotations

from collections.abc import Sequence

from tiers import _lmdb_records
from tiers._lmdb_env import SharedEnv
from tiers.errors import CorruptionError, TierConfigError
from tiers.store import WritableBuffer, check_key, copy_into, writable_view

__all__ = ["read_into", "read_many_into"]


def read_into(shared: SharedEnv, namespace: str, key: bytes, out: WritableBuffer) -> int | None:
    """The value of `key` copied into `out` and verified: its size, or None if absent. A value
    larger than `out` is the caller's mistake (TierConfigError)."""
    target = writable_view(out)
    check_key(key)
    with shared.read_txn(buffers=True) as txn:
        full_key = _lmdb_records.prefix(txn, shared, namespace) + key
        value = txn.get(full_key, db=shared.dbs[b"data"])
        if value is None:
            return None
        raw = txn.get(full_key, db=shared.dbs[b"meta"])
        size = len(value)
        if size > target.nbytes:
            raise TierConfigError(f"out has {target.nbytes} bytes; the value has {size}")
        copy_into(target, value)
        raw_meta = None if raw is None else bytes(raw)
    _lmdb_records.verify(namespace, key, raw_meta, target[:size])
    return size


def read_many_into(
    shared: SharedEnv, namespace: str, items: Sequence[tuple[bytes, WritableBuffer]]
) -> list[int | CorruptionError | None]:
    """Each key's value copied into its buffer in one read transaction, then verified: per key
    its size, None if absent, or the CorruptionError (a value that does not fit its buffer is
    one bad key here: these buffers are rows sized for the values written into them)."""
    targets = [(check_key(key), writable_view(out)) for key, out in items]
    results: list[int | CorruptionError | None] = []
    with shared.read_txn(buffers=True) as txn:
        prefix = _lmdb_records.prefix(txn, shared, namespace)
        for key, target in targets:
            value = txn.get(prefix + key, db=shared.dbs[b"data"])
            if value is None:
                results.append(None)
                continue
            size = len(value)
            if size > target.nbytes:
                results.append(CorruptionError(
                    f"value of {size} bytes does not fit the {target.nbytes}-byte buffer",
                    namespace=namespace, key=key,
                ))  # fmt: skip
                continue
            copy_into(target, value)
            raw = txn.get(prefix + key, db=shared.dbs[b"meta"])
            results.append(_verified(namespace, key, target[:size], raw))
    return results


def _verified(
    namespace: str, key: bytes, value: memoryview, raw_meta: bytes | memoryview | None
) -> int | CorruptionError:
    try:
        _lmdb_records.verify(namespace, key, None if raw_meta is None else bytes(raw_meta), value)
    except CorruptionError as exc:
        return exc
    return value.nbytes
