"""`NamespaceDescriptor.from_dict` on a descriptor read back from a store: a missing field or a
value of the wrong type is a RecordError naming the field, never a TypeError."""

from __future__ import annotations

from typing import Any

import pytest

from kvstore.errors import RecordError
from kvstore.namespace import NamespaceDescriptor, namespace_id

GOOD = NamespaceDescriptor(
    model="m",
    kv_dtype="bfloat16",
    engine_block_size=16,
    blocks_per_chunk=2,
    tp_size=1,
    device_type="cpu",
    attention_backend="TORCH_SDPA",
    hash_algo="sha256",
    row_bytes=4096,
    layout={"kv_cache_layout": "NHD"},
).to_dict()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"model": None}, "model"),
        ({"tp_size": "1"}, "tp_size"),
        ({"row_bytes": True}, "row_bytes"),
        ({"layout": [1]}, "layout"),
        ({"layout": {"x": b"\x00"}}, "layout"),
        ({"layout": {1: "x", "a": "y"}}, "layout"),
        ({"salt": 3}, "salt"),
    ],
)
def test_a_field_of_the_wrong_type_is_a_record_error(change: dict[str, Any], field: str) -> None:
    with pytest.raises(RecordError, match=field):
        NamespaceDescriptor.from_dict({**GOOD, **change})


def test_a_missing_field_is_a_record_error_naming_it() -> None:
    data = dict(GOOD)
    del data["hash_algo"]
    with pytest.raises(RecordError, match="no 'hash_algo' field"):
        NamespaceDescriptor.from_dict(data)


@pytest.mark.parametrize("data", [None, [1, 2], "descriptor", 5])
def test_a_descriptor_that_is_no_mapping_is_a_record_error(data: Any) -> None:
    with pytest.raises(RecordError, match="mapping"):
        NamespaceDescriptor.from_dict(data)


def test_a_good_descriptor_round_trips_with_its_id() -> None:
    descriptor = NamespaceDescriptor.from_dict(GOOD)
    assert namespace_id(descriptor) == GOOD["namespace_id"]
