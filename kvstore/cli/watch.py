"""`kvstore watch ENDPOINT`: follow a KV-events stream (kvstore's or vLLM's own) live."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape

from kvstore.cli.app import app
from kvstore.eventbus.wire import (
    END_SEQ,
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEventBatch,
    decode_batch,
)

if TYPE_CHECKING:
    import zmq  # imported where used: `kvstore --help` need not load it

__all__ = ["WatchedEvent", "watch"]

_SCHEMES = ("tcp://", "ipc://", "inproc://")
_STYLE = {"BlockStored": "green", "BlockRemoved": "red", "AllBlocksCleared": "yellow"}


@dataclass(frozen=True, slots=True)
class WatchedEvent:
    """One event off the wire, with the batch it came in."""

    seq: int
    ts: float
    dp_rank: int | None
    event: BlockStored | BlockRemoved | AllBlocksCleared

    def to_json(self) -> dict[str, Any]:
        event = self.event
        hashes = [] if isinstance(event, AllBlocksCleared) else event.block_hashes
        data: dict[str, Any] = {
            "seq": self.seq,
            "ts": self.ts if math.isfinite(self.ts) else None,  # JSON has no NaN
            "dp_rank": self.dp_rank,
            "type": type(event).__name__,
            "medium": None if isinstance(event, AllBlocksCleared) else event.medium,
            "num_blocks": len(hashes),
            "block_hashes": [hash_hex(h) for h in hashes],
        }
        if isinstance(event, BlockStored):
            parent = event.parent_block_hash
            data["parent_block_hash"] = None if parent is None else hash_hex(parent)
            data["block_size"] = event.block_size
            data["num_tokens"] = len(event.token_ids)
        return data


def hash_hex(block_hash: ExternalBlockHash) -> str:
    """Bytes hashes as hex; 64-bit int hashes as 16 hex digits."""
    if isinstance(block_hash, int):
        return f"{block_hash & ((1 << 64) - 1):016x}"
    return bytes(block_hash).hex()


def _events(seq: int, batch: KVEventBatch) -> Iterator[WatchedEvent]:
    for event in batch.events:
        yield WatchedEvent(seq, batch.ts, batch.data_parallel_rank, event)


def _open_subscriber(
    ctx: zmq.Context[zmq.Socket[bytes]], endpoint: str, topic: str
) -> zmq.Socket[bytes]:
    import zmq

    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.setsockopt(zmq.LINGER, 0)
    # A publisher given a non-wildcard tcp endpoint connects (vLLM's rule): then we bind.
    if "*" in endpoint or "::" in endpoint:
        sub.bind(endpoint)
    else:
        sub.connect(endpoint)
    return sub


def _clock(ts: float) -> str:
    """`HH:MM:SS.mmm` local time; `?` for a time no clock can show (NaN, out of range)."""
    try:
        return datetime.fromtimestamp(ts).strftime("%H:%M:%S.%f")[:-3]
    except (ValueError, OverflowError, OSError):
        return "?"


def _print_row(console: Console, watched: WatchedEvent) -> None:
    data = watched.to_json()
    kind = data["type"]
    first = data["block_hashes"][0][:16] if data["block_hashes"] else "-"
    clock = _clock(watched.ts)
    style = _STYLE.get(kind, "white")
    console.print(
        f"{watched.seq:>8}  {clock}  [{style}]{kind:<16}[/{style}]  "
        f"{escape(str(data['medium'] or '-')):<8}  {data['num_blocks']:>6}  {first}",
        highlight=False,
        soft_wrap=True,
    )


class _Printer:
    """Prints decoded messages (a table row or a JSON line per event) up to `count` events."""

    def __init__(self, count: int | None, as_json: bool, out: Console, err: Console) -> None:
        self.count = count
        self.as_json = as_json
        self.out = out
        self.err = err
        self.num_seen = 0
        self.num_bad = 0
        self.last_seq = -1

    @property
    def is_done(self) -> bool:
        return self.count is not None and self.num_seen >= self.count

    def message(self, seq: int, payload: bytes) -> None:
        """Print the events of one batch."""
        try:
            batch = decode_batch(payload)
        except ValueError as exc:
            self.bad(str(exc))
            return
        self.last_seq = seq
        for watched in _events(seq, batch):
            if self.is_done:
                return
            if self.as_json:
                sys.stdout.write(json.dumps(watched.to_json()) + "\n")
                sys.stdout.flush()
            else:
                _print_row(self.out, watched)
            self.num_seen += 1

    def bad(self, why: str) -> None:
        self.num_bad += 1
        self.err.print(f"[yellow]warning:[/yellow] undecodable message ({self.num_bad}): {why}")


@app.command()
def watch(
    endpoint: Annotated[
        str,
        typer.Argument(help="Events endpoint, e.g. tcp://127.0.0.1:5557 or ipc:///tmp/kv.sock."),
    ],
    topic: Annotated[str, typer.Option(help="Topic prefix to subscribe to ('' = all).")] = "",
    count: Annotated[
        int | None, typer.Option(min=1, help="Stop after this many events (exit 1 if fewer).")
    ] = None,
    timeout_s: Annotated[
        float | None,
        typer.Option(
            "--timeout-s", min=0.0, help="Stop after this many seconds without a message."
        ),
    ] = None,
    replay_endpoint: Annotated[
        str | None,
        typer.Option(help="The publisher's replay (ROUTER) endpoint: print buffered events first."),
    ] = None,
    from_seq: Annotated[
        int, typer.Option(min=0, help="With --replay-endpoint: the first sequence number wanted.")
    ] = 0,
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per event on stdout.")
    ] = False,
) -> None:
    """Subscribe to a KV-events stream (vLLM's wire format) and print each event as it comes."""
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    for name, value in (("ENDPOINT", endpoint), ("--replay-endpoint", replay_endpoint)):
        if value is not None and not value.startswith(_SCHEMES):
            raise typer.BadParameter(
                f"{value!r} is not a ZMQ endpoint; use one of {', '.join(_SCHEMES)}",
                param_hint=name,
            )
    printer = _Printer(count, as_json, Console(highlight=False), err)
    timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
    import zmq

    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        try:
            sub = _open_subscriber(ctx, endpoint, topic)  # first: live messages queue meanwhile
        except zmq.ZMQError as exc:
            err.print(f"[red]error:[/red] cannot subscribe to {endpoint}: {exc}")
            raise typer.Exit(2 if exc.errno == zmq.EINVAL else 1) from exc
        err.print(f"[dim]watching {endpoint} (topic {topic!r})[/dim]")
        if not as_json:
            printer.out.print(
                f"{'SEQ':>8}  {'TIME':<12}  {'TYPE':<16}  {'MEDIUM':<8}  {'BLOCKS':>6}  HASH"
            )
        if replay_endpoint is not None:
            _replay(ctx, replay_endpoint, from_seq, timeout_ms, printer)
        _follow(sub, timeout_ms, printer)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    finally:
        ctx.destroy(linger=0)
    if count is not None and printer.num_seen < count:
        seen = f"{printer.num_seen}/{count}"
        err.print(f"[red]error:[/red] timed out after {timeout_s} s with {seen} events")
        raise typer.Exit(1)


def _replay(
    ctx: zmq.Context[zmq.Socket[bytes]],
    endpoint: str,
    from_seq: int,
    timeout_ms: int | None,
    printer: _Printer,
) -> None:
    """Ask the publisher's ROUTER for its buffered batches from `from_seq`, until the end marker."""
    import zmq

    dealer = ctx.socket(zmq.DEALER)
    dealer.setsockopt(zmq.LINGER, 0)
    dealer.connect(endpoint)
    dealer.send_multipart((b"", from_seq.to_bytes(8, "big")))
    while dealer.poll(timeout_ms):
        frames = dealer.recv_multipart()  # b"", topic, seq, payload
        if len(frames) != 4:
            printer.bad(f"replay answer of {len(frames)} frames, expected 4")
            continue
        if frames[2] == END_SEQ:
            return
        printer.message(int.from_bytes(frames[2], "big"), frames[3])
    printer.err.print(f"[yellow]warning:[/yellow] no end of replay from {endpoint}")


def _follow(sub: zmq.Socket[bytes], timeout_ms: int | None, printer: _Printer) -> None:
    """Print live events until `count` or a silence of `timeout_ms`.

    Live batches the replay already printed (queued while it ran) are skipped, up to the first
    newer one; after that every batch prints (a restarted publisher counts from 0 again).
    """
    skip_through = printer.last_seq
    while not printer.is_done and sub.poll(timeout_ms):
        frames = sub.recv_multipart()
        if len(frames) != 3:
            printer.bad(f"{len(frames)} frames, expected 3")
            continue
        seq = int.from_bytes(frames[1], "big")
        if seq <= skip_through:
            continue
        skip_through = -1
        printer.message(seq, frames[2])
