"""`kvstore verify STORE`: read every chunk, check its xxh64, and optionally delete the bad ones.

The scan opens the store read-only (short read transactions; a live engine keeps writing), so a
chunk the engine evicts meanwhile counts as vanished, not as bad. `--repair` then opens the store
for writing and deletes the bad chunks in one transaction per namespace; the engine treats a
vanished chunk as a miss and recomputes it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from kvstore.cli._common import (
    EXIT_FAILURE,
    cli_errors,
    emit_json,
    err_console,
    open_store,
    resolve_namespaces,
    short_key,
)
from kvstore.cli._describe import ChecksumState, new_table
from kvstore.cli._reading import ChunkReader
from kvstore.cli.app import app
from tiers.lmdb import LMDBStore

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

    def to_json(self, path: Path, *, repair: bool) -> dict[str, Any]:
        return {
            "path": str(path),
            "num_checked": sum(self.counts.values()),
            "num_ok": self.counts[ChecksumState.OK],
            "num_corrupt": self.counts[ChecksumState.CORRUPT],
            "num_vanished": self.counts[ChecksumState.VANISHED],
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


def scan(store: LMDBStore, namespaces: Sequence[str], *, show_progress: bool) -> VerifyReport:
    """Read and checksum every chunk of `namespaces`."""
    report = VerifyReport()
    reader = ChunkReader(store)
    counts = store.stats().namespaces
    total = sum(counts[n].num_entries for n in namespaces if n in counts)
    with _progress() as progress:
        task = progress.add_task("verify", total=total, visible=show_progress)
        for namespace in namespaces:
            for key in store.iter_keys(namespace):
                read = reader.read(namespace, key)
                report.counts[read.state] += 1
                if read.state is ChecksumState.CORRUPT:
                    report.bad.append(BadChunk(namespace, key, read.error))
                progress.advance(task)
    return report


def repair(store: LMDBStore, bad: Sequence[BadChunk]) -> tuple[int, int]:
    """Delete the bad chunks (one transaction per namespace); returns (deleted, still there)."""
    by_namespace: dict[str, list[bytes]] = {}
    for chunk in bad:
        by_namespace.setdefault(chunk.namespace, []).append(chunk.key)
    num_deleted = sum(store.delete_many(ns, keys) for ns, keys in by_namespace.items())
    num_remaining = sum(
        store.meta(ns, key) is not None for ns, keys in by_namespace.items() for key in keys
    )
    return num_deleted, num_remaining


def _print_report(report: VerifyReport, *, repair: bool) -> None:
    console = Console(highlight=False)
    counts = report.counts
    console.print(
        f"checked {sum(counts.values()):,} chunks: {counts[ChecksumState.OK]:,} ok, "
        f"{counts[ChecksumState.CORRUPT]:,} corrupt, {counts[ChecksumState.VANISHED]:,} vanished "
        "while reading"
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
    store: Annotated[Path, typer.Argument(help="The store directory (holds data.mdb).")],
    namespace: Annotated[
        str | None, typer.Option(help="Only this namespace (an id or a unique prefix).")
    ] = None,
    repair_bad: Annotated[
        bool, typer.Option("--repair", help="Delete the chunks that fail their checksum.")
    ] = False,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Check every chunk's checksum; exit 1 if corrupt chunks remain (0 after --repair)."""
    with cli_errors():
        with open_store(store) as opened:
            path = opened.path
            report = scan(opened, resolve_namespaces(opened, namespace), show_progress=True)
        report.num_remaining = len(report.bad)
        if repair_bad and report.bad:
            with open_store(store, writable=True) as writable:
                report.num_repaired, report.num_remaining = repair(writable, report.bad)
    if as_json:
        emit_json(report.to_json(path, repair=repair_bad))
    else:
        _print_report(report, repair=repair_bad)
    if report.num_remaining:
        hint = "" if repair_bad else "; run with --repair to delete them"
        err_console().print(
            f"[red]error:[/red] {report.num_remaining} corrupt chunks remain in {path}{hint}"
        )
        raise typer.Exit(EXIT_FAILURE)
