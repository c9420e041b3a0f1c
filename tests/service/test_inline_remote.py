"""The in-memory remote tier (Redis with allkeys-lru) and the inline remote I/O of
`InlineTierService`: what each operation answers, touches and evicts."""

from __future__ import annotations

import pytest

from kvstore.keys import BlockKey
from kvstore.service import RemoteFetchDone, RemoteProbeDone, RemoteRemoved, RemoteWriteDone
from kvstore.service.inline import InlineTierService
from kvstore.service.inline_remote import SharedRemote

ROW = 4


class Rows:
    def __init__(self, num_rows: int) -> None:
        self.data = bytearray(num_rows * ROW)

    def row(self, index: int) -> memoryview:
        return memoryview(self.data)[index * ROW : (index + 1) * ROW]


def k(i: int) -> BlockKey:
    return BlockKey(bytes([i]) * 8)


def test_a_probe_does_not_touch_a_get_and_a_set_do_and_the_lru_goes_first() -> None:
    a, b, c, d = k(1), k(2), k(3), k(4)
    remote = SharedRemote(3)
    assert remote.set_many([(a, b"a"), (b, b"b"), (c, b"c")]) == []
    assert remote.exists([c, b, a, d]) == [True, True, True, False]  # not an access
    assert remote.set_many([(d, b"d")]) == [a]  # a was least recently used
    assert remote.get(a) is None
    assert remote.get(b) == b"b"  # an access: c is now the oldest
    assert remote.set_many([(a, b"A")]) == [c]
    assert remote.exists([a, b, c, d]) == [True, True, False, True]
    assert remote.set_many([(b, b"B")]) == []  # a rewrite takes no room
    assert remote.set_many([(c, b"c")]) == [d] and len(remote) == 3
    with pytest.raises(ValueError, match="at least one chunk, got 0"):
        SharedRemote(0)


def test_a_batch_past_capacity_evicts_once_written_oldest_first() -> None:
    remote = SharedRemote(2)
    assert remote.set_many([(k(i), bytes([i])) for i in range(1, 5)]) == [k(1), k(2)]
    assert remote.exists([k(1), k(2), k(3), k(4)]) == [False, False, True, True]


def make_service(remote: SharedRemote, rows: Rows) -> InlineTierService:
    return InlineTierService(None, remote=remote, remote_rows=rows)


def test_probe_fetch_and_write_answer_through_the_services_completions() -> None:
    shared = SharedRemote(2)
    rows_a, rows_b = Rows(4), Rows(4)
    writer, reader = make_service(shared, rows_a), make_service(shared, rows_b)
    assert writer.remote is not None and reader.remote is not None
    rows_a.row(0)[:] = b"AAAA"
    rows_a.row(1)[:] = b"BBBB"
    assert writer.remote.submit_write([(k(1), 0), (k(2), 1)])
    assert writer.drain_completions() == []  # queued until run
    assert writer.run_pending() == 1
    assert writer.drain_completions() == [RemoteWriteDone((k(1), k(2)))]

    reader.remote.submit_probe([k(1), k(3), k(2)], "r1")
    reader.run_pending()
    assert reader.drain_completions() == [
        RemoteProbeDone((k(1), k(3), k(2)), (True, False, True), "r1")
    ]
    reader.remote.submit_fetch([(k(2), 3), (k(3), 0)], "r1")
    reader.run_pending()
    (fetched,) = reader.drain_completions()
    assert isinstance(fetched, RemoteFetchDone) and fetched.duration_s >= 0
    assert (fetched.ok, fetched.failed, fetched.tag, fetched.num_bytes) == (
        (k(2),),
        (k(3),),
        "r1",
        4,
    )
    assert bytes(rows_b.row(3)) == b"BBBB"  # the bytes the other engine wrote

    rows_b.row(0)[:] = b"CCCC"
    assert reader.remote.submit_write([(k(3), 0)])
    reader.run_pending()
    # k1 was least recently used (the fetch of k2 was an access): removed, reported to its cause
    assert reader.drain_completions() == [RemoteWriteDone((k(3),)), RemoteRemoved((k(1),))]
    assert writer.drain_completions() == []


def test_a_value_of_another_size_is_not_fetched_into_a_row() -> None:
    shared = SharedRemote(2)
    shared.set_many([(k(1), b"too long for a row")])
    service = make_service(shared, Rows(1))
    assert service.remote is not None
    service.remote.submit_fetch([(k(1), 0)], None)
    service.run_pending()
    (fetched,) = service.drain_completions()
    assert isinstance(fetched, RemoteFetchDone)
    assert (fetched.ok, fetched.failed, fetched.num_bytes) == ((), (k(1),), 0)


def test_a_remote_tier_needs_rows() -> None:
    with pytest.raises(ValueError, match="remote_rows"):
        InlineTierService(None, remote=SharedRemote(1))
    assert InlineTierService(None).remote is None
