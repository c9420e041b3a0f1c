"""Fuzz targets over everything kvstore parses that is not an LMDB record: the chunk layout and
namespace descriptors, the KV-events wire format as `kvstore watch` reads it, the JSONL trace
`kvstore simulate` reads, the remote tier's value header (what a Redis server hands back), and
the two config parsers (`kv_connector_extra_config` and the `LMDBTier` options, the latter only
where vLLM imports).

Strategies mix near-valid inputs (a real record with one field replaced by anything) with
arbitrary ones, since a parser's interesting failures sit just off its happy path.
"""

from __future__ import annotations

import io
import json
import math
import struct
import tempfile
from dataclasses import fields
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import strategies as st
from rich.console import Console

from kvstore.cli.watch import WatchedEvent, _print_row, _Printer
from kvstore.config import KVStoreConfig
from kvstore.errors import ConfigError, RecordError
from kvstore.eventbus.wire import decode_batch
from kvstore.namespace import NamespaceDescriptor, namespace_id
from kvstore.remote import codec
from kvstore.remote.errors import RemoteFormatError, RemoteValueError
from kvstore.simulate import TraceFormatError, load_trace
from reliability.checks import Crash, WrongData
from reliability.fuzz import FuzzTarget
from reliability.store_targets import msgpack_values
from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout, LayerLayout

__all__ = ["PARSER_TARGETS", "lmdb_tier_options_target", "near"]

_anything = msgpack_values | st.sampled_from([math.nan, math.inf, -math.inf, 1e308, -1, 0])


def near(valid: dict[str, Any]) -> st.SearchStrategy[dict[str, Any]]:
    """`valid` with up to three fields replaced by anything, dropped, or joined by junk."""
    keys = sorted(valid)
    edit = st.tuples(st.sampled_from([*keys, "junk"]), st.booleans(), _anything)

    def apply(edits: list[tuple[str, bool, Any]]) -> dict[str, Any]:
        data = dict(valid)
        for key, drop, value in edits:
            if drop:
                data.pop(key, None)
            else:
                data[key] = value
        return data

    return st.lists(edit, max_size=3).map(apply)


# -- chunk layout -------------------------------------------------------------------------------

_LAYOUT = ChunkLayout(
    2,
    (
        LayerLayout("l0", "bfloat16", (2,), (4, 8), 0),
        LayerLayout("l1", "float32", (), (3,), 256),
    ),
)


def _layer_edits() -> st.SearchStrategy[dict[str, Any]]:
    layer = _LAYOUT.to_dict()["layers"][0]
    return near(layer) | st.fixed_dictionaries(
        {
            "name": st.text(max_size=8),
            "dtype": st.sampled_from(["float16", "qint8", "bool", "complex64", "nope", "Tensor"]),
            "parts_shape": st.lists(st.integers(-2, 9), max_size=3),
            "slab_shape": st.lists(st.integers(-2, 9), max_size=3),
            "offset_bytes": st.integers(-8, 600),
        }
    )


_layouts = st.one_of(
    near(_LAYOUT.to_dict()),
    st.builds(
        lambda base, layers: {**base, "layers": layers},
        near(_LAYOUT.to_dict()),
        st.lists(_layer_edits() | _anything, max_size=3),
    ),
    _anything,
)


def _exercise_layout(data: Any) -> None:
    layout = ChunkLayout.from_dict(data)  # a Mapping is the contract; anything else must fail
    if layout.buffer_bytes <= 1 << 20:
        layout.decode(bytes(range(256)) * (layout.buffer_bytes // 256 + 1))


# -- namespace descriptor -----------------------------------------------------------------------

_DESCRIPTOR = NamespaceDescriptor(
    model="m",
    kv_dtype="bfloat16",
    engine_block_size=16,
    blocks_per_chunk=2,
    tp_size=1,
    device_type="cpu",
    attention_backend="TORCH_SDPA",
    hash_algo="sha256",
    row_bytes=4096,
    layout={"kv_cache_layout": "NHD", "layers": ["l0"]},
).to_dict()


def _exercise_descriptor(data: Any) -> None:
    descriptor = NamespaceDescriptor.from_dict(data)
    namespace_id(descriptor)
    json.dumps(descriptor.to_dict(), allow_nan=True)


# -- KV-events wire format, as `kvstore watch` prints it ------------------------------------------

_STORED = {
    "type": "BlockStored",
    "block_hashes": [1, b"\x01" * 8],
    "parent_block_hash": None,
    "token_ids": [1, 2],
    "block_size": 16,
    "lora_id": None,
    "medium": "CPU",
    "lora_name": None,
}
_events = near(_STORED) | near({"type": "BlockRemoved", "block_hashes": [3], "medium": "[red]"})
_batches = st.one_of(
    st.tuples(_anything, st.lists(_events | _anything, max_size=3), _anything).map(list),
    st.lists(_anything, max_size=4),
    _anything,
).map(msgspec.msgpack.encode)
_payloads = _batches | st.binary(max_size=64) | st.integers(1, 1200).map(lambda n: b"\x91" * n)


def _exercise_wire(payload: bytes) -> None:
    out, err = io.StringIO(), io.StringIO()
    printer = _Printer(None, False, Console(file=out), Console(file=err))
    printer.message(7, payload)  # the watch loop: a bad batch is a warning, never a crash
    for as_json in (True, False):
        try:
            batch = decode_batch(payload)
        except RecordError:
            return
        for event in batch.events:
            watched = WatchedEvent(7, batch.ts, batch.data_parallel_rank, event)
            if as_json:
                json.dumps(watched.to_json(), allow_nan=False)
            else:
                _print_row(Console(file=out), watched)


# -- JSONL trace (`kvstore simulate`) -------------------------------------------------------------

_lines = st.one_of(
    st.lists(st.integers(-5, 1 << 70), max_size=4).map(
        lambda ids: json.dumps({"prompt_token_ids": ids}).encode()
    ),
    _anything.map(lambda v: json.dumps(v, default=repr).encode()),
    st.binary(max_size=40),
    st.integers(1, 3000).map(lambda n: b"[" * n),
    st.just(b'{"prompt_token_ids": [1' + b"0" * 5000 + b"]}"),
)


def _exercise_trace(lines: list[bytes]) -> None:
    with tempfile.NamedTemporaryFile(suffix=".jsonl") as trace:
        trace.write(b"\n".join(lines))
        trace.flush()
        load_trace(Path(trace.name))


# -- remote value header (`kvstore.remote.codec`) -------------------------------------------------

_REMOTE_NS, _REMOTE_KEY = "00c0ffee00c0ffee", bytes(range(32))
_HEADER_FIELDS = [(4, "H"), (6, "H"), (8, "8s"), (16, "Q"), (24, "Q"), (32, "Q")]


@st.composite
def _remote_values(draw: st.DrawFn) -> tuple[bytes, bytes | None]:
    """A value as a server might return it, and the payload it was made from (None when the
    value was not made by `encode` at all)."""
    payload = draw(st.binary(max_size=300))
    value = bytearray(codec.encode(_REMOTE_NS, _REMOTE_KEY, payload))
    kind = draw(st.sampled_from(["flip", "cut", "extend", "field", "random", "magic"]))
    if kind == "flip":
        for _ in range(draw(st.integers(1, 4))):
            value[draw(st.integers(0, len(value) - 1))] ^= 1 << draw(st.integers(0, 7))
    elif kind == "cut":
        del value[draw(st.integers(0, len(value))) :]
    elif kind == "extend":
        value += draw(st.binary(min_size=1, max_size=64))
    elif kind == "field":
        offset, fmt = draw(st.sampled_from(_HEADER_FIELDS))
        size = struct.calcsize("<" + fmt)
        value[offset : offset + size] = draw(st.binary(min_size=size, max_size=size))
    elif kind == "random":
        return draw(st.binary(max_size=120)), None
    else:
        return codec.MAGIC + draw(st.binary(max_size=120)), None
    return bytes(value), payload


def _exercise_remote_value(case: tuple[bytes, bytes | None]) -> None:
    """Read the header, decode, decode into a buffer: a RemoteValueError, or the very payload
    that was encoded; and a value that decodes is refused under another namespace or key."""
    value, payload = case
    codec.read_header(value)
    got = bytes(codec.decode(_REMOTE_NS, _REMOTE_KEY, value))
    if payload is not None and got != payload:
        raise WrongData(f"decode returned {len(got)} bytes other than the {len(payload)} encoded")
    out = bytearray(len(got))
    codec.decode_into(_REMOTE_NS, _REMOTE_KEY, value, memoryview(out))
    if bytes(out) != got:
        raise WrongData("decode_into wrote other bytes than decode returned")
    for namespace, key in (("00c0ffee00c0fffe", _REMOTE_KEY), (_REMOTE_NS, _REMOTE_KEY[::-1])):
        try:
            codec.decode(namespace, key, value)
        except RemoteFormatError:
            continue
        raise WrongData(f"a value of {_REMOTE_NS} decoded under {namespace}/{key.hex()[:8]}")


# -- config ---------------------------------------------------------------------------------------

_CONFIG_KEYS = [f.name for f in fields(KVStoreConfig)]
_config_values = _anything | st.sampled_from(
    ["1e999", "inf", "-inf", "nan", "4GiB", "-1", "0", "\x00", "/tmp/x\x00y", "tcp://*:0"]
)


def _options(keys: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Keyword options as Python passes them: a dict with str keys."""
    return st.dictionaries(st.sampled_from(keys) | st.text(max_size=6), _config_values, max_size=6)


_extra_configs = (
    _options(_CONFIG_KEYS)
    | st.dictionaries(st.integers() | st.none() | st.text(max_size=3), _config_values, max_size=3)
    | _anything
)


def _exercise_config(extra: Any) -> None:
    """Parse; what is accepted must be usable later (no NaN or infinite time, no NUL path)."""
    config = KVStoreConfig.from_extra_config(extra)
    if not math.isfinite(config.shutdown_timeout_s):
        raise Crash(f"accepted shutdown_timeout_s={config.shutdown_timeout_s}")
    for path in (config.disk_path, config.region_dir, config.events_log):
        if path is not None and "\0" in str(path):
            raise Crash(f"accepted a path with a NUL character: {str(path)!r}")


def lmdb_tier_options_target() -> FuzzTarget | None:
    """`LMDBTierOptions.from_options` (importing it imports vLLM: None when vLLM is missing).
    Its input is `LMDBTier(**options)`'s keyword dict, so keys are always strings."""
    try:
        from kvstore.vllm.lmdb_tier.options import LMDBTierOptions
    except ImportError:
        return None
    keys = [f.name for f in fields(LMDBTierOptions)]
    return FuzzTarget(
        name="config: LMDBTier options",
        description="`secondary_tiers` options of LMDBTier (kvstore/vllm/lmdb_tier/options.py)",
        strategy=_options(keys),
        exercise=LMDBTierOptions.from_options,
        allowed=(ConfigError,),
    )


PARSER_TARGETS: tuple[FuzzTarget, ...] = (
    FuzzTarget(
        "chunk layout",
        "`ChunkLayout.from_dict` and `decode` (the CLI reads it from a descriptor)",
        _layouts,
        _exercise_layout,
        (TierConfigError,),
    ),
    FuzzTarget(
        "namespace descriptor",
        "`NamespaceDescriptor.from_dict`, `namespace_id`",
        near(_DESCRIPTOR) | _anything,
        _exercise_descriptor,
        (RecordError,),
    ),
    FuzzTarget(
        "KV-events wire batch",
        "`decode_batch` and `kvstore watch`'s rendering of what it decodes",
        _payloads,
        _exercise_wire,
        (RecordError,),
    ),
    FuzzTarget(
        "JSONL trace",
        "`load_trace` (`kvstore simulate TRACE`)",
        st.lists(_lines, max_size=4),
        _exercise_trace,
        (TraceFormatError,),
    ),
    FuzzTarget(
        "remote value header",
        "`kvstore.remote.codec.read_header`, `decode`, `decode_into` on what Redis returns",
        _remote_values(),
        _exercise_remote_value,
        (RemoteValueError,),
    ),
    FuzzTarget(
        "config: kv_connector_extra_config",
        "`KVStoreConfig.from_extra_config`",
        _extra_configs,
        _exercise_config,
        (ConfigError,),
    ),
)
