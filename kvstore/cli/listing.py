"""`kvstore stat STORE` and `kvstore ls STORE`: what a store holds, safe beside a live engine.

Both open the store read-only and read in short batched transactions, so they never block (or
pin pages for) an engine writing the same store.
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvstore.cli._common import (
    cli_errors,
    emit_json,
    format_bytes,
    iso_time,
    open_store,
    relative_time,
    resolve_namespaces,
    short_key,
)
from kvstore.cli._describe import (
    ChecksumState,
    entry_json,
    layout_summary,
    new_table,
    num_tokens_per_chunk,
)
from kvstore.cli._reading import ChunkReader
from kvstore.cli.app import app
from tiers.lmdb import LMDBStore
from tiers.store import EntryMeta, StoreStats

__all__ = ["SortKey", "ls", "stat"]

StoreArgument = Annotated[
    Path, typer.Argument(help="The store directory (holds data.mdb).", show_default=False)
]


# -- stat -------------------------------------------------------------------------------------


@dataclass(slots=True)
class _AccessSpan:
    """Oldest and newest last access over a scan of entries."""

    oldest_s: float | None = None
    newest_s: float | None = None

    def add(self, meta: EntryMeta) -> None:
        if self.oldest_s is None or meta.last_access_s < self.oldest_s:
            self.oldest_s = meta.last_access_s
        if self.newest_s is None or meta.last_access_s > self.newest_s:
            self.newest_s = meta.last_access_s

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


def _namespace_json(
    namespace: str, descriptor: Mapping[str, Any], stats: StoreStats, span: _AccessSpan
) -> dict[str, Any]:
    counts = stats.namespaces.get(namespace)
    return {
        "namespace_id": namespace,
        "model": descriptor.get("model"),
        "kv_dtype": descriptor.get("kv_dtype"),
        "layout_summary": layout_summary(descriptor),
        "engine_block_size": descriptor.get("engine_block_size"),
        "num_tokens_per_chunk": num_tokens_per_chunk(descriptor),
        "tp_size": descriptor.get("tp_size"),
        "created_by": descriptor.get("created_by"),
        "has_chunk_layout": "chunk_layout" in descriptor,
        "num_entries": 0 if counts is None else counts.num_entries,
        "used_bytes": 0 if counts is None else counts.used_bytes,
        **span.to_json(),
    }


def stat_document(store: LMDBStore) -> dict[str, Any]:
    """Occupancy (O(1) counters) plus access times and namespaces (one scan of the metas)."""
    descriptors = store.namespaces()
    stats = store.stats()
    total = _AccessSpan()
    namespaces = []
    for namespace in sorted(descriptors):
        span = _AccessSpan()
        for meta in store.iter_meta(namespace):
            span.add(meta)
        total.merge(span)
        namespaces.append(_namespace_json(namespace, descriptors[namespace], stats, span))
    capacity = stats.capacity_bytes
    return {
        "path": str(store.path),
        "num_entries": stats.num_entries,
        "used_bytes": stats.used_bytes,
        "capacity_bytes": capacity,
        "free_bytes": stats.free_bytes,
        "fill_ratio": round(stats.used_bytes / capacity, 6) if capacity else None,
        "file_bytes": stats.file_bytes,
        "map_size_bytes": stats.map_size_bytes,
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


def _print_stat(document: Mapping[str, Any]) -> None:
    console, now = Console(highlight=False), time.time()
    ratio = document["fill_ratio"]
    used = document["used_bytes"]
    console.print(
        _fields_table(
            f"store {document['path']}",
            (
                ("entries", f"{document['num_entries']:,}"),
                ("used", f"{format_bytes(used)} ({used:,} B)"),
                ("capacity", format_bytes(document["capacity_bytes"])),
                ("fill", "-" if ratio is None else f"{100 * ratio:.1f}%"),
                ("file on disk", format_bytes(document["file_bytes"])),
                ("oldest access", _when(document["oldest_access_s"], now)),
                ("newest access", _when(document["newest_access_s"], now)),
                ("namespaces", str(document["num_namespaces"])),
            ),
        )
    )
    for ns in document["namespaces"]:
        tokens = ns["num_tokens_per_chunk"]
        console.print()
        console.print(
            _fields_table(
                f"namespace {ns['namespace_id']}",
                (
                    ("model", str(ns["model"])),
                    ("kv dtype", str(ns["kv_dtype"])),
                    ("layout", ns["layout_summary"]),
                    ("block size", f"{ns['engine_block_size']} tokens"),
                    ("chunk", "-" if tokens is None else f"{tokens} tokens"),
                    ("TP size", str(ns["tp_size"])),
                    ("created by", str(ns["created_by"] or "-")),
                    ("entries", f"{ns['num_entries']:,} ({format_bytes(ns['used_bytes'])})"),
                    ("oldest access", _when(ns["oldest_access_s"], now)),
                    ("newest access", _when(ns["newest_access_s"], now)),
                ),
            )
        )


def _when(epoch_s: float | None, now_s: float) -> str:
    return "-" if epoch_s is None else f"{relative_time(epoch_s, now_s)} ({iso_time(epoch_s)})"


@app.command()
def stat(
    store: StoreArgument,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Namespaces, entries, used bytes, capacity, file size, fill and access times of a store."""
    with cli_errors(), open_store(store) as opened:
        document = stat_document(opened)
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


# Largest first for every order; "age" puts the most recently accessed first (like `ls -t`).
_ORDER: dict[SortKey, Callable[[EntryMeta], Any]] = {
    SortKey.AGE: lambda m: m.last_access_s,
    SortKey.SIZE: lambda m: m.size_bytes,
    SortKey.HITS: lambda m: m.num_hits,
}


def _by_key(meta: EntryMeta) -> tuple[str, bytes]:
    return meta.namespace, meta.key


def select_entries(
    metas: Iterable[EntryMeta], sort: SortKey, *, limit: int | None, reverse: bool
) -> list[EntryMeta]:
    """Sorted (see `_ORDER`; key order for `key`), reversed if asked, the first `limit` kept."""
    order: Callable[[EntryMeta], Any] = _ORDER.get(sort, _by_key)
    largest_first = reverse if sort is SortKey.KEY else not reverse
    if limit is None:
        return sorted(metas, key=order, reverse=largest_first)
    pick = heapq.nlargest if largest_first else heapq.nsmallest
    return pick(limit, metas, key=order)


def _iter_all(store: LMDBStore, namespaces: list[str]) -> Iterable[EntryMeta]:
    for namespace in namespaces:
        yield from store.iter_meta(namespace)


def _print_ls(rows: list[dict[str, Any]], num_total: int) -> None:
    console, now = Console(highlight=False), time.time()
    columns = ("key", "namespace", "size", "hits", "created", "accessed", "checksum")
    table = new_table(
        *columns,
        numeric=("size", "hits", "created", "accessed"),
        keys=("key",),
        wrap=("size", "created", "accessed"),
    )
    for row in rows:
        table.add_row(
            short_key(bytes.fromhex(row["key"])),
            row["namespace"][:8],
            format_bytes(row["size_bytes"]),
            f"{row['num_hits']:,}",
            relative_time(row["created_s"], now),
            relative_time(row["last_access_s"], now),
            row["checksum_state"],
        )
    console.print(table)
    console.print(f"{len(rows):,} of {num_total:,} chunks", style="dim")


@app.command(name="ls")
def ls(
    store: StoreArgument,
    namespace: Annotated[
        str | None, typer.Option(help="Only this namespace (an id or a unique prefix).")
    ] = None,
    sort: Annotated[
        SortKey,
        typer.Option(help="age: most recently accessed first; size, hits: largest first."),
    ] = SortKey.AGE,
    reverse: Annotated[bool, typer.Option(help="Reverse the order.")] = False,
    limit: Annotated[int | None, typer.Option(min=1, help="Show at most this many.")] = None,
    verify: Annotated[
        bool, typer.Option(help="Read the listed chunks and verify their checksums.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """One row per chunk: key, namespace, size, hits, created, last access, checksum state."""
    with cli_errors(), open_store(store) as opened:
        names = resolve_namespaces(opened, namespace)
        counts = opened.stats().namespaces
        num_total = sum(counts[n].num_entries for n in names if n in counts)
        entries = select_entries(_iter_all(opened, names), sort, limit=limit, reverse=reverse)
        reader = ChunkReader(opened)
        states = [
            reader.read(m.namespace, m.key).state if verify else ChecksumState.UNVERIFIED
            for m in entries
        ]
    rows = [entry_json(meta, state) for meta, state in zip(entries, states, strict=True)]
    if as_json:
        emit_json({"path": str(opened.path), "num_chunks": num_total, "chunks": rows})
    else:
        _print_ls(rows, num_total)
