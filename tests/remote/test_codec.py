"""The value format and keys, without a server."""

from __future__ import annotations

import struct

import pytest
import xxhash

from kvstore.remote import codec
from kvstore.remote.errors import (
    RemoteCorruptError,
    RemoteFormatError,
    RemoteValueError,
    RemoteVersionError,
)

NS = "0123456789abcdef"
OTHER_NS = "fedcba9876543210"
KEY = b"\x01\x02\x03\x04"
PAYLOAD = bytes(range(256)) * 64


def test_round_trip_into_a_buffer() -> None:
    value = codec.encode(NS, KEY, PAYLOAD)
    assert len(value) == codec.HEADER.size + len(PAYLOAD) == 40 + len(PAYLOAD)
    out = bytearray(len(PAYLOAD))
    assert codec.decode_into(NS, KEY, value, memoryview(out)) == len(PAYLOAD)
    assert out == PAYLOAD
    assert codec.decode(NS, KEY, value) == PAYLOAD


def test_header_fields() -> None:
    header = codec.read_header(codec.encode(NS, KEY, PAYLOAD))
    assert header.version == codec.VALUE_FORMAT_VERSION
    assert header.namespace_id == NS
    assert header.payload_bytes == len(PAYLOAD)
    assert header.payload_xxh64 == xxhash.xxh64_intdigest(PAYLOAD)
    assert header.key_xxh64 == xxhash.xxh64_intdigest(KEY)


def test_encode_accepts_typed_memoryviews() -> None:
    import numpy as np

    array = np.arange(1024, dtype=np.float16)
    value = codec.encode(NS, KEY, memoryview(array))
    out = np.zeros_like(array)
    codec.decode_into(NS, KEY, value, memoryview(out))
    assert (out == array).all()


@pytest.mark.parametrize("offset", [codec.HEADER.size, codec.HEADER.size + 100, -1])
def test_a_flipped_payload_byte_is_corrupt(offset: int) -> None:
    value = bytearray(codec.encode(NS, KEY, PAYLOAD))
    value[offset] ^= 0x01
    with pytest.raises(RemoteCorruptError, match="xxh64"):
        codec.decode(NS, KEY, value)


def test_a_flipped_checksum_byte_is_corrupt() -> None:
    value = bytearray(codec.encode(NS, KEY, PAYLOAD))
    value[33] ^= 0x80
    with pytest.raises(RemoteCorruptError):
        codec.decode(NS, KEY, value)


@pytest.mark.parametrize("length", [10, codec.HEADER.size, codec.HEADER.size + 1000])
def test_a_truncated_value_is_corrupt(length: int) -> None:
    value = codec.encode(NS, KEY, PAYLOAD)[:length]
    with pytest.raises(RemoteCorruptError, match=r"truncated|bytes"):
        codec.decode(NS, KEY, value)


def test_extra_bytes_are_corrupt() -> None:
    with pytest.raises(RemoteCorruptError, match="header says"):
        codec.decode(NS, KEY, codec.encode(NS, KEY, PAYLOAD) + b"x")


def test_another_namespace_is_a_format_error() -> None:
    value = codec.encode(OTHER_NS, KEY, PAYLOAD)
    with pytest.raises(RemoteFormatError, match=f"namespace {OTHER_NS}"):
        codec.decode(NS, KEY, value)


def test_another_key_is_a_format_error() -> None:
    value = codec.encode(NS, b"other", PAYLOAD)
    with pytest.raises(RemoteFormatError, match="another chunk"):
        codec.decode(NS, KEY, value)


def test_a_newer_version_is_a_version_error() -> None:
    value = bytearray(codec.encode(NS, KEY, PAYLOAD))
    struct.pack_into("<H", value, 4, codec.VALUE_FORMAT_VERSION + 1)
    with pytest.raises(RemoteVersionError, match="newer"):
        codec.decode(NS, KEY, value)
    assert issubclass(RemoteVersionError, RemoteFormatError)


def test_bad_magic_is_a_format_error() -> None:
    with pytest.raises(RemoteFormatError, match="magic"):
        codec.decode(NS, KEY, b"\x80\x04pickle" + PAYLOAD)


def test_a_buffer_of_another_size_is_refused() -> None:
    value = codec.encode(NS, KEY, PAYLOAD)
    out = bytearray(len(PAYLOAD) - 1)
    with pytest.raises(RemoteFormatError, match="destination holds"):
        codec.decode_into(NS, KEY, value, memoryview(out))
    assert out == bytearray(len(PAYLOAD) - 1)  # untouched


def test_every_value_error_is_a_remote_value_error() -> None:
    for error in (RemoteCorruptError, RemoteFormatError, RemoteVersionError):
        assert issubclass(error, RemoteValueError)


def test_keys() -> None:
    redis_key = codec.chunk_key(NS, KEY)
    assert redis_key == f"kvstore:{NS}:01020304".encode()
    assert codec.descriptor_key(NS) == f"kvstore:{NS}:descriptor".encode()
    assert codec.parse_chunk_key(NS, redis_key) == KEY
    assert codec.parse_chunk_key(OTHER_NS, redis_key) is None
    assert codec.parse_chunk_key(NS, codec.descriptor_key(NS)) is None
    assert codec.split_key(codec.descriptor_key(NS)) == (NS, None)
    assert codec.split_key(b"kvstore:zz:0102") is None
    assert codec.split_key(f"kvstore:{NS}:0g".encode()) is None
    assert codec.split_key(b"other:key") is None
    assert codec.namespace_pattern(NS) == f"kvstore:{NS}:*".encode()
    assert codec.namespace_pattern() == b"kvstore:*"


@pytest.mark.parametrize("bad", ["", "0123", "0123456789ABCDEF", "0123456789abcdeg", "x" * 16])
def test_a_bad_namespace_id_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="16 lowercase hex"):
        codec.chunk_key(bad, KEY)
