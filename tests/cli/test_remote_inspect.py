"""`kvstore stat`, `ls` and `show` on the remote tier: a real Redis server and a real Redis Cluster
holding the CLI test chunks (see `remote_helpers`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import xxhash

from kvstore.cli._source import is_remote_target
from kvstore.remote import codec
from tests.support.redis_servers import (
    RedisClusterServers,
    RedisServer,
    redis_cluster,
    redis_server,
)

from .helpers import BARE, BARE_VALUE_BYTES, NAMESPACES, TP1, TP2, build_store, run, run_json
from .remote_helpers import ENGINE, NUM_ENGINE_CHUNKS, Remote, fill_remote, sync_client

pytestmark = pytest.mark.redis

ALL_NAMESPACES = sorted([*NAMESPACES, ENGINE])


@pytest.fixture(scope="module")
def server() -> Iterator[RedisServer]:
    with redis_server(maxmemory="256mb", maxmemory_policy="allkeys-lru") as srv:
        yield srv


@pytest.fixture(scope="module")
def remote(server: RedisServer, tmp_path_factory: pytest.TempPathFactory) -> Remote:
    """Filled once; the tests of this module only read."""
    return fill_remote(server, build_store(tmp_path_factory.mktemp("cli") / "store"))


# -- stat -------------------------------------------------------------------------------------


def test_stat_json_counts_chunks_and_memory_per_namespace(remote: Remote) -> None:
    doc = run_json("stat", remote.url)
    assert doc["url"] == remote.url
    assert "path" not in doc
    assert (doc["backend"], doc["is_cluster"], len(doc["masters"])) == ("redis", False, 1)
    assert doc["num_entries"] == remote.num_chunks() == 13
    assert (doc["maxmemory_bytes"], doc["maxmemory_policy"]) == (256 << 20, "allkeys-lru")
    assert doc["server_used_memory_bytes"] > doc["used_bytes"]
    assert doc["num_evicted_keys"] == 0
    by_id = {ns["namespace_id"]: ns for ns in doc["namespaces"]}
    assert list(by_id) == ALL_NAMESPACES
    for namespace, keys in remote.keys.items():
        payload = sum(len(remote.values[namespace, key]) for key in keys)
        counted = by_id[namespace]
        assert counted["num_entries"] == len(keys)
        # MEMORY USAGE: the payload, the 40-byte header and Redis's own overhead.
        assert payload + 40 * len(keys) < counted["used_bytes"] < 2 * payload + 4096
    assert by_id[TP1]["layout_summary"] == "2 layers x [2, 32, 64] bfloat16"
    assert (by_id[TP2]["tp_size"], by_id[TP2]["has_chunk_layout"]) == (2, True)
    engine = by_id[ENGINE]
    assert (engine["model"], engine["created_by"], engine["has_descriptor"]) == (
        "tiny-llama",
        "engine",
        True,
    )
    assert engine["has_chunk_layout"] is False
    assert engine["newest_access_s"] is not None


def test_stat_human_names_the_url_memory_and_namespaces(remote: Remote) -> None:
    result = run("stat", remote.url)
    assert result.exit_code == 0, result.stderr
    for text in (
        remote.url,
        "entries",
        "13",
        "256.0 MiB",
        "allkeys-lru",
        "standalone",
        *NAMESPACES,
    ):
        assert text in result.stdout
    assert result.stderr == ""


def test_a_namespace_whose_descriptor_is_gone_still_shows(remote: Remote, tmp_path: Path) -> None:
    with redis_server() as other:
        fill_remote(other, build_store(tmp_path / "store"))
        with sync_client(other) as client:
            assert client.delete(codec.descriptor_key(TP1)) == 1
        doc = run_json("stat", other.url)
        tp1 = next(ns for ns in doc["namespaces"] if ns["namespace_id"] == TP1)
        assert (tp1["has_descriptor"], tp1["num_entries"], tp1["model"]) == (False, 4, None)
        assert "none (evicted, or not written yet)" in run("stat", other.url).stdout


# -- ls ---------------------------------------------------------------------------------------


def test_ls_json_lists_every_chunk_without_reading_values(remote: Remote) -> None:
    doc = run_json("ls", remote.url)
    assert doc["num_chunks"] == len(doc["chunks"]) == 13
    assert {(c["namespace"], c["key"]) for c in doc["chunks"]} == {
        (ns, key.hex()) for ns, key in remote.values
    }
    for chunk in doc["chunks"]:
        # Known only once a value is read; Redis counts no hits and keeps no creation time.
        assert chunk["size_bytes"] is chunk["checksum_xxh64"] is chunk["num_hits"] is None
        assert chunk["created_s"] is None
        assert chunk["memory_bytes"] > 0
        assert chunk["last_access_s"] is not None
        assert chunk["checksum_state"] == "unverified"


def test_ls_verify_reads_each_payloads_size_and_checksum(remote: Remote) -> None:
    doc = run_json("ls", remote.url, "--verify", "--namespace", "b0b0")
    assert doc["num_chunks"] == 2
    for chunk in doc["chunks"]:
        value = remote.values[BARE, bytes.fromhex(chunk["key"])]
        assert chunk["size_bytes"] == BARE_VALUE_BYTES == len(value)
        assert chunk["checksum_xxh64"] == f"{xxhash.xxh64_intdigest(value):016x}"
        assert chunk["checksum_state"] == "ok"


@pytest.mark.parametrize(("sort", "descending"), [("size", True), ("key", False)])
def test_ls_sorts_and_limits(remote: Remote, sort: str, descending: bool) -> None:
    def order(chunk: dict[str, object]) -> object:
        if sort == "size":
            return chunk["memory_bytes"]
        return chunk["namespace"], chunk["key"]

    values = [order(chunk) for chunk in run_json("ls", remote.url, "--sort", sort)["chunks"]]
    assert values == sorted(values, reverse=descending)  # type: ignore[type-var]
    limited = run_json("ls", remote.url, "--sort", sort, "--limit", "3")["chunks"]
    assert [order(c) for c in limited] == values[:3]


def test_ls_human_has_short_keys_and_a_count(remote: Remote) -> None:
    result = run("ls", remote.url, "--namespace", ENGINE[:6])
    assert result.exit_code == 0, result.stderr
    assert f"{NUM_ENGINE_CHUNKS} of {NUM_ENGINE_CHUNKS} chunks" in result.stdout
    assert remote.keys[ENGINE][0].hex()[:16] in result.stdout


# -- show -------------------------------------------------------------------------------------


@pytest.mark.parametrize("namespace", [TP1, TP2])
def test_show_decodes_as_the_same_chunk_in_a_store_does(
    remote: Remote, namespace: str, tmp_path: Path
) -> None:
    key = remote.keys[namespace][1]
    shown = run_json("show", remote.url, key.hex()[:10])
    assert shown["chunk"]["checksum_state"] == "ok"
    assert shown["chunk"]["size_bytes"] == len(remote.values[namespace, key])
    assert shown["decode_skipped_reason"] is None
    assert shown["layers"]
    local = run_json("show", build_store(tmp_path / "store").path, key.hex()[:10])
    assert shown["layers"] == local["layers"]
    assert shown["tp_size"] == local["tp_size"]


def test_show_an_engine_chunk_says_why_it_cannot_decode(remote: Remote) -> None:
    key = remote.keys[ENGINE][2]
    shown = run_json("show", remote.url, key.hex()[:6])
    assert shown["chunk"]["checksum_state"] == "ok"
    assert shown["chunk"]["size_bytes"] == 4096
    assert shown["descriptor"]["namespace_id"] == ENGINE
    assert (
        "remote tier's namespace descriptor has no chunk_layout" in (shown["decode_skipped_reason"])
    )
    assert shown["layers"] == []
    human = run("show", remote.url, key.hex()[:6])
    assert human.exit_code == 0, human.stderr
    assert "no decode: the remote tier's" in " ".join(human.stdout.split())


# -- the STORE argument -----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "is_remote"),
    [
        ("redis://127.0.0.1:6379/0", True),
        ("REDIS://h:1", True),
        ("rediss://h:6380/1", True),
        ("unix:///run/redis.sock", True),
        ("127.0.0.1:7000,127.0.0.1:7001", True),
        ("cache-host:6379", True),
        ("[::1]:6379", True),
        ("/var/lib/kvstore", False),
        ("store", False),
        ("./a:1", False),
    ],
)
def test_what_counts_as_a_redis_url(text: str, is_remote: bool) -> None:
    assert is_remote_target(text) is is_remote


def test_an_existing_directory_named_like_host_port_is_a_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "cache:6379").mkdir()
    assert is_remote_target("cache:6379") is False


# -- a cluster --------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cluster() -> Iterator[RedisClusterServers]:
    with redis_cluster() as servers:
        yield servers


def test_a_cluster_is_listed_across_its_masters(
    cluster: RedisClusterServers, tmp_path: Path
) -> None:
    remote = fill_remote(cluster, build_store(tmp_path / "store"))
    doc = run_json("stat", cluster.url)
    assert (doc["is_cluster"], len(doc["masters"])) == (True, 3)
    assert doc["num_entries"] == remote.num_chunks()
    assert [ns["namespace_id"] for ns in doc["namespaces"]] == ALL_NAMESPACES
    listed = run_json("ls", cluster.url, "--verify")["chunks"]
    assert {c["key"] for c in listed} == {key.hex() for _, key in remote.values}
    assert {c["checksum_state"] for c in listed} == {"ok"}
    assert run_json("verify", cluster.url)["num_ok"] == remote.num_chunks()
    shown = run_json("show", cluster.url, remote.keys[TP1][3].hex()[:8])
    assert shown["chunk"]["checksum_state"] == "ok" and shown["layers"]


# -- inspecting does not count as an access -------------------------------------------------


def _frequencies(server: RedisServer, remote: Remote) -> dict[bytes, int]:
    with server.client() as client:
        return {
            key: int(client.object("freq", codec.chunk_key(ns, key))) for ns, key in remote.values
        }


def test_stat_and_ls_leave_the_eviction_order_alone(tmp_path: Path) -> None:
    """Under allkeys-lfu every access bumps a key's counter (lfu-log-factor 0, no decay): stat
    and ls must leave every counter as it was; ls --verify (GET) bumps each, proving the check
    sees an access when there is one."""
    lfu = ["--lfu-log-factor", "0", "--lfu-decay-time", "0"]
    with redis_server(maxmemory="64mb", maxmemory_policy="allkeys-lfu", extra_args=lfu) as srv:
        remote = fill_remote(srv, build_store(tmp_path / "store"))
        before = _frequencies(srv, remote)
        assert run_json("stat", srv.url)["num_entries"] == remote.num_chunks()
        listed = run_json("ls", srv.url)["chunks"]
        assert {c["last_access_s"] for c in listed} == {None}  # LFU keeps no idle time
        assert run("ls", srv.url, "--sort", "age").exit_code == 0
        assert _frequencies(srv, remote) == before
        assert run_json("ls", srv.url, "--verify")["num_chunks"] == remote.num_chunks()
        after = _frequencies(srv, remote)
        assert all(after[key] > before[key] for key in before)


def test_a_server_on_a_unix_socket(tmp_path: Path) -> None:
    socket = tmp_path / "redis.sock"
    args = ["--unixsocket", str(socket), "--unixsocketperm", "700"]
    with redis_server(extra_args=args) as srv:
        remote = fill_remote(srv, build_store(tmp_path / "store"))
        url = f"unix://{socket}"
        doc = run_json("stat", url)
        assert (doc["url"], doc["num_entries"]) == (f"{url}?db=0", remote.num_chunks())
        assert run_json("verify", url)["num_ok"] == remote.num_chunks()
