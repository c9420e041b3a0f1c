"""`kvstore verify` and `kvstore rm` on the remote tier: damaged values found and deleted, chunks
deleted by key, namespace or all, in a real Redis (see `remote_helpers`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.remote import codec
from tests.support.redis_servers import RedisServer, redis_server

from .helpers import BARE, TP1, TP2, build_store, run, run_json
from .remote_helpers import ENGINE, Remote, chunk_keys_in, fill_remote, sync_client

pytestmark = pytest.mark.redis


@pytest.fixture
def server() -> Iterator[RedisServer]:
    with redis_server() as srv:
        yield srv


@pytest.fixture
def remote(server: RedisServer, tmp_path: Path) -> Remote:
    return fill_remote(server, build_store(tmp_path / "store"))


def redis_key(namespace: str, key: bytes) -> bytes:
    return codec.chunk_key(namespace, key)


def flip_payload_byte(server: RedisServer, namespace: str, key: bytes, offset: int = 100) -> None:
    """SETRANGE one byte of the payload (past the 40-byte header) to another value."""
    with server.client() as client:
        where = codec.HEADER.size + offset
        old = client.getrange(redis_key(namespace, key), where, where)
        client.setrange(redis_key(namespace, key), where, bytes([old[0] ^ 0x01]))


# -- verify -----------------------------------------------------------------------------------


def test_verify_a_clean_remote(remote: Remote) -> None:
    doc = run_json("verify", remote.url)
    assert doc["url"] == remote.url
    assert (doc["num_checked"], doc["num_ok"], doc["num_corrupt"]) == (13, 13, 0)
    human = run("verify", remote.url)
    assert human.exit_code == 0
    assert "checked 13 chunks: 13 ok, 0 corrupt" in human.stdout


def test_verify_finds_a_flipped_byte_and_repair_deletes_it(
    server: RedisServer, remote: Remote
) -> None:
    bad = remote.keys[TP2][1]
    flip_payload_byte(server, TP2, bad)

    doc = run_json("verify", remote.url, exit_code=1)
    assert (doc["num_ok"], doc["num_corrupt"], doc["num_corrupt_remaining"]) == (12, 1, 1)
    assert (doc["corrupt"][0]["namespace"], doc["corrupt"][0]["key"]) == (TP2, bad.hex())
    assert "xxh64" in doc["corrupt"][0]["error"]
    human = run("verify", remote.url)
    assert human.exit_code == 1
    assert bad.hex()[:16] in human.stdout
    assert "run with --repair" in human.stderr
    states = {
        c["key"]: c["checksum_state"] for c in run_json("ls", remote.url, "--verify")["chunks"]
    }
    assert states.pop(bad.hex()) == "corrupt"
    assert set(states.values()) == {"ok"}
    shown = run("show", remote.url, bad.hex()[:8])
    assert (shown.exit_code, "fails its checksum" in shown.stderr) == (1, True)
    assert chunk_keys_in(server) == {redis_key(ns, k) for ns, k in remote.values}  # untouched

    repaired = run_json("verify", remote.url, "--repair")
    assert (repaired["num_repaired"], repaired["num_corrupt_remaining"]) == (1, 0)
    assert chunk_keys_in(server) == {redis_key(ns, k) for ns, k in remote.values} - {
        redis_key(TP2, bad)
    }
    assert run("verify", remote.url).exit_code == 0


def test_verify_names_every_kind_of_damage(server: RedisServer, remote: Remote) -> None:
    truncated, moved, foreign, listed = [*remote.keys[TP1][:3], remote.keys[BARE][0]]
    with server.client() as client:
        value = client.get(redis_key(TP1, truncated))
        client.set(redis_key(TP1, truncated), value[: codec.HEADER.size + 10])
        client.set(redis_key(TP1, moved), client.get(redis_key(TP1, remote.keys[TP1][3])))
        client.set(redis_key(TP1, foreign), b"hello, not ours")
        client.delete(redis_key(BARE, listed))
        client.rpush(redis_key(BARE, listed), b"a list")
    doc = run_json("verify", remote.url, exit_code=1)
    errors = {bytes.fromhex(bad["key"]): bad["error"] for bad in doc["corrupt"]}
    assert "payload is 10 bytes, its header says" in errors[truncated]
    assert "value of another chunk" in errors[moved]
    assert "not a kvstore value" in errors[foreign]
    assert "WRONGTYPE" in errors[listed]
    repaired = run_json("verify", remote.url, "--repair")
    assert (repaired["num_repaired"], repaired["num_corrupt_remaining"]) == (4, 0)


def test_a_value_of_a_newer_format_is_counted_and_kept(server: RedisServer, remote: Remote) -> None:
    newer = remote.keys[ENGINE][0]
    with server.client() as client:
        client.setrange(redis_key(ENGINE, newer), 4, (2).to_bytes(2, "little"))
    doc = run_json("verify", remote.url, "--repair")
    assert (doc["num_newer_format"], doc["num_corrupt"], doc["num_repaired"]) == (1, 0, 0)
    assert redis_key(ENGINE, newer) in chunk_keys_in(server)
    assert "written by a newer kvstore" in " ".join(run("verify", remote.url).stdout.split())
    rows = run_json("ls", remote.url, "--verify", "--namespace", ENGINE)["chunks"]
    assert {r["key"]: r["checksum_state"] for r in rows}[newer.hex()] == "newer_format"


# -- rm ---------------------------------------------------------------------------------------


def test_rm_keys_by_prefix(server: RedisServer, remote: Remote) -> None:
    gone = [remote.keys[TP1][0], remote.keys[ENGINE][1]]
    doc = run_json("rm", remote.url, *(key.hex()[:10] for key in gone), "--yes")
    assert (doc["url"], doc["num_deleted"], doc["num_entries"]) == (remote.url, 2, 11)
    assert doc["used_bytes"] > 0
    expected = {redis_key(ns, k) for ns, k in remote.values} - {
        redis_key(TP1, gone[0]),
        redis_key(ENGINE, gone[1]),
    }
    assert chunk_keys_in(server) == expected


def test_rm_a_namespace_keeps_its_descriptor_unless_unregistered(
    server: RedisServer, remote: Remote
) -> None:
    assert run_json("rm", remote.url, "--namespace", TP2, "--yes")["num_deleted"] == 4
    assert (
        run_json("rm", remote.url, "--namespace", ENGINE[:5], "--unregister", "-y")["num_deleted"]
        == 3
    )
    with server.client() as client:
        assert client.exists(codec.descriptor_key(TP2)) == 1
        assert client.exists(codec.descriptor_key(ENGINE)) == 0
    left = {ns for ns, _ in (codec.split_key(k) or ("", None) for k in chunk_keys_in(server))}
    assert left == {TP1, BARE}
    names = [ns["namespace_id"] for ns in run_json("stat", remote.url)["namespaces"]]
    assert TP2 in names and ENGINE not in names


def test_rm_all_deletes_only_kvstore_chunks(server: RedisServer, remote: Remote) -> None:
    with server.client() as client:
        client.set(b"someone-else:key", b"keep me")
    result = run("rm", remote.url, "--all", "--yes")
    assert result.exit_code == 0, result.stderr
    assert "deleted 13 chunks; 0 left" in result.stdout
    assert chunk_keys_in(server) == set()
    with server.client() as client:
        assert client.get(b"someone-else:key") == b"keep me"
        assert client.exists(codec.descriptor_key(TP1)) == 1


def test_rm_refuses_without_yes_when_not_interactive(server: RedisServer, remote: Remote) -> None:
    result = run("rm", remote.url, "--all")
    assert result.exit_code == 2
    assert "refusing to delete" in result.stderr
    assert remote.url in result.stderr
    assert len(chunk_keys_in(server)) == 13


def test_gc_is_for_store_directories(remote: Remote) -> None:
    result = run("gc", remote.url, "--max-bytes", "1MiB", "--yes")
    assert result.exit_code == 2
    assert "Redis evicts by itself" in result.stderr


def test_rm_on_a_cluster(tmp_path: Path) -> None:
    from tests.support.redis_servers import redis_cluster

    with redis_cluster() as cluster:
        remote = fill_remote(cluster, build_store(tmp_path / "store"))
        doc = run_json("rm", cluster.url, "--namespace", TP1, "--yes")
        assert (doc["num_deleted"], doc["num_entries"]) == (4, remote.num_chunks() - 4)
        with sync_client(cluster) as client:
            assert not [k for k in client.scan_iter(match=f"kvstore:{TP1}:0*".encode())]
        assert run_json("rm", cluster.url, "--all", "--yes")["num_entries"] == 0
        assert chunk_keys_in(cluster) == set()
