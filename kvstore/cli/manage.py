"""`kvstore rm` and `kvstore gc`: delete chunks from a store, live engine or not.

Deletes run in ordinary write transactions of at most `_BATCH` chunks, so an engine writing the
same store waits for at most one short batch (LMDB serialises writers across processes); the
engine treats a chunk that vanished under it as a miss. `rm` also deletes from the remote tier
(a Redis URL: DEL of the listed chunk keys, pipelined per node); `gc` is for store directories
only, Redis evicts by itself (`maxmemory` and its policy). Both ask before deleting on a
terminal, and refuse without `--yes` when stdin is not one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from kvstore.cli._chunks import ChunkMeta
from kvstore.cli._common import (
    EXIT_FAILURE,
    UsageError,
    cli_errors,
    confirm,
    emit_json,
    err_console,
    format_bytes,
    open_store,
    parse_size_option,
)
from kvstore.cli._source import (
    ChunkSource,
    PasswordEnvOption,
    StoreArgument,
    TimeoutOption,
    is_remote_target,
    open_source,
    resolve_key,
    resolve_namespaces,
)
from kvstore.cli.app import app
from tiers.lmdb import LMDBStore
from tiers.store import EntryMeta

__all__ = ["evict_lru", "gc", "rm"]

_BATCH = 256
_MAX_GC_PASSES = 3

StorePathArgument = Annotated[
    str, typer.Argument(metavar="STORE", help="The store directory (holds data.mdb).")
]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="Do not ask for confirmation.")]
JSONOption = Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")]


@dataclass(frozen=True, slots=True)
class _Target:
    """What `rm` deletes: these chunks, or every chunk of these namespaces."""

    chunks: tuple[ChunkMeta, ...] = ()
    namespaces: tuple[str, ...] = ()

    def describe(self) -> str:
        if self.chunks:
            return f"{len(self.chunks)} chunk(s)"
        return f"every chunk of {len(self.namespaces)} namespace(s): {', '.join(self.namespaces)}"


def _batched(items: Iterable[bytes]) -> Iterator[list[bytes]]:
    iterator = iter(items)
    while batch := list(islice(iterator, _BATCH)):
        yield batch


def delete_namespace_entries(source: ChunkSource, namespace: str) -> int:
    """Delete every chunk of `namespace` in short batches; its registration stays, so a live
    engine keeps writing to it."""
    num_deleted = 0
    while keys := list(islice(source.iter_keys(namespace), _BATCH)):
        num_deleted += source.delete_many(namespace, keys)
    return num_deleted


def _select(
    store: ChunkSource, keys: Sequence[str], namespace: str | None, *, every: bool, unregister: bool
) -> _Target:
    if every and (keys or namespace):
        raise UsageError("--all deletes everything; give no KEY and no --namespace with it")
    if unregister and (keys or not (namespace or every)):
        raise UsageError("--unregister goes with --namespace NS or --all, and no KEY")
    if keys:
        names = resolve_namespaces(store, namespace)
        chunks = {(m.namespace, m.key): m for m in (resolve_key(store, k, names) for k in keys)}
        return _Target(chunks=tuple(chunks.values()))
    if namespace is not None:
        return _Target(namespaces=tuple(resolve_namespaces(store, namespace)))
    if every:
        return _Target(namespaces=tuple(resolve_namespaces(store, None)))
    raise UsageError("say what to delete: KEY..., --namespace NS or --all")


def _delete(store: ChunkSource, target: _Target, unregister: bool) -> int:
    num_deleted = 0
    for chunk in target.chunks:
        num_deleted += store.delete_many(chunk.namespace, [chunk.key])
    for namespace in target.namespaces:
        num_deleted += delete_namespace_entries(store, namespace)
        if unregister:
            num_deleted += store.delete_namespace(namespace)
    return num_deleted


@app.command()
def rm(
    store: StoreArgument,
    keys: Annotated[
        list[str] | None, typer.Argument(help="Hex prefixes of the chunks to delete.")
    ] = None,
    namespace: Annotated[
        str | None,
        typer.Option(help="Without KEY: delete every chunk of this namespace; with: look there."),
    ] = None,
    every: Annotated[bool, typer.Option("--all", help="Delete every chunk of the store.")] = False,
    unregister: Annotated[
        bool,
        typer.Option(
            help="Also drop the namespace registration (Redis: its descriptor) - only when no "
            "engine uses it."
        ),
    ] = False,
    password_env: PasswordEnvOption = None,
    timeout_ms: TimeoutOption = None,
    yes: YesOption = False,
    as_json: JSONOption = False,
) -> None:
    """Delete chunks: KEY... (hex prefixes), a whole --namespace, or --all."""
    with cli_errors(), open_source(store, password_env, timeout_ms) as source:
        where = source.where()
        target = _select(source, keys or [], namespace, every=every, unregister=unregister)
        confirm(f"delete {target.describe()} from {source.location}", yes=yes)
        with source.for_writing() as writable:
            num_deleted = _delete(writable, target, unregister)
            num_entries, used_bytes = writable.totals()
    document = {
        **where,
        "num_deleted": num_deleted,
        "num_entries": num_entries,
        "used_bytes": used_bytes,
    }
    if as_json:
        emit_json(document)
    else:
        Console(highlight=False).print(
            f"deleted {num_deleted:,} chunks; {num_entries:,} left ({format_bytes(used_bytes)})"
        )
        if target.namespaces and not unregister:  # `stat` still lists them: say why
            err_console().print(
                f"namespace(s) {', '.join(target.namespaces)} stay registered (empty), so an "
                "engine using them keeps writing; add --unregister to drop the registration too"
            )


# -- gc ---------------------------------------------------------------------------------------


def _lru_order(store: LMDBStore) -> list[EntryMeta]:
    """Every chunk, least recently accessed first (the store's LRU), oldest created on ties."""
    metas = [meta for ns in store.namespaces() for meta in store.iter_meta(ns)]
    metas.sort(key=lambda m: (m.last_access_s, m.created_s))
    return metas


def _victims(metas: Iterable[EntryMeta], num_bytes: int) -> list[EntryMeta]:
    chosen: list[EntryMeta] = []
    freed = 0
    for meta in metas:
        if freed >= num_bytes:
            break
        chosen.append(meta)
        freed += meta.size_bytes
    return chosen


def evict_lru(store: LMDBStore, max_bytes: int, victims: Sequence[EntryMeta]) -> tuple[int, bool]:
    """Delete `victims` in order, in batches, until used bytes <= `max_bytes`; returns the
    number deleted and whether the store was seen at or under `max_bytes`."""
    num_deleted = 0
    for start in range(0, len(victims), _BATCH):
        if store.stats().used_bytes <= max_bytes:
            return num_deleted, True
        by_namespace: dict[str, list[bytes]] = {}
        for meta in victims[start : start + _BATCH]:
            by_namespace.setdefault(meta.namespace, []).append(meta.key)
        for namespace, keys in by_namespace.items():
            num_deleted += store.delete_many(namespace, keys)
    return num_deleted, store.stats().used_bytes <= max_bytes


def _evict_passes(path: Path, limit: int, victims: list[EntryMeta]) -> tuple[int, int, bool]:
    """Evict `victims`, re-planning while a live engine writes meanwhile (at most
    `_MAX_GC_PASSES`); returns chunks evicted, used bytes after, and whether any pass got
    the store down to `limit`."""
    num_evicted, used_after, has_reached = 0, 0, False
    for _ in range(_MAX_GC_PASSES):
        with open_store(path, writable=True) as writable:
            num_deleted, is_under = evict_lru(writable, limit, victims)
        num_evicted += num_deleted
        has_reached |= is_under
        used_after, victims = _plan_gc(path, limit)
        if not victims:
            break
    return num_evicted, used_after, has_reached


def _plan_gc(store: Path, max_bytes: int) -> tuple[int, list[EntryMeta]]:
    with open_store(store) as opened:
        used = opened.stats().used_bytes
        victims = _victims(_lru_order(opened), used - max_bytes) if used > max_bytes else []
    return used, victims


@app.command()
def gc(
    store: StorePathArgument,
    max_bytes: Annotated[
        str, typer.Option(help="Evict until the chunks use at most this much, e.g. 512MiB.")
    ],
    dry_run: Annotated[bool, typer.Option(help="Only say what would be evicted.")] = False,
    yes: YesOption = False,
    as_json: JSONOption = False,
) -> None:
    """Evict the least recently accessed chunks until used bytes <= --max-bytes (a store
    directory; Redis evicts by itself)."""
    path = Path(store)
    with cli_errors():
        if is_remote_target(store):
            raise UsageError(
                f"gc evicts from a store directory, not {store}: Redis evicts by itself "
                "(maxmemory and maxmemory-policy); use `kvstore rm` to delete from it"
            )
        limit = parse_size_option("--max-bytes", max_bytes)
        used_before, victims = _plan_gc(path, limit)
        num_evicted, used_after, has_reached = 0, used_before, True
        if victims and not dry_run:
            confirm(f"evict {len(victims):,} chunks from {path}", yes=yes)
            num_evicted, used_after, has_reached = _evict_passes(path, limit, victims)
    document: dict[str, Any] = {
        "path": str(path),
        "max_bytes": limit,
        "used_bytes_before": used_before,
        "used_bytes_after": used_after,
        "num_evicted": num_evicted,
        "dry_run": dry_run,
        "num_would_evict": len(victims) if dry_run else 0,
        "would_evict_bytes": sum(m.size_bytes for m in victims) if dry_run else 0,
    }
    _report_gc(document, as_json=as_json)
    if dry_run or used_after <= limit:
        return
    if has_reached:  # gc got under the limit; a live engine has written since
        err_console().print(
            f"note: {used_after:,} bytes used now (limit {limit:,}): an engine wrote while gc ran"
        )
        return
    err_console().print(f"[red]error:[/red] still {used_after:,} bytes used (limit {limit:,})")
    raise typer.Exit(EXIT_FAILURE)


def _report_gc(document: dict[str, Any], *, as_json: bool) -> None:
    if as_json:
        emit_json(document)
        return
    used_before, used_after = document["used_bytes_before"], document["used_bytes_after"]
    limit = format_bytes(document["max_bytes"])
    if document["dry_run"]:
        line = f"would evict {document['num_would_evict']:,} chunks"
        used_after -= document["would_evict_bytes"]
    else:
        line = f"evicted {document['num_evicted']:,} chunks"
    Console(highlight=False).print(
        f"{line}: used {format_bytes(used_before)} -> {format_bytes(used_after)} (limit {limit})"
    )
