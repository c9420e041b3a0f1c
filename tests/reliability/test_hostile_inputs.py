"""Scenario 4, hostile inputs: every fuzz target of `reliability` under hypothesis.

The rule (`reliability.fuzz.check`): every input is accepted or refused with kvstore's own
error type; no other exception, no hang, never bytes other than those stored. Example counts
are the targets' own (moderate: ~60 per store target, 200 per parser); `CI=1` derandomizes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import lmdb
import msgspec
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from reliability.checks import Crash, WrongData
from reliability.damage import damage_bytes
from reliability.fuzz import FuzzTarget, check, fuzz_settings
from reliability.parser_targets import PARSER_TARGETS, lmdb_tier_options_target
from reliability.store_targets import KEYS, NS_A, NS_B, STORE_TARGETS, exercise_store, template

# tiers/' store records know nothing of vLLM (the layering test keeps it so)
TARGETS = (*(pytest.param(t, marks=pytest.mark.vllm_free) for t in STORE_TARGETS), *PARSER_TARGETS)


@pytest.mark.parametrize("target", TARGETS, ids=lambda t: t.name)
def test_fuzz_target_never_breaks_the_rule(target: FuzzTarget) -> None:
    @fuzz_settings(target.max_examples)
    @given(target.strategy)
    def feed(value: Any) -> None:
        check(target, value)

    feed()


def test_lmdb_tier_options_never_break_the_rule() -> None:
    pytest.importorskip("vllm")
    target = lmdb_tier_options_target()
    assert target is not None

    @fuzz_settings(target.max_examples)
    @given(target.strategy)
    def feed(value: Any) -> None:
        check(target, value)

    feed()


@pytest.mark.vllm_free  # tiers/' LMDB file and the CLI's store commands
@fuzz_settings(25)
@given(
    offset_fraction=st.floats(0.0, 1.0),
    length=st.integers(1, 20_000),
    cut=st.booleans(),
    seed=st.integers(0, 1000),
)
# found by this fuzz: random bytes over the main database's root page's nodes (SIGBUS); one byte
# of the meta page's format version (py-lmdb's "format vN is not supported": exit 2)
@example(offset_fraction=0.973425183741246, length=1600, cut=False, seed=92)
@example(offset_fraction=0.0001, length=1, cut=False, seed=0)
# one byte of a value's size in the data database's leaf node (a read of it ran past the end)
@example(offset_fraction=0.06952285013513905, length=1, cut=False, seed=0)
def test_damaged_data_file_bytes_never_crash_the_cli(
    offset_fraction: float, length: int, cut: bool, seed: int
) -> None:
    damage_bytes(offset_fraction, length, cut, seed)  # Crash on a traceback, signal or hang


# -- the oracles can fail for the right reason --------------------------------------------------


def test_the_store_oracle_catches_one_namespaces_bytes_served_to_another(monkeypatch: Any) -> None:
    """If the store did not refuse two registrations sharing an ordinal, the oracle would see
    namespace B read A's bytes: prove it by disabling the refusal (a registration is then
    decoded and trusted as it stands)."""
    from tiers import _lmdb_records

    def trusting(txn: Any, shared: Any, namespace: str) -> Any:
        raw = txn.get(namespace.encode(), db=shared.dbs[b"namespaces"])
        return None if raw is None else _lmdb_records.decode_namespace(
            shared.path, namespace.encode(), raw
        )

    monkeypatch.setattr(_lmdb_records, "namespace_record", trusting)
    swap = (b"namespaces", NS_B.encode(), msgspec.msgpack.encode({"ordinal": 1, "descriptor": {}}))
    with pytest.raises(WrongData):
        exercise_store([swap])


def test_the_store_oracle_catches_a_foreign_exception() -> None:
    target = STORE_TARGETS[0]
    broken = FuzzTarget(target.name, "", target.strategy, lambda v: json.loads("{"), ())
    with pytest.raises(Crash, match="JSONDecodeError"):
        check(broken, [])


def test_the_template_holds_the_same_keys_in_both_namespaces() -> None:
    values = template().values
    assert {key for ns, key in values if ns == NS_A} == {key for ns, key in values if ns == NS_B}
    assert set(KEYS) == {key for _, key in values}
    env = lmdb.open(str(template().path), max_dbs=8, subdir=True, readonly=True, lock=False)
    try:
        with env.begin() as txn:
            meta = env.open_db(b"meta", txn=txn, create=False)
            assert txn.get(struct.pack(">I", 2) + KEYS[0], db=meta) is not None
    finally:
        env.close()


def test_the_remote_value_target_catches_a_header_read_past_its_end(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The oracle can fail: a `read_header` without its length check raises struct.error on a
    short value, and the target calls that a crash."""
    from kvstore.remote import codec

    target = next(t for t in PARSER_TARGETS if t.name == "remote value header")

    def unchecked(value: bytes) -> object:
        return codec.HEADER.unpack_from(memoryview(value).cast("B"))

    monkeypatch.setattr(codec, "read_header", unchecked)
    with pytest.raises(Crash, match="remote value header: error: unpack_from"):
        check(target, (codec.MAGIC + b"\x01\x00", None))
