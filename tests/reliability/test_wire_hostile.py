"""The KV-events wire decoder and `kvstore watch` on hostile batches: a RecordError (a warning
in `watch`), never a RecursionError; a timestamp no clock can show prints `?` or JSON null."""

from __future__ import annotations

import io
import json

import msgspec
import pytest
from rich.console import Console

from kvstore.cli.watch import WatchedEvent, _print_row, _Printer
from kvstore.errors import RecordError
from kvstore.eventbus.wire import BlockRemoved, decode_batch, encode_batch


def nested_batch(depth: int) -> bytes:
    """A BlockStored whose `extra_keys` nest `depth` arrays deep."""
    event = msgspec.msgpack.encode(
        {
            "type": "BlockStored",
            "block_hashes": [1],
            "parent_block_hash": None,
            "token_ids": [],
            "block_size": 16,
            "lora_id": None,
            "medium": "CPU",
            "lora_name": None,
        }
    )
    event = bytes([event[0] + 1]) + event[1:]  # one more map entry: extra_keys
    event += msgspec.msgpack.encode("extra_keys") + b"\x91" + b"\x91" * depth + b"\x01"
    return b"\x92" + msgspec.msgpack.encode(1.0) + b"\x91" + event


def test_a_batch_nested_too_deep_is_a_record_error() -> None:
    with pytest.raises(RecordError, match="malformed KV-event batch"):
        decode_batch(nested_batch(5000))


def test_watch_warns_about_a_batch_nested_too_deep() -> None:
    err = io.StringIO()
    printer = _Printer(None, False, Console(file=io.StringIO()), Console(file=err))
    printer.message(1, nested_batch(5000))
    assert printer.num_bad == 1
    assert "undecodable message" in err.getvalue()


@pytest.mark.parametrize("ts", [float("nan"), float("inf"), 1e300, -1e300])
def test_watch_prints_a_time_no_clock_can_show(ts: float) -> None:
    batch = decode_batch(encode_batch([BlockRemoved(block_hashes=[7], medium="CPU")], ts=ts))
    watched = WatchedEvent(3, batch.ts, None, batch.events[0])
    out = io.StringIO()
    _print_row(Console(file=out, width=200), watched)
    assert "BlockRemoved" in out.getvalue()
    document = json.loads(json.dumps(watched.to_json(), allow_nan=False))
    assert document["ts"] is None or document["ts"] == ts
