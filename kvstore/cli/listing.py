"""`kvstore stat STORE` and `kvstore ls STORE`: what a store or the remote tier holds, safe beside
live engines.

A store directory is opened read-only and read in short batched transactions, so the commands
never block (or pin pages for) an engine writing it. A Redis URL is listed with SCAN and
described with commands that do not count as accesses (see `kvstore.cli._redis_source`), so
they do not reorder the shared tier's eviction.
"""

from __future__ import annotations

import heapq
import math
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvstore.cli._chunks import ChunkMeta, ChunkRead
from kvstore.cli._common import (
    cli_errors,
    emit_json,
    format_bytes,
    iso_time,
    relative_time,
    short_key,
)
from kvstore.cli._describe import entry_json, layout_summary, new_table, num_tokens_per_chunk
from kvstore.cli._source import (
    ChunkSource,
    PasswordEnvOption,
    StoreArgument,
    TimeoutOption,
    open_source,
    resolve_namespaces,
)
from kvstore.cli.app import app

__all__ = ["SortKey", "ls", "stat"]


# -- stat -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _AccessSpan:
    """Oldest and newest last access over a scan of entries (unknown ones left out)."""

    oldest_s: float | None = None
    newest_s: float | None = None

    def add(self, last_access_s: float | None) -> None:
        if last_access_s is None:
            return
        if self.oldest_s is None or last_access_s < self.oldest_s:
            self.oldest_s = last_access_s
        if self.newest_s is None or last_access_s > self.newest_s:
            self.newest_s = last_access_s

    def merge(self, other: _AccessSpan) -> None:
        for value in (other.oldest_s, other.newest_s):
            if value is not None:
                self.oldest_s = value if self.oldest_s is None else min(self.oldest_s, value)
                self.newest_s = value if self.newest_s is None else max(self.newest_s, value)

    def to_json(self) -> dict[str, Any]:
        return {
            "oldest_access_s": self.oldest_s,
            "oldest_access_iso": iso_time(self.oldest_s),
            "newest_access_s": self.newest_s,
            "newest_access_iso": iso_time(self.newest_s),
        }


@dataclass(slots=True)
class _Tally:
    """One namespace's chunks, bytes and access span, from one scan of its metadata."""

    num_entries: int = 0
    used_bytes: int = 0
    span: _AccessSpan = field(default_factory=_AccessSpan)

    def add(self, meta: ChunkMeta) -> None:
        self.num_entries += 1
        self.used_bytes += meta.used_bytes
        self.span.add(meta.last_access_s)


def _namespace_json(namespace: str, descriptor: Mapping[str, Any], tally: _Tally) -> dict[str, Any]:
    return {
        "namespace_id": namespace,
        "has_descriptor": bool(descriptor),
        "model": descriptor.get("model"),
        "kv_dtype": descriptor.get("kv_dtype"),
        "layout_summary": layout_summary(descriptor),
        "engine_block_size": descriptor.get("engine_block_size"),
        "num_tokens_per_chunk": num_tokens_per_chunk(descriptor),
        "tp_size": descriptor.get("tp_size"),
        "created_by": descriptor.get("created_by"),
        "has_chunk_layout": "chunk_layout" in descriptor,
        "num_entries": tally.num_entries,
        "used_bytes": tally.used_bytes,
        **tally.span.to_json(),
    }


def stat_document(source: ChunkSource) -> dict[str, Any]:
    """The backend's summary plus namespaces, their chunks, bytes and access times (one scan of
    the metadata). A store directory's totals are its O(1) counters."""
    descriptors = source.namespaces()
    total = _AccessSpan()
    namespaces = []
    for namespace in sorted(descriptors):
        tally = _Tally()
        for meta in source.iter_meta(namespace):
            tally.add(meta)
        total.merge(tally.span)
        namespaces.append(_namespace_json(namespace, descriptors[namespace], tally))
    return {
        **source.where(),
        "num_entries": sum(ns["num_entries"] for ns in namespaces),
        "used_bytes": sum(ns["used_bytes"] for ns in namespaces),
        **source.summary(),
        **total.to_json(),
        "num_namespaces": len(namespaces),
        "namespaces": namespaces,
    }


def _fields_table(title: str, rows: Iterable[tuple[str, str]]) -> Table:
    table = Table.grid(padding=(0, 2))
    table.title, table.title_justify, table.title_style = title, "left", "bold"
    table.add_column(style="dim")
    table.add_column()
    for name, value in rows:
        table.add_row(name, escape(value))
    return table


def _percent(ratio: float | None) -> str:
    return "-" if ratio is None else f"{100 * ratio:.1f}%"


def _size(size: int | None) -> str:
    return "-" if size is None else format_bytes(size)


def _backend_rows(document: Mapping[str, Any]) -> list[tuple[str, str]]:
    """The summary lines of one backend: a store's file, a Redis server's memory."""
    used = document["used_bytes"]
    if document["backend"] != "redis":
        return [
            ("used", f"{format_bytes(used)} ({used:,} B)"),
            ("capacity", format_bytes(document["capacity_bytes"])),
            ("fill", _percent(document["fill_ratio"])),
            ("file on disk", format_bytes(document["file_bytes"])),
        ]
    limit = document["maxmemory_bytes"]
    masters = document["masters"]
    kind = f"cluster of {len(masters)} masters" if document["is_cluster"] else "standalone"
    evicted = document["num_evicted_keys"]
    return [
        ("used", f"{format_bytes(used)} ({used:,} B, MEMORY USAGE of the chunks)"),
        ("server memory", _size(document["server_used_memory_bytes"])),
        ("maxmemory", "none" if limit is None else format_bytes(limit)),
        ("fill", _percent(document["server_fill_ratio"])),
        ("policy", str(document["maxmemory_policy"] or "-")),
        ("evicted keys", "-" if evicted is None else f"{evicted:,}"),
        ("server", f"{kind}: {', '.join(masters)}"),
    ]


def _namespace_rows(ns: Mapping[str, Any], now: float) -> list[tuple[str, str]]:
    tokens = ns["num_tokens_per_chunk"]
    entries = ("entries", f"{ns['num_entries']:,} ({format_bytes(ns['used_bytes'])})")
    access = [
        ("oldest access", _when(ns["oldest_access_s"], now)),
        ("newest access", _when(ns["newest_access_s"], now)),
    ]
    if not ns["has_descriptor"]:
        return [("descriptor", "none (evicted, or not written yet)"), entries, *access]
    return [
        ("model", str(ns["model"])),
        ("kv dtype", str(ns["kv_dtype"])),
        ("layout", ns["layout_summary"]),
        ("block size", f"{ns['engine_block_size']} tokens"),
        ("chunk", "-" if tokens is None else f"{tokens} tokens"),
        ("TP size", str(ns["tp_size"])),
        ("created by", str(ns["created_by"] or "-")),
        entries,
        *access,
    ]


def _print_stat(document: Mapping[str, Any]) -> None:
    console, now = Console(highlight=False), time.time()
    where = document.get("path") or document.get("url")
    rows = [
        ("entries", f"{document['num_entries']:,}"),
        *_backend_rows(document),
        ("oldest access", _when(document["oldest_access_s"], now)),
        ("newest access", _when(document["newest_access_s"], now)),
        ("namespaces", str(document["num_namespaces"])),
    ]
    console.print(_fields_table(f"store {where}", rows))
    for ns in document["namespaces"]:
        console.print()
        console.print(_fields_table(f"namespace {ns['namespace_id']}", _namespace_rows(ns, now)))


def _when(epoch_s: float | None, now_s: float) -> str:
    return "-" if epoch_s is None else f"{relative_time(epoch_s, now_s)} ({iso_time(epoch_s)})"


@app.command()
def stat(
    store: StoreArgument,
    password_env: PasswordEnvOption = None,
    timeout_ms: TimeoutOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Namespaces, entries, bytes, capacity or memory, fill and access times of a store."""
    with cli_errors(), open_source(store, password_env, timeout_ms) as source:
        document = stat_document(source)
    if as_json:
        emit_json(document)
    else:
        _print_stat(document)


# -- ls ---------------------------------------------------------------------------------------


class SortKey(StrEnum):
    AGE = "age"
    SIZE = "size"
    HITS = "hits"
    KEY = "key"


def _known(value: float | None) -> float:
    """What a backend does not record sorts last (largest first) or first (reversed)."""
    return -math.inf if value is None else value


# Largest first for every order; "age" puts the most recently accessed first (like `ls -t`).
_ORDER: dict[SortKey, Callable[[ChunkMeta], Any]] = {
    SortKey.AGE: lambda m: (_known(m.last_access_s), m.namespace, m.key),
    SortKey.SIZE: lambda m: (m.used_bytes, m.namespace, m.key),
    SortKey.HITS: lambda m: (_known(m.num_hits), m.namespace, m.key),
}


def _by_key(meta: ChunkMeta) -> tuple[str, bytes]:
    return meta.namespace, meta.key


def select_entries(
    metas: Iterable[ChunkMeta], sort: SortKey, *, limit: int | None, reverse: bool
) -> list[ChunkMeta]:
    """Sorted (see `_ORDER`; key order for `key`), reversed if asked, the first `limit` kept."""
    order: Callable[[ChunkMeta], Any] = _ORDER.get(sort, _by_key)
    largest_first = reverse if sort is SortKey.KEY else not reverse
    if limit is None:
        return sorted(metas, key=order, reverse=largest_first)
    pick = heapq.nlargest if largest_first else heapq.nsmallest
    return pick(limit, metas, key=order)


def _iter_all(source: ChunkSource, namespaces: list[str]) -> Iterable[ChunkMeta]:
    for namespace in namespaces:
        yield from source.iter_meta(namespace)


def _read_all(source: ChunkSource, entries: list[ChunkMeta]) -> dict[tuple[str, bytes], ChunkRead]:
    """Each listed chunk read and verified (grouped by namespace: one batch each)."""
    by_namespace: dict[str, list[bytes]] = {}
    for meta in entries:
        by_namespace.setdefault(meta.namespace, []).append(meta.key)
    return {
        (read.namespace, read.key): read
        for namespace, keys in by_namespace.items()
        for read in source.read_many(namespace, keys)
    }


def _rows(source: ChunkSource, entries: list[ChunkMeta], *, verify: bool) -> list[dict[str, Any]]:
    descriptors = source.namespaces()
    if not verify:
        return [entry_json(meta, descriptor=descriptors.get(meta.namespace)) for meta in entries]
    reads = _read_all(source, entries)
    rows = []
    for meta in entries:
        read = reads[meta.namespace, meta.key]
        rows.append(entry_json(read.meta or meta, read.state, descriptors.get(meta.namespace)))
    return rows


def _print_ls(rows: list[dict[str, Any]], num_total: int) -> None:
    console, now = Console(highlight=False), time.time()
    has_groups = any("group" in row for row in rows)  # a hybrid engine's entries
    columns = ("key", "namespace", *(("group",) if has_groups else ()), "size", "hits", "created",
               "accessed", "checksum")  # fmt: skip
    table = new_table(
        *columns,
        numeric=("size", "hits", "created", "accessed"),
        keys=("key",),
        wrap=("size", "created", "accessed"),
    )
    for row in rows:
        size = row["size_bytes"] if row["size_bytes"] is not None else row["memory_bytes"]
        hits = row["num_hits"]
        table.add_row(
            short_key(bytes.fromhex(row["key"])),
            row["namespace"][:8],
            *((_group_text(row.get("group")),) if has_groups else ()),
            _size(size),
            "-" if hits is None else f"{hits:,}",
            relative_time(row["created_s"], now),
            relative_time(row["last_access_s"], now),
            row["checksum_state"],
        )
    console.print(table)
    console.print(f"{len(rows):,} of {num_total:,} chunks", style="dim")


def _group_text(group: Mapping[str, Any] | None) -> str:
    """E.g. `1 sliding 64` or `3 full` (a hybrid engine's KV cache group)."""
    if group is None:
        return "-"
    window = group.get("window_tokens")
    return " ".join(str(p) for p in (group["index"], group.get("kind", "?"), window) if p)


@app.command(name="ls")
def ls(
    store: StoreArgument,
    namespace: Annotated[
        str | None, typer.Option(help="Only this namespace (an id or a unique prefix).")
    ] = None,
    sort: Annotated[
        SortKey,
        typer.Option(
            help="age: most recently accessed first; size, hits: largest first (Redis counts "
            "no hits)."
        ),
    ] = SortKey.AGE,
    reverse: Annotated[bool, typer.Option(help="Reverse the order.")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="Show at most this many.")] = None,
    verify: Annotated[
        bool, typer.Option(help="Read the listed chunks and verify their checksums.")
    ] = False,
    password_env: PasswordEnvOption = None,
    timeout_ms: TimeoutOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """One row per chunk: key, namespace, size, hits, created, last access, checksum state.

    On Redis the size is the value's MEMORY USAGE until --verify reads the payload's own size.
    """
    with cli_errors(), open_source(store, password_env, timeout_ms) as source:
        names = resolve_namespaces(source, namespace)
        num_total = source.num_chunks(names)
        entries = select_entries(_iter_all(source, names), sort, limit=limit, reverse=reverse)
        rows = _rows(source, entries, verify=verify)
        where = source.where()
    if as_json:
        emit_json({**where, "num_chunks": num_total, "chunks": rows})
    else:
        _print_ls(rows, num_total)
