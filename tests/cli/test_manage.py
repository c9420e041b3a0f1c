"""`kvstore rm` and `kvstore gc`: what they delete, and when they refuse."""

from __future__ import annotations

import pytest

from tiers.lmdb import LMDBStore

from .helpers import BARE, BASE_S, CAPACITY_BYTES, TP1, TP2, BuiltStore, run, run_json, store_keys

# -- rm ---------------------------------------------------------------------------------------


def test_rm_keys_by_prefix(built: BuiltStore) -> None:
    first, second = built.keys[TP1][0], built.keys[TP2][3]
    doc = run_json("rm", built.path, first.hex()[:6], second.hex()[:8], "--yes")
    assert (doc["num_deleted"], doc["num_entries"]) == (2, 8)
    keys = store_keys(built.path)
    assert first not in keys[TP1]
    assert second not in keys[TP2]
    assert doc["used_bytes"] == built.used_bytes() - len(built.values[(TP1, first)]) - len(
        built.values[(TP2, second)]
    )


def test_rm_a_namespace_keeps_its_registration(built: BuiltStore) -> None:
    result = run("rm", built.path, "--namespace", TP2, "--yes")
    assert result.exit_code == 0, result.stderr
    assert "deleted 4 chunks; 6 left" in result.stdout
    keys = store_keys(built.path)
    assert keys[TP2] == set()
    assert len(keys[TP1]) == 4
    # `stat` still lists it (an engine may be writing to it): rm says so, and how to drop it
    assert f"namespace(s) {TP2} stay registered" in result.stderr
    assert "--unregister" in result.stderr


def test_rm_a_namespace_and_unregister_it(built: BuiltStore) -> None:
    doc = run_json("rm", built.path, "--namespace", BARE, "--unregister", "--yes")
    assert doc["num_deleted"] == 2
    assert BARE not in store_keys(built.path)


def test_rm_all(built: BuiltStore) -> None:
    doc = run_json("rm", built.path, "--all", "-y")
    assert (doc["num_deleted"], doc["num_entries"], doc["used_bytes"]) == (10, 0, 0)
    assert set(store_keys(built.path)) == {TP1, TP2, BARE}


def test_rm_refuses_without_yes_when_not_interactive(built: BuiltStore) -> None:
    result = run("rm", built.path, "--all")
    assert result.exit_code == 2
    assert "refusing to delete" in result.stderr
    assert "--yes" in result.stderr
    assert result.stdout == ""
    assert sum(len(keys) for keys in store_keys(built.path).values()) == 10


@pytest.mark.parametrize(("answer", "exit_code", "left"), [("y\n", 0, 9), ("n\n", 1, 10)])
def test_rm_asks_on_a_terminal(
    built: BuiltStore, monkeypatch: pytest.MonkeyPatch, answer: str, exit_code: int, left: int
) -> None:
    monkeypatch.setattr("kvstore.cli._common.is_interactive", lambda: True)
    result = run("rm", built.path, built.keys[BARE][0].hex()[:4], input=answer)
    assert result.exit_code == exit_code, result.stderr
    assert "Delete 1 chunk(s)" in result.stderr
    assert sum(len(keys) for keys in store_keys(built.path).values()) == left


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "say what to delete"),
        (("--all", "--namespace", TP1), "--all deletes everything"),
        (("00", "--unregister"), "--unregister goes with"),
    ],
)
def test_rm_usage_errors(built: BuiltStore, args: tuple[str, ...], message: str) -> None:
    result = run("rm", built.path, *args, "--yes")
    assert result.exit_code == 2
    assert message in result.stderr


# -- gc ---------------------------------------------------------------------------------------


def test_gc_evicts_the_least_recently_accessed_first(built: BuiltStore) -> None:
    # Make two of TP1's oldest chunks the most recently used.
    recent = [built.keys[TP1][0], built.keys[TP1][1]]
    with LMDBStore.open(built.path, capacity_bytes=CAPACITY_BYTES) as store:
        store.touch_many(TP1, recent, now_s=BASE_S + 1000)
    chunk_bytes = len(built.values[(TP1, recent[0])])
    limit = 3 * chunk_bytes
    doc = run_json("gc", built.path, "--max-bytes", str(limit), "--yes")
    assert doc["used_bytes_before"] == built.used_bytes()
    assert doc["used_bytes_after"] <= limit
    survivors = [(ns, k) for ns, keys in store_keys(built.path).items() for k in keys]
    # LRU order: TP1[2], TP1[3] (32 KiB each), TP2[0..3] (64 KiB each), BARE[0..1] (1 KiB each),
    # then the touched TP1[0], TP1[1]: evicting the first six frees enough.
    expected = [*((BARE, k) for k in built.keys[BARE]), *((TP1, k) for k in recent)]
    assert sorted(survivors) == sorted(expected)
    assert doc["num_evicted"] == 6


def test_gc_human_with_a_size_string(built: BuiltStore) -> None:
    result = run("gc", built.path, "--max-bytes", "200KiB", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "evicted" in result.stdout
    assert run_json("stat", built.path)["used_bytes"] <= 200 << 10


def test_gc_dry_run_deletes_nothing(built: BuiltStore) -> None:
    doc = run_json("gc", built.path, "--max-bytes", "0", "--dry-run")
    assert (doc["num_would_evict"], doc["num_evicted"]) == (10, 0)
    assert doc["would_evict_bytes"] == built.used_bytes()
    assert doc["used_bytes_after"] == built.used_bytes()
    assert sum(len(keys) for keys in store_keys(built.path).values()) == 10


def test_gc_under_the_limit_does_nothing_and_asks_nothing(built: BuiltStore) -> None:
    doc = run_json("gc", built.path, "--max-bytes", "1GiB")
    assert doc["num_evicted"] == 0


def test_gc_refuses_without_yes_when_not_interactive(built: BuiltStore) -> None:
    result = run("gc", built.path, "--max-bytes", "0")
    assert result.exit_code == 2
    assert "refusing to evict 10 chunks" in result.stderr


def _refill_after_each_pass(monkeypatch: pytest.MonkeyPatch, built: BuiltStore) -> None:
    """An engine writing between gc's passes: each pass is followed by a new chunk."""
    from kvstore.cli import manage

    real = manage.evict_lru
    written = iter(range(100, 200))

    def evict_then_write(store: LMDBStore, max_bytes: int, victims: list) -> tuple[int, bool]:  # type: ignore[type-arg]
        result = real(store, max_bytes, victims)
        key = (next(written)).to_bytes(32, "big")
        store.put_many(TP1, [(key, b"x" * (64 << 10))], now_s=BASE_S + 5000)
        return result

    monkeypatch.setattr(manage, "evict_lru", evict_then_write)


def test_gc_beside_a_writing_engine_succeeds_once_under_the_limit(
    built: BuiltStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    _refill_after_each_pass(monkeypatch, built)
    result = run("gc", built.path, "--max-bytes", "100KiB", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "an engine wrote while gc ran" in result.stderr


def test_gc_that_never_gets_under_the_limit_fails(
    built: BuiltStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    from kvstore.cli import manage

    monkeypatch.setattr(manage, "evict_lru", lambda store, max_bytes, victims: (0, False))
    result = run("gc", built.path, "--max-bytes", "100KiB", "--yes")
    assert result.exit_code == 1
    assert "still" in result.stderr and "bytes used" in result.stderr
