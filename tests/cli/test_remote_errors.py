"""The remote tier's failures through the CLI: one `error:` line naming the URL (never a
password), exit 1 for a server that is down or hung (within the timeout), 2 for bad input."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvstore.cli._source import open_source
from kvstore.remote import RemoteUnavailableError
from tests.support.net import free_port
from tests.support.redis_servers import RedisServer, redis_cluster, redis_server

from .helpers import TP1, BuiltStore, build_store, run, run_json
from .remote_helpers import fill_remote
from .test_errors import assert_one_line_error

pytestmark = pytest.mark.redis

PASSWORD = "hunter2-not-for-logs"
# Every store command, given a Redis URL `{url}`.
REMOTE_COMMANDS = [
    ["stat", "{url}"],
    ["ls", "{url}"],
    ["show", "{url}", "01"],
    ["verify", "{url}"],
    ["rm", "{url}", "--all", "--yes"],
]


def run_url(command: list[str], url: str, *extra: str) -> tuple[float, object]:
    started = time.monotonic()
    result = run(*(part.format(url=url) for part in command), *extra)
    return time.monotonic() - started, result


@pytest.mark.parametrize("command", REMOTE_COMMANDS, ids=lambda c: c[0])
@pytest.mark.parametrize("as_json", [False, True], ids=["human", "json"])
def test_nothing_listening(command: list[str], as_json: bool) -> None:
    url = f"redis://127.0.0.1:{free_port()}/0"
    elapsed, result = run_url(command, url, *(["--json"] if as_json else []))
    assert_one_line_error(result, 1, f"cannot reach {url}", "Error 111")  # type: ignore[arg-type]
    assert elapsed < 2.0


@pytest.mark.parametrize("command", REMOTE_COMMANDS, ids=lambda c: c[0])
def test_a_hung_server_fails_within_the_timeout(command: list[str]) -> None:
    with redis_server() as server, server.paused():
        elapsed, result = run_url(command, server.url, "--timeout-ms", "300")
    assert_one_line_error(result, 1, server.url, "no answer within 300 ms")  # type: ignore[arg-type]
    assert elapsed < 1.5


def test_a_server_hung_mid_command_fails_within_the_timeout(tmp_path: Path) -> None:
    """Connected and listed, then the server stops answering: the next read raises within the
    timeout, and closing does not hang either."""
    with redis_server() as server:
        remote = fill_remote(server, build_store(tmp_path / "store"))
        started = time.monotonic()
        unavailable = pytest.raises(RemoteUnavailableError, match="no answer within 300 ms")
        with unavailable, open_source(server.url, None, 300) as source:
            assert sorted(source.namespaces()) == sorted(remote.keys)
            server.pause()
            started = time.monotonic()
            list(source.read_many(TP1, source.iter_keys(TP1)))
        elapsed = time.monotonic() - started
        server.resume()
    assert elapsed < 1.5


def test_a_dead_cluster_master_fails_the_listing_instead_of_shortening_it(tmp_path: Path) -> None:
    with redis_cluster() as cluster:
        fill_remote(cluster, build_store(tmp_path / "store"))
        dead = cluster.nodes[1]
        dead.kill()
        for command in (["stat"], ["ls"], ["verify"]):
            result = run(command[0], cluster.url, "--timeout-ms", "500")
            assert_one_line_error(result, 1, cluster.url, dead.address)


# -- passwords --------------------------------------------------------------------------------


@pytest.fixture
def locked() -> Iterator[RedisServer]:
    with redis_server(password=PASSWORD) as server:
        yield server


def assert_no_password(result: object) -> None:
    assert PASSWORD not in result.stdout + result.stderr  # type: ignore[attr-defined]


def test_the_password_comes_from_the_variable_named(
    locked: RedisServer, built: BuiltStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KV_TEST_PW", PASSWORD)
    fill_remote(locked, built, url=locked.url, password_env="KV_TEST_PW")
    doc = run_json("stat", locked.url, "--password-env", "KV_TEST_PW")
    assert doc["num_entries"] == 13
    assert PASSWORD not in str(doc)


def test_no_password_for_a_server_that_wants_one(locked: RedisServer) -> None:
    result = run("stat", locked.url)
    assert_one_line_error(result, 2, locked.url, "wants a password", "--password-env")


def test_a_wrong_password(locked: RedisServer, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KV_TEST_PW", "wrong-" + PASSWORD)
    result = run("ls", locked.url, "--password-env", "KV_TEST_PW")
    assert_one_line_error(result, 2, locked.url, "refused the password in $KV_TEST_PW")
    assert "wrong-" not in result.stderr


def test_a_password_variable_that_is_not_set(locked: RedisServer) -> None:
    result = run("stat", locked.url, "--password-env", "KV_TEST_UNSET_PW")
    assert_one_line_error(result, 2, "--password-env", "KV_TEST_UNSET_PW is not set")


def test_the_password_itself_given_as_the_variable_name_is_not_echoed(locked: RedisServer) -> None:
    result = run("stat", locked.url, "--password-env", PASSWORD)
    assert_one_line_error(result, 2, "--password-env", "NAME of an environment variable")
    assert_no_password(result)


def test_a_password_in_the_url_is_refused_and_not_echoed() -> None:
    result = run("stat", f"redis://user:{PASSWORD}@127.0.0.1:6379/0")
    assert_one_line_error(result, 2, "STORE: must not hold a password", "--password-env")
    assert_no_password(result)


# -- bad input --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("redis://127.0.0.1:99999/0", "STORE: port 99999"),
        ("redis://127.0.0.1:6379/x", "STORE: database 'x' is not a number"),
        ("rediss://h:1/0?colour=blue", "unknown query parameter 'colour'"),
    ],
)
def test_a_bad_url_is_a_usage_error(url: str, message: str) -> None:
    assert_one_line_error(run("stat", url), 2, message)


def test_a_seed_list_naming_a_standalone_server(locked: RedisServer) -> None:
    with redis_server() as server:
        seeds = f"{server.address},{server.address}"
        assert_one_line_error(run("stat", seeds), 2, "standalone server")


def test_redis_options_with_a_store_path(built: BuiltStore) -> None:
    result = run("stat", built.path, "--password-env", "X")
    assert_one_line_error(result, 2, "for a Redis URL", str(built.path))
