"""Damaged records inside an LMDB store (scenario 4): a clear `TierError`, never a foreign
exception, never one namespace's bytes handed to another, and `verify --repair` still repairs.

Each test writes a hostile record with LMDB itself into a store `LMDBStore` made, the way bit
rot inside a value or a foreign writer would leave it.
"""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import lmdb
import msgspec
import pytest
from typer.testing import CliRunner, Result

from kvstore.cli import app
from tiers.errors import CorruptionError, NamespaceError, StoreDamagedError, TierConfigError
from tiers.lmdb import LMDBStore

# tiers/' LMDB records: nothing of vLLM (the layering test keeps it so)
pytestmark = pytest.mark.vllm_free

A, B = "a1a1a1a1", "b2b2b2b2"
KEYS = (b"\x11" * 16, b"\x22" * 16)


def make_store(path: Path) -> Path:
    """Two namespaces holding the same keys with different values (two models, one prompt)."""
    with LMDBStore.open(path, capacity_bytes=1 << 20, map_size_bytes=8 << 20) as store:
        store.register_namespace(A, {"model": "a"})
        store.register_namespace(B, {"model": "b"})
        store.put_many(A, [(key, b"A" * 300) for key in KEYS])
        store.put_many(B, [(key, b"B" * 200) for key in KEYS])
    return path


def poke(path: Path, db: bytes, key: bytes, value: bytes | None) -> None:
    env = lmdb.open(str(path), max_dbs=8, subdir=True, map_size=8 << 20)
    try:
        with env.begin(write=True) as txn:
            handle = env.open_db(db, txn=txn)
            if value is None:
                txn.delete(key, db=handle)
            else:
                txn.put(key, value, db=handle)
    finally:
        env.close()


def cli(*args: object) -> Result:
    return CliRunner().invoke(app, [str(arg) for arg in args])


def assert_one_line_error(result: Result, code: int, *fragments: str) -> None:
    assert result.exit_code == code, (result.stdout, result.stderr, result.exception)
    assert not isinstance(result.exception, Exception) or isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert "Traceback" not in result.stderr
    for fragment in fragments:
        assert fragment in lines[0]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    return make_store(tmp_path / "store")


def pack(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


# -- the format and capacity records ----------------------------------------------------------


@pytest.mark.parametrize(
    "raw", [b"\xc1", pack([1]), pack({"format_version": "x"}), pack({"v": 1})], ids=repr
)
def test_an_undecodable_format_record_is_a_damaged_store(store: Path, raw: bytes) -> None:
    poke(store, b"store", b"format", raw)
    for readonly in (True, False):
        with pytest.raises(StoreDamagedError, match="format record"):
            LMDBStore.open(store, capacity_bytes=1 << 20, readonly=readonly)
    assert_one_line_error(cli("stat", store), 1, "format record", "is damaged")


def test_a_store_of_a_newer_format_is_refused_saying_so(store: Path) -> None:
    poke(store, b"store", b"format", pack({"format_version": 2, "created_s": 0.0}))
    with pytest.raises(NamespaceError, match="format version 2, written by a newer kvstore"):
        LMDBStore.open(store, readonly=True)
    assert_one_line_error(cli("verify", store), 2, "newer kvstore", "upgrade kvstore")


@pytest.mark.parametrize("raw", [b"\xc1", pack("big"), pack(-5), pack(1.5)], ids=repr)
def test_an_undecodable_capacity_record_is_a_damaged_store(store: Path, raw: bytes) -> None:
    poke(store, b"store", b"capacity_bytes", raw)
    with pytest.raises(StoreDamagedError, match="capacity record"):
        LMDBStore.open(store, readonly=True)
    assert_one_line_error(cli("ls", store), 1, "capacity record")


# -- namespace registrations --------------------------------------------------------------------


@pytest.mark.parametrize(
    "raw",
    [
        b"\xc1",
        pack({"ordinal": "a", "descriptor": {}}),
        pack({"ordinal": 2}),
        pack({"ordinal": 1 << 40, "descriptor": {}}),
        pack({"ordinal": 2, "descriptor": [1]}),
        pack([2, {}]),
    ],
    ids=repr,
)
def test_a_damaged_registration_is_a_damaged_store(store: Path, raw: bytes) -> None:
    poke(store, b"namespaces", B.encode(), raw)
    with LMDBStore.open(store, readonly=True) as opened:
        with pytest.raises(StoreDamagedError, match=f"namespace '{B}'"):
            opened.namespaces()
        with pytest.raises(StoreDamagedError):
            opened.stats()
        with pytest.raises(StoreDamagedError):
            opened.get_into(B, KEYS[0], bytearray(512))
        out = bytearray(512)
        if raw in (pack({"ordinal": 2}), pack({"ordinal": 2, "descriptor": [1]})):
            # B still names its own ordinal: the other namespace reads
            assert opened.get_into(A, KEYS[0], out) == 300
            assert bytes(out[:300]) == b"A" * 300
        else:  # B's record may have owned A's ordinal, A's may be the one rewritten (the fuzz
            # found "A's record emptied, B's set to ordinal 1"): A is refused too
            with pytest.raises(StoreDamagedError, match="the ordinal it owns is unknown"):
                opened.get_into(A, KEYS[0], out)
    for command in ("stat", "ls", "verify"):
        assert_one_line_error(cli(command, store), 1, "is damaged")


def test_a_namespace_id_that_is_not_utf8_is_a_damaged_store(store: Path) -> None:
    poke(store, b"namespaces", b"\xff\xfe", pack({"ordinal": 9, "descriptor": {}}))
    with LMDBStore.open(store, readonly=True) as opened, pytest.raises(StoreDamagedError):
        opened.namespaces()
    assert_one_line_error(cli("stat", store), 1, "not UTF-8")


def test_two_registrations_claiming_one_ordinal_never_share_chunks(store: Path) -> None:
    """A flipped bit that gives B the ordinal of A must not hand A's chunks (checksums
    intact, the same keys) to B's engine."""
    poke(store, b"namespaces", B.encode(), pack({"ordinal": 1, "descriptor": {"model": "b"}}))
    with LMDBStore.open(store, readonly=True) as opened:
        for namespace in (A, B):
            with pytest.raises(StoreDamagedError, match="same ordinal"):
                opened.get_into(namespace, KEYS[0], bytearray(512))
        with pytest.raises(StoreDamagedError, match="share one ordinal"):
            opened.namespaces()


@pytest.mark.parametrize("a_record", [b"", None], ids=["emptied", "deleted"])
def test_a_registration_rewritten_to_a_lost_ones_ordinal_never_reads_its_chunks(
    store: Path, a_record: bytes | None
) -> None:
    """Hypothesis found it (CI, `store: namespace registration`): A's registration emptied or
    deleted and B's rewritten to A's ordinal handed A's chunks, checksums intact, to B."""
    poke(store, b"namespaces", A.encode(), a_record)
    poke(store, b"namespaces", B.encode(), pack({"ordinal": 1, "descriptor": {"model": "b"}}))
    with LMDBStore.open(store, readonly=True) as opened:
        with pytest.raises(StoreDamagedError):
            opened.get_into(B, KEYS[0], bytearray(512))
        with pytest.raises(StoreDamagedError):
            opened.get_many_into(B, [(KEYS[0], bytearray(512))])
    for command in ("ls", "verify"):
        assert_one_line_error(cli(command, store), 1, "is damaged")


def test_chunks_under_an_ordinal_no_registration_claims_are_damage(store: Path) -> None:
    poke(store, b"meta", struct.pack(">I", 7) + KEYS[0], b"\0" * 36)
    refused = pytest.raises(StoreDamagedError, match="ordinal 7, which no registration claims")
    with LMDBStore.open(store, readonly=True) as opened, refused:
        opened.get_into(A, KEYS[0], bytearray(512))


def test_a_healthy_store_with_many_namespaces_reads_every_one(tmp_path: Path) -> None:
    """No false damage: namespaces registered, emptied and deleted leave every other readable."""
    names = [f"n{i:02d}" for i in range(12)]
    with LMDBStore.open(tmp_path / "s", capacity_bytes=1 << 20, map_size_bytes=8 << 20) as opened:
        for name in names:
            opened.register_namespace(name, {"model": name})
            opened.put_many(name, [(KEYS[0], name.encode() * 10)])
        opened.delete_namespace(names[3])
        opened.delete_many(names[5], [KEYS[0]])
        opened.register_namespace("late", {"model": "late"})
        for name in names:
            out = bytearray(64)
            if name == names[3]:
                with pytest.raises(NamespaceError, match="not registered"):
                    opened.get_into(name, KEYS[0], out)
                continue
            size = opened.get_into(name, KEYS[0], out)
            expected = None if name == names[5] else name.encode() * 10
            assert (None if size is None else bytes(out[:size])) == expected
        assert opened.get_into("late", KEYS[0], bytearray(64)) is None


def test_a_damaged_next_ordinal_never_reuses_one_in_use(store: Path) -> None:
    for raw in (struct.pack(">I", 1), b"\x01", struct.pack(">I", (1 << 32) - 1)):
        poke(store, b"store", b"next_ordinal", raw)
        with LMDBStore.open(store, capacity_bytes=1 << 20, map_size_bytes=8 << 20) as opened:
            name = f"c{raw.hex()}"
            opened.register_namespace(name, {"model": "c"})
            assert list(opened.iter_keys(name)) == []
            assert opened.get_into(name, KEYS[0], bytearray(512)) is None


def test_a_descriptor_nested_too_deep_is_refused_and_never_read_back(store: Path) -> None:
    deep: Any = 1
    for _ in range(40):
        deep = [deep]
    with (
        LMDBStore.open(store, capacity_bytes=1 << 20) as opened,
        pytest.raises(TierConfigError, match="nests 41 levels"),
    ):
        opened.register_namespace("deep", {"x": deep})
    poke(store, b"namespaces", b"deep", pack({"ordinal": 7, "descriptor": {"x": deep}}))
    with LMDBStore.open(store, readonly=True) as opened, pytest.raises(StoreDamagedError):
        opened.namespaces()


# -- counts and per-key meta records --------------------------------------------------------------


@pytest.mark.parametrize("raw", [b"xx", b"", b"\x00" * 17], ids=repr)
def test_a_damaged_counts_record_is_recounted(store: Path, raw: bytes) -> None:
    poke(store, b"counts", struct.pack(">I", 2), raw)
    with LMDBStore.open(store, capacity_bytes=1 << 20) as opened:
        assert opened.stats().namespaces[B].used_bytes == 400
        opened.put_many(B, [(b"new", b"n" * 10)])
        assert opened.stats().namespaces[B].used_bytes == 410


def test_a_counts_record_claiming_more_than_the_file_holds_is_recounted(store: Path) -> None:
    """Else every write is refused as 'full' forever, and nothing (not even verify --repair)
    rewrites the record."""
    poke(store, b"counts", struct.pack(">I", 1), struct.pack("<QQ", 0, 1 << 56))
    with LMDBStore.open(store, capacity_bytes=1 << 20) as opened:
        opened.put_many(B, [(b"new", b"n" * 10)])
        assert opened.stats().namespaces[A].used_bytes == 600


def test_a_counts_record_under_a_bad_key_is_ignored(store: Path) -> None:
    poke(store, b"counts", b"\x01", b"0" * 16)
    with LMDBStore.open(store, capacity_bytes=1 << 20) as opened:
        assert opened.stats().used_bytes == 1000
        opened.put_many(A, [(b"new", b"n" * 10)])


def test_a_short_meta_record_is_corrupt_and_repairable(store: Path) -> None:
    poke(store, b"meta", struct.pack(">I", 1) + KEYS[0], b"short")
    with LMDBStore.open(store, readonly=True) as opened, pytest.raises(CorruptionError):
        opened.meta(A, KEYS[0])
    assert cli("verify", store, "--repair").exit_code == 0
    assert cli("verify", store).exit_code == 0
    with LMDBStore.open(store, readonly=True) as opened:
        assert opened.stats().namespaces[A].used_bytes == 300  # the damaged one freed its 300


def test_a_meta_record_claiming_a_huge_size_is_repairable(store: Path) -> None:
    """Deleting it must not wedge the counts (used bytes would go negative)."""
    record = struct.pack("<QQddI", 1 << 63, 0, float("nan"), float("inf"), 1)
    poke(store, b"meta", struct.pack(">I", 1) + KEYS[0], record)
    result = cli("verify", store, "--repair")
    assert result.exit_code == 0, result.stderr
    assert cli("verify", store).exit_code == 0
    with LMDBStore.open(store, capacity_bytes=1 << 20) as opened:
        opened.put_many(A, [(b"new", b"n" * 10)])
        assert opened.stats().namespaces[A].num_entries == 2


def test_ownership_checks_stay_quiet_while_namespaces_come_and_go(tmp_path: Path) -> None:
    """No false damage under concurrency: readers of two stable namespaces, while a writer
    thread registers namespaces, fills them and deletes them, never see StoreDamagedError
    and always read their own bytes (each read sees one committed snapshot)."""
    import threading

    with LMDBStore.open(tmp_path / "s", capacity_bytes=8 << 20, map_size_bytes=64 << 20) as opened:
        for name in (A, B):
            opened.register_namespace(name, {"model": name})
            opened.put_many(name, [(key, name.encode() * 20) for key in KEYS])
        stop = threading.Event()
        errors: list[BaseException] = []
        num_reads = [0]

        def read(name: str) -> None:
            try:
                while not stop.is_set():
                    for key in KEYS:
                        out = bytearray(256)
                        size = opened.get_into(name, key, out)
                        assert size is not None and bytes(out[:size]) == name.encode() * 20
                        got = opened.get_many_into(name, [(key, bytearray(256))])
                        assert got[0] == size
                    num_reads[0] += 1
            except BaseException as exc:  # reported below, on the test thread
                errors.append(exc)

        readers = [threading.Thread(target=read, args=(name,)) for name in (A, B)]
        for thread in readers:
            thread.start()
        try:
            for i in range(60):
                name = f"churn{i % 5}"
                opened.register_namespace(name, {"model": name})
                opened.put_many(name, [(KEYS[0], b"c" * 100)])
                if i % 2:
                    opened.delete_namespace(name)
        finally:
            stop.set()
            for thread in readers:
                thread.join()
    assert not errors, errors[0]
    assert num_reads[0] > 0
