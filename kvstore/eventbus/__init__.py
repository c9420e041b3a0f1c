"""The event bus and its sinks: internal events fanned out to vLLM, ZMQ, JSONL and memory.

bus = EventBus([ZMQPublisherSink("tcp://*:5557"), JSONLSink(path)], metrics=metrics)
await bus.start()
bus.publish(events)            # on the bus's loop; publish_threadsafe() elsewhere
errors = await bus.close(deadline_s=5.0)
"""

from __future__ import annotations

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
