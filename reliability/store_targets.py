"""Fuzz targets over the records an LMDB store keeps about itself and its chunks.

Each example copies a small template store (two namespaces holding the SAME keys with different
values, as two models fed the same prompts would), writes hostile records into it through LMDB
itself (a damaged record that LMDB's own pages still hold, the way bit rot or a foreign writer
leaves it), then drives the store's read and write API and the CLI over the result. The oracle:
every call returns or raises a `TierError`/`KVStoreError`; the CLI keeps its exit-code promise;
and a chunk read back is always the exact bytes written under that namespace and key.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import shutil
import struct
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cache, partial
from pathlib import Path
from typing import Any, TypeVar

import lmdb
import msgspec
from hypothesis import strategies as st

from kvstore.errors import KVStoreError
from reliability.checks import WrongData, check_cli, run_cli
from reliability.fuzz import FuzzTarget
from tiers.errors import TierError
from tiers.layout import ChunkLayout, LayerLayout
from tiers.lmdb import LMDBStore

__all__ = ["NS_A", "NS_B", "STORE_TARGETS", "Mutation", "exercise_store", "hostile_copy"]

NS_A, NS_B = "a1a1a1a1a1a1a1a1", "b2b2b2b2b2b2b2b2"
KEYS = tuple(bytes([i]) * 16 for i in (0x11, 0x22, 0x33))
_LAYOUT = ChunkLayout(2, (LayerLayout("layer.0", "float16", (2,), (4, 8), 0),))
_CAPACITY_BYTES = 1 << 20
_MAP_BYTES = 8 << 20

_T = TypeVar("_T")
Mutation = tuple[bytes, bytes, bytes | None]
"""`(database, key, value)`: put `value` under `key` in the named database (None deletes)."""


@dataclass(frozen=True, slots=True)
class Template:
    path: Path
    values: dict[tuple[str, bytes], bytes]
    ordinals: dict[str, int]


@cache
def template() -> Template:
    """The template store, built once per process in a temporary directory (removed at exit,
    by the process that made it: a forked child inherits the handler, not the duty)."""
    base = Path(tempfile.mkdtemp(prefix="kvstore-fuzz-template-"))
    owner = os.getpid()

    def remove() -> None:
        if os.getpid() == owner:
            shutil.rmtree(base, ignore_errors=True)

    atexit.register(remove)
    path = base / "store"
    values: dict[tuple[str, bytes], bytes] = {}
    with LMDBStore.open(path, capacity_bytes=_CAPACITY_BYTES, map_size_bytes=_MAP_BYTES) as store:
        store.register_namespace(NS_A, {"model": "a", "chunk_layout": _LAYOUT.to_dict()})
        store.register_namespace(NS_B, {"model": "b", "tp_size": 1})
        for n, namespace in enumerate((NS_A, NS_B)):
            size = _LAYOUT.buffer_bytes
            items = [
                (key, bytes((n * 7 + i * 3 + j) % 251 for j in range(size)))
                for i, key in enumerate(KEYS)
            ]
            store.put_many(namespace, items, now_s=1_700_000_000.0)
            values.update({(namespace, key): value for key, value in items})
    return Template(path, values, {NS_A: 1, NS_B: 2})


@contextlib.contextmanager
def hostile_copy(mutations: Sequence[Mutation]) -> Iterator[Path]:
    """A private copy of the template store with `mutations` applied; removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="kvstore-fuzz-"))
    path = base / "store"
    try:
        shutil.copytree(template().path, path)
        env = lmdb.open(str(path), max_dbs=8, subdir=True, map_size=_MAP_BYTES)
        try:
            with env.begin(write=True) as txn:
                for name, key, value in mutations:
                    db = env.open_db(name, txn=txn)
                    if value is None:
                        txn.delete(key, db=db)
                    else:
                        txn.put(key, value, db=db)
        finally:
            env.close()
        yield path
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _tolerate(action: Callable[..., _T], *args: Any) -> _T | None:
    """Run one API call; the package's own errors are allowed outcomes (None)."""
    try:
        return action(*args)
    except (TierError, KVStoreError):
        return None


def _check_reads(store: LMDBStore) -> None:
    """Every template chunk reads back as exactly its bytes, or not at all."""
    for (namespace, key), value in template().values.items():
        out = bytearray(len(value) + 64)
        size = _tolerate(store.get_into, namespace, key, out)
        if size is not None and bytes(out[:size]) != value:
            raise WrongData(f"get_into({namespace}, {key.hex()[:8]}) returned other bytes")
        batch = bytearray(4096)
        got = _tolerate(store.get_many_into, namespace, [(key, batch)])
        if got is not None and isinstance(got[0], int) and bytes(batch[: got[0]]) != value:
            raise WrongData(f"get_many_into({namespace}, {key.hex()[:8]}) returned other bytes")


def _read_api(path: Path) -> None:
    store = _tolerate(partial(LMDBStore.open, path, readonly=True, create=False))
    if store is None:
        return
    with store:
        names = _tolerate(store.namespaces) or {}
        _tolerate(store.stats)
        for namespace in (*names, NS_A, NS_B):
            _tolerate(lambda ns: list(store.iter_meta(ns)), namespace)
            _tolerate(partial(store.find_keys, limit=4), namespace, "1")
        _check_reads(store)


def _write_api(path: Path) -> None:
    store = _tolerate(
        lambda: LMDBStore.open(path, capacity_bytes=_CAPACITY_BYTES, map_size_bytes=_MAP_BYTES)
    )
    if store is None:
        return
    with store:
        if _tolerate(lambda: store.register_namespace("c3c3", {"model": "c"})) is not None:
            pass
        if (keys := _tolerate(lambda: list(store.iter_keys("c3c3")))) and keys:
            raise WrongData(f"a new namespace already holds {len(keys)} keys of another one")
        _tolerate(lambda: store.put_many(NS_A, [(b"new-key", b"n" * 100)]))
        _tolerate(lambda: store.touch_many(NS_A, list(KEYS)))
        _tolerate(lambda: store.delete_many(NS_B, [KEYS[0]]))
        is_written = _tolerate(lambda: store.put_many(NS_B, [(KEYS[1], b"m" * 50)])) is not None
        _check_read_after_write(
            store, b"m" * 50 if is_written else template().values[NS_B, KEYS[1]]
        )


def _check_read_after_write(store: LMDBStore, expected: bytes) -> None:
    """The chunk rewritten after the damage reads back as the new bytes if the write was
    acknowledged, else as the old ones (or not at all)."""
    out = bytearray(512)
    size = _tolerate(lambda: store.get_into(NS_B, KEYS[1], out))
    if size is not None and bytes(out[:size]) != expected:
        raise WrongData("a chunk rewritten after the damage reads back as other bytes")


def _cli(path: Path) -> None:
    for command in (
        ("stat", "--json"),
        ("ls",),
        ("ls", "--verify", "--json"),
        ("show", "11", "--namespace", NS_A[:4], "--json"),
        ("show", "22"),
    ):
        check_cli(run_cli(command[0], path, *command[1:]), " ".join(command))
    repaired = run_cli("verify", path, "--repair")
    check_cli(repaired, "verify --repair")
    again = run_cli("verify", path, "--json")
    check_cli(again, "verify")
    if repaired.exit_code == 0 and again.exit_code != 0:
        raise WrongData("verify --repair succeeded yet a second verify finds corrupt chunks")


def exercise_store(mutations: Sequence[Mutation]) -> None:
    """Apply `mutations` to a copy of the template; read, write and inspect it."""
    with hostile_copy(mutations) as path:
        _read_api(path)
        _cli(path)
        _write_api(path)
        check_cli(run_cli("stat", path), "stat after writes")


# -- strategies ---------------------------------------------------------------------------------

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)
    | st.floats()
    | st.text(max_size=12)
    | st.binary(max_size=12)
)
msgpack_values = st.recursive(
    _scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)


def _packed(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


def _record_bytes(structured: st.SearchStrategy[Any]) -> st.SearchStrategy[bytes | None]:
    """Raw bytes, msgpack of anything, msgpack of a near-valid record, or a deleted record."""
    return st.one_of(
        st.binary(max_size=48),
        msgpack_values.map(_packed),
        structured.map(_packed),
        st.none(),
    )


_int64s = st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1)  # what msgpack can hold
_ordinals = st.sampled_from([0, 1, 2, 3, (1 << 32) - 1, 1 << 32, -1, True, "1", 1.0])
_namespace_records = st.fixed_dictionaries(
    {"ordinal": _ordinals | _int64s},
    optional={"descriptor": msgpack_values},
)
_full_keys = st.sampled_from([struct.pack(">I", o) + k for o in (1, 2) for k in KEYS])


def _meta_records() -> st.SearchStrategy[bytes]:
    packed = st.tuples(
        st.integers(0, (1 << 64) - 1),
        st.integers(0, (1 << 64) - 1),
        st.floats(width=64),
        st.floats(width=64),
        st.integers(0, (1 << 32) - 1),
    ).map(lambda fields: struct.pack("<QQddI", *fields))
    return packed | st.binary(max_size=48)


def _one(db: bytes, keys: st.SearchStrategy[bytes], values: st.SearchStrategy[Any]) -> Any:
    return st.tuples(st.just(db), keys, values)


_names = st.sampled_from([NS_A.encode(), NS_B.encode()]) | st.binary(min_size=1, max_size=12)
_MUTATIONS: dict[str, st.SearchStrategy[Mutation]] = {
    "format record": _one(
        b"store",
        st.just(b"format"),
        _record_bytes(st.fixed_dictionaries({"format_version": _ordinals | _int64s})),
    ),
    "capacity record": _one(b"store", st.just(b"capacity_bytes"), _record_bytes(_ordinals)),
    "next ordinal record": _one(
        b"store",
        st.just(b"next_ordinal"),
        st.binary(max_size=8) | st.integers(0, (1 << 32) - 1).map(struct.Struct(">I").pack),
    ),
    "namespace registration": _one(b"namespaces", _names, _record_bytes(_namespace_records)),
    "counts record": _one(
        b"counts",
        st.sampled_from([b"\0\0\0\1", b"\0\0\0\2"]) | st.binary(min_size=1, max_size=8),
        st.binary(max_size=24),
    ),
    "per-key meta record": _one(b"meta", _full_keys, _meta_records() | st.none()),
    "chunk value": _one(b"data", _full_keys, st.binary(max_size=300) | st.none()),
}


def _store_target(name: str, mutation: st.SearchStrategy[Mutation]) -> FuzzTarget:
    return FuzzTarget(
        name=f"store: {name}",
        description=f"a damaged {name} in an LMDB store, through the store API and the CLI",
        strategy=st.lists(mutation, min_size=1, max_size=3),
        exercise=exercise_store,
        allowed=(),
        max_examples=60,
    )


_ANY_RECORD = st.sampled_from([b"store", b"namespaces", b"counts", b"meta", b"data"]).flatmap(
    lambda db: _one(db, st.binary(min_size=1, max_size=24), st.binary(max_size=64))
)
STORE_TARGETS: tuple[FuzzTarget, ...] = (
    *(_store_target(name, mutation) for name, mutation in _MUTATIONS.items()),
    _store_target("any record", _ANY_RECORD),
)
"""One target per record kind, and one that puts random bytes under random keys anywhere."""
