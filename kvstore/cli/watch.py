"""`kvstore watch ENDPOINT`: follow a KV-events stream (kvstore's or vLLM's own) live."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any

import typer
import zmq
from rich.console import Console
from rich.markup import escape

from kvstore.cli.app import app
from kvstore.eventbus.wire import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    ExternalBlockHash,
    KVEventBatch,
    decode_batch,
)

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
            "ts": self.ts,
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
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, topic.encode())
    sub.setsockopt(zmq.LINGER, 0)
    # A publisher given a non-wildcard tcp endpoint connects (vLLM's rule): then we bind.
    if "*" in endpoint or "::" in endpoint:
        sub.bind(endpoint)
    else:
        sub.connect(endpoint)
    return sub


def _print_row(console: Console, watched: WatchedEvent) -> None:
    data = watched.to_json()
    kind = data["type"]
    first = data["block_hashes"][0][:16] if data["block_hashes"] else "-"
    clock = datetime.fromtimestamp(watched.ts).strftime("%H:%M:%S.%f")[:-3]
    style = _STYLE.get(kind, "white")
    console.print(
        f"{watched.seq:>8}  {clock}  [{style}]{kind:<16}[/{style}]  "
        f"{escape(str(data['medium'] or '-')):<8}  {data['num_blocks']:>6}  {first}",
        highlight=False,
        soft_wrap=True,
    )


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
    as_json: Annotated[
        bool, typer.Option("--json", help="One JSON object per event on stdout.")
    ] = False,
) -> None:
    """Subscribe to a KV-events stream (vLLM's wire format) and print each event as it comes."""
    err = Console(stderr=True, soft_wrap=True, highlight=False)
    if not endpoint.startswith(_SCHEMES):
        raise typer.BadParameter(
            f"{endpoint!r} is not a ZMQ endpoint; use one of {', '.join(_SCHEMES)}",
            param_hint="ENDPOINT",
        )
    out = Console(highlight=False)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        try:
            sub = _open_subscriber(ctx, endpoint, topic)
        except zmq.ZMQError as exc:
            err.print(f"[red]error:[/red] cannot subscribe to {endpoint}: {exc}")
            raise typer.Exit(2 if exc.errno == zmq.EINVAL else 1) from exc
        err.print(f"[dim]watching {endpoint} (topic {topic!r})[/dim]")
        if not as_json:
            out.print(f"{'SEQ':>8}  {'TIME':<12}  {'TYPE':<16}  {'MEDIUM':<8}  {'BLOCKS':>6}  HASH")
        num_seen = _follow(sub, count, timeout_s, as_json, out, err)
    except KeyboardInterrupt:
        raise typer.Exit(0) from None
    finally:
        ctx.destroy(linger=0)
    if count is not None and num_seen < count:
        err.print(f"[red]error:[/red] timed out after {timeout_s} s with {num_seen}/{count} events")
        raise typer.Exit(1)


def _follow(
    sub: zmq.Socket[bytes],
    count: int | None,
    timeout_s: float | None,
    as_json: bool,
    out: Console,
    err: Console,
) -> int:
    """Print events until `count` or a silence of `timeout_s`; returns how many were printed."""
    num_seen = 0
    num_bad = 0
    timeout_ms = None if timeout_s is None else int(timeout_s * 1000)
    while count is None or num_seen < count:
        if not sub.poll(timeout_ms):
            break
        frames = sub.recv_multipart()
        try:
            if len(frames) != 3:
                raise ValueError(f"{len(frames)} frames, expected 3")
            seq = int.from_bytes(frames[1], "big")
            batch = decode_batch(frames[2])
        except ValueError as exc:
            num_bad += 1
            err.print(f"[yellow]warning:[/yellow] undecodable message ({num_bad} so far): {exc}")
            continue
        for watched in _events(seq, batch):
            if as_json:
                sys.stdout.write(json.dumps(watched.to_json()) + "\n")
                sys.stdout.flush()
            else:
                _print_row(out, watched)
            num_seen += 1
            if count is not None and num_seen >= count:
                break
    return num_seen
