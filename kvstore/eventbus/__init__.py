"""The event bus and its sinks: internal events fanned out to vLLM, ZMQ, JSONL and memory.

bus = EventBus([ZMQPublisherSink("tcp://*:5557"), JSONLSink(path)], metrics=metrics)
await bus.start()
bus.publish(events)            # on the bus's loop; publish_threadsafe() elsewhere
errors = await bus.close(deadline_s=5.0)
"""

from __future__ import annotations

import importlib as _importlib
import typing as _typing

if _typing.TYPE_CHECKING:
    from kvstore.eventbus.bus import EventBus, SinkStats
    from kvstore.eventbus.jsonl import JSONLSink, event_to_json
    from kvstore.eventbus.memory import MemorySink
    from kvstore.eventbus.sink import EventSink
    from kvstore.eventbus.wire import (
        MEDIUM_BY_TIER,
        AllBlocksCleared,
        BlockRemoved,
        BlockStored,
        KVEventBatch,
        decode_batch,
        encode_batch,
        to_wire_events,
    )
    from kvstore.eventbus.zmq_sink import ZMQPublisherSink

# Names resolve on first use (PEP 562): `kvstore watch` reads `kvstore.eventbus.wire` without
# importing the bus, its sinks and asyncio.
_SOURCES = {
    "EventBus": "kvstore.eventbus.bus",
    "SinkStats": "kvstore.eventbus.bus",
    "JSONLSink": "kvstore.eventbus.jsonl",
    "event_to_json": "kvstore.eventbus.jsonl",
    "MemorySink": "kvstore.eventbus.memory",
    "EventSink": "kvstore.eventbus.sink",
    "MEDIUM_BY_TIER": "kvstore.eventbus.wire",
    "AllBlocksCleared": "kvstore.eventbus.wire",
    "BlockRemoved": "kvstore.eventbus.wire",
    "BlockStored": "kvstore.eventbus.wire",
    "KVEventBatch": "kvstore.eventbus.wire",
    "decode_batch": "kvstore.eventbus.wire",
    "encode_batch": "kvstore.eventbus.wire",
    "to_wire_events": "kvstore.eventbus.wire",
    "ZMQPublisherSink": "kvstore.eventbus.zmq_sink",
}


def __getattr__(name: str) -> _typing.Any:
    module = _SOURCES.get(name)
    if module is None:
        raise AttributeError(f"module 'kvstore.eventbus' has no attribute {name!r}")
    return getattr(_importlib.import_module(module), name)


__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "EventBus",
    "EventSink",
    "JSONLSink",
    "KVEventBatch",
    "MEDIUM_BY_TIER",
    "MemorySink",
    "SinkStats",
    "ZMQPublisherSink",
    "decode_batch",
    "encode_batch",
    "event_to_json",
    "to_wire_events",
]
