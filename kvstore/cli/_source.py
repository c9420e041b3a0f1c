"""Where the store commands read: an LMDB store directory or a Redis server / Redis Cluster (the
remote tier), behind one Protocol, so each command is written once.

    STORE                                   source
    /path/to/store                          LMDBSource  (kvstore.cli._lmdb_source)
    redis://host:6379/0  rediss://...       RedisSource (kvstore.cli._redis_source)
    unix:///run/redis.sock  h1:p1,h2:p2

A Redis password is given by the NAME of an environment variable (`--password-env`), never on
the command line or in any output. Errors: a path that is not a store, a bad URL or a refused
password exit 2; a server that cannot be reached within `--timeout-ms` exits 1 with one line
naming the URL.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Annotated, Any, Protocol

import typer

from kvstore.cli._chunks import ChunkMeta, ChunkRead
from kvstore.cli._common import UsageError
from kvstore.errors import KeyLookupError
from tiers.errors import TierConfigError
from tiers.store import hex_prefix_bytes

__all__ = [
    "ChunkSource",
    "PasswordEnvOption",
    "StoreArgument",
    "TimeoutOption",
    "is_remote_target",
    "open_source",
    "resolve_key",
    "resolve_namespaces",
]

DEFAULT_TIMEOUT_MS = 2000
_MAX_CANDIDATES = 5
_SCHEME = re.compile(r"(?:redis|rediss|unix)://", re.IGNORECASE)
_SEED_LIST = re.compile(r"[^/\\\s,]+:\d+(?:,[^/\\\s,]+:\d+)*")

StoreArgument = Annotated[
    str,
    typer.Argument(
        metavar="STORE",
        show_default=False,
        help="A store directory (holds data.mdb), or the remote tier: redis://host:6379/0, "
        "rediss://..., unix:///path/redis.sock, or host:port,host:port (a cluster's seeds).",
    ),
]
PasswordEnvOption = Annotated[
    str | None,
    typer.Option(
        "--password-env",
        metavar="NAME",
        help="Redis: the NAME of the environment variable holding the password.",
    ),
]
TimeoutOption = Annotated[
    int | None,
    typer.Option(
        "--timeout-ms",
        min=1,
        show_default=False,
        help=f"Redis: the most one round trip may take, connecting included "
        f"[default: {DEFAULT_TIMEOUT_MS}].",
    ),
]


class ChunkSource(Protocol):
    """Chunks grouped by namespace, read with their checksums verified, deleted by key.

    Read-only until `for_writing()`; `iter_*` may skip chunks deleted meanwhile (a live engine
    evicting them), and a chunk that vanishes while read is `ChecksumState.VANISHED`.
    """

    @property
    def location(self) -> str:
        """The store path or the URL (without a password), for messages."""

    @property
    def no_layout_reason(self) -> str:
        """Why a descriptor of this backend may lack a chunk layout (for `show`)."""

    def where(self) -> dict[str, str]:
        """`{"path": ...}` or `{"url": ...}`, the first fields of every JSON document."""

    def summary(self) -> dict[str, Any]:
        """Backend-wide figures for `stat` (capacity, memory, policy, ...)."""

    def namespaces(self) -> dict[str, Mapping[str, Any]]:
        """Every namespace and its descriptor ({} when the backend holds none for it)."""

    def num_chunks(self, namespaces: Sequence[str]) -> int:
        """How many chunks `namespaces` hold (cheap: counters or the listing)."""

    def iter_meta(self, namespace: str) -> Iterator[ChunkMeta]: ...

    def iter_keys(self, namespace: str) -> Iterator[bytes]: ...

    def find_keys(self, namespace: str, prefix: str, limit: int) -> list[bytes]:
        """At most `limit` keys whose hex starts with `prefix`."""

    def meta(self, namespace: str, key: bytes) -> ChunkMeta | None: ...

    def read_many(self, namespace: str, keys: Iterable[bytes]) -> Iterator[ChunkRead]:
        """Each chunk read and verified, in order; a value is valid until the next item."""

    def delete_many(self, namespace: str, keys: Sequence[bytes]) -> int:
        """Delete chunks; returns how many were there."""

    def delete_namespace(self, namespace: str) -> int:
        """Drop the namespace's registration (descriptor); returns chunks deleted with it."""

    def totals(self) -> tuple[int, int]:
        """(chunks, used bytes) now, after any deletes."""

    def for_writing(self) -> AbstractContextManager[ChunkSource]:
        """This source opened for deleting (an LMDB store is reopened writable)."""


def is_remote_target(store: str) -> bool:
    """A Redis URL or a `host:port[,host:port...]` list that is not an existing path."""
    if _SCHEME.match(store):
        return True
    return _SEED_LIST.fullmatch(store) is not None and not Path(store).exists()


@contextmanager
def open_source(
    store: str, password_env: str | None = None, timeout_ms: int | None = None
) -> Iterator[ChunkSource]:
    """The source `store` names, opened read-only (closed on exit)."""
    if is_remote_target(store):
        from kvstore.cli._redis_source import open_redis_source

        timeout = DEFAULT_TIMEOUT_MS if timeout_ms is None else timeout_ms
        with open_redis_source(store, password_env, timeout) as redis_source:
            yield redis_source
        return
    if password_env is not None or timeout_ms is not None:
        raise UsageError(f"--password-env and --timeout-ms are for a Redis URL, not {store}")
    from kvstore.cli._lmdb_source import open_lmdb_source

    with open_lmdb_source(Path(store)) as lmdb_source:
        yield lmdb_source


def resolve_namespaces(source: ChunkSource, namespace: str | None) -> list[str]:
    """Every namespace of the source, or the one `namespace` names (an id or a unique prefix)."""
    names = sorted(source.namespaces())
    if namespace is None:
        return names
    if namespace in names:
        return [namespace]
    matches = [name for name in names if name.startswith(namespace)]
    if len(matches) == 1:
        return matches
    known = ", ".join(names[:_MAX_CANDIDATES]) or "none"
    if matches:
        raise UsageError(f"namespace prefix {namespace!r} matches {len(matches)}: {known}")
    raise UsageError(f"unknown namespace {namespace!r} in {source.location}; it has: {known}")


def resolve_key(source: ChunkSource, prefix: str, namespaces: Sequence[str]) -> ChunkMeta:
    """The one chunk whose hex key starts with `prefix`, in `namespaces`.

    Raises KeyLookupError if none or several match (listing a few candidates).
    """
    if not prefix:
        raise UsageError("key prefix is empty; give at least one hex digit")
    try:
        hex_prefix_bytes(prefix)
    except TierConfigError as exc:
        raise UsageError(str(exc)) from exc
    found: list[tuple[str, bytes]] = []
    for namespace in namespaces:
        keys = source.find_keys(namespace, prefix, _MAX_CANDIDATES + 1)
        found.extend((namespace, key) for key in keys)
    if not found:
        raise KeyLookupError(f"no chunk key starts with {prefix!r} in {source.location}")
    if len(found) > 1:
        shown = ", ".join(f"{key.hex()[:16]} ({ns[:8]})" for ns, key in found[:_MAX_CANDIDATES])
        more = "+" if len(found) > _MAX_CANDIDATES else ""
        raise KeyLookupError(
            f"key prefix {prefix!r} matches {len(found)}{more} chunks: {shown}; give more digits"
        )
    namespace, key = found[0]
    meta = source.meta(namespace, key)
    if meta is None:
        raise KeyLookupError(f"chunk {key.hex()[:16]} vanished while reading (deleted meanwhile)")
    return meta
