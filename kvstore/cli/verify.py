"""`kvstore verify STORE`: read every chunk, check its xxh64, and optionally delete the bad ones.

A store directory is scanned read-only (short read transactions; a live engine keeps writing),
so a chunk the engine evicts meanwhile counts as vanished, not as bad; `--repair` then reopens
it for writing and deletes the bad chunks. On Redis every value is fetched (GET, pipelined) and
checked against the remote value format (size, xxh64, namespace, key); `--repair` DELs the bad
ones. A value written by a newer kvstore is counted, never deleted. Engines treat a deleted
chunk as a miss and recompute it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvstore.cli._chunks import ChecksumState
from kvstore.cli._common import EXIT_FAILURE, cli_errors, emit_json, err_console, short_key
from kvstore.cli._describe import new_table
from kvstore.cli._source import (
    ChunkSource,
    PasswordEnvOption,
    StoreArgument,
    TimeoutOption,
    open_source,
    resolve_namespaces,
)
from kvstore.cli.app import app

__all__ = ["BadChunk", "VerifyReport", "repair", "scan", "verify"]


@dataclass(frozen=True, slots=True)
class BadChunk:
    namespace: str
    key: bytes
    error: str

    def to_json(self) -> dict[str, str]:
        return {"namespace": self.namespace, "key": self.key.hex(), "error": self.error}


@dataclass(slots=True)
class VerifyReport:
    """What a scan found, and what a repair did."""

    counts: Counter[ChecksumState] = field(default_factory=Counter)
    bad: list[BadChunk] = field(default_factory=list)
    num_repaired: int = 0
    num_remaining: int = 0

    def to_json(self, where: dict[str, str], *, repair: bool) -> dict[str, Any]:
        return {
            **where,
            "num_checked": sum(self.counts.values()),
            "num_ok": self.counts[ChecksumState.OK],
            "num_corrupt": self.counts[ChecksumState.CORRUPT],
            "num_vanished": self.counts[ChecksumState.VANISHED],
            "num_newer_format": self.counts[ChecksumState.NEWER_FORMAT],
            "corrupt": [bad.to_json() for bad in self.bad],
            "repair": repair,
            "num_repaired": self.num_repaired,
            "num_corrupt_remaining": self.num_remaining,
        }


def _progress() -> Progress:
    """A bar on stderr, only when stderr is a terminal (nothing in logs or pipes)."""
    console = err_console()
    return Progress(
        TextColumn("verifying"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        transient=True,
        disable=not console.is_terminal,
    )


def scan(source: ChunkSource, namespaces: Sequence[str], *, show_progress: bool) -> VerifyReport:
    """Read and checksum every chunk of `namespaces`."""
    report = VerifyReport()
    total = source.num_chunks(namespaces)
    with _progress() as progress:
        task = progress.add_task("verify", total=total, visible=show_progress)
        for namespace in namespaces:
            for read in source.read_many(namespace, source.iter_keys(namespace)):
                report.counts[read.state] += 1
                if read.state is ChecksumState.CORRUPT:
                    report.bad.append(BadChunk(namespace, read.key, read.error))
                progress.advance(task)
    return report


def repair(source: ChunkSource, bad: Sequence[BadChunk]) -> tuple[int, int]:
    """Delete the bad chunks (one batch per namespace); returns (deleted, still there)."""
    by_namespace: dict[str, list[bytes]] = {}
    for chunk in bad:
        by_namespace.setdefault(chunk.namespace, []).append(chunk.key)
    num_deleted = sum(source.delete_many(ns, keys) for ns, keys in by_namespace.items())
    num_remaining = sum(
        source.meta(ns, key) is not None for ns, keys in by_namespace.items() for key in keys
    )
    return num_deleted, num_remaining


def _print_report(report: VerifyReport, *, repair: bool) -> None:
    console = Console(highlight=False)
    counts = report.counts
    newer = counts[ChecksumState.NEWER_FORMAT]
    console.print(
        f"checked {sum(counts.values()):,} chunks: {counts[ChecksumState.OK]:,} ok, "
        f"{counts[ChecksumState.CORRUPT]:,} corrupt, {counts[ChecksumState.VANISHED]:,} vanished "
        "while reading"
        + (f", {newer:,} written by a newer kvstore (not checked, kept)" if newer else "")
    )
    if report.bad:
        table = new_table(
            "key", "namespace", "error", keys=("key",), wrap=("namespace", "error"),
            title="corrupt chunks",
        )  # fmt: skip
        for bad in report.bad:
            table.add_row(short_key(bad.key), bad.namespace, escape(bad.error))
        console.print(table)
    if repair:
        console.print(f"repaired: deleted {report.num_repaired:,} corrupt chunks")


@app.command()
def verify(
    store: StoreArgument,
    namespace: Annotated[
        str | None, typer.Option(help="Only this namespace (an id or a unique prefix).")
    ] = None,
    repair_bad: Annotated[
        bool, typer.Option("--repair", help="Delete the chunks that fail their checksum.")
    ] = False,
    password_env: PasswordEnvOption = None,
    timeout_ms: TimeoutOption = None,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Check every chunk's checksum; exit 1 if corrupt chunks remain (0 after --repair)."""
    with cli_errors(), open_source(store, password_env, timeout_ms) as source:
        where = source.where()
        report = scan(source, resolve_namespaces(source, namespace), show_progress=True)
        report.num_remaining = len(report.bad)
        if repair_bad and report.bad:
            with source.for_writing() as writable:
                report.num_repaired, report.num_remaining = repair(writable, report.bad)
    if as_json:
        emit_json(report.to_json(where, repair=repair_bad))
    else:
        _print_report(report, repair=repair_bad)
    if report.num_remaining:
        hint = "" if repair_bad else "; run with --repair to delete them"
        location = where.get("path") or where.get("url")
        err_console().print(
            f"[red]error:[/red] {report.num_remaining} corrupt chunks remain in {location}{hint}"
        )
        raise typer.Exit(EXIT_FAILURE)
