"""`ChunkLayout.from_dict` on descriptions read back from a store: anything malformed, or whose
sections would not fit or align in the buffer, is a TierConfigError, never a torch error later."""

from __future__ import annotations

import math
from typing import Any

import pytest

from tiers.errors import TierConfigError
from tiers.layout import ChunkLayout, LayerLayout

GOOD = ChunkLayout(2, (LayerLayout("l0", "float32", (2,), (4,), 0),)).to_dict()


def with_layer(**changes: Any) -> dict[str, Any]:
    return {**GOOD, "buffer_bytes": None, "layers": [{**GOOD["layers"][0], **changes}]}


@pytest.mark.parametrize(
    "data",
    [
        with_layer(parts_shape=[-2]),
        with_layer(slab_shape=[4, -1]),
        with_layer(offset_bytes=2),  # not aligned to float32
        with_layer(offset_bytes=64),  # past the end of the buffer
        with_layer(offset_bytes=math.inf),
        with_layer(slab_shape=[True]),
        with_layer(slab_shape=["4"]),
        with_layer(name=7),
        with_layer(dtype=["float32"]),
        {**GOOD, "blocks_per_chunk": 0},
        {**GOOD, "blocks_per_chunk": 1.5},
        {**GOOD, "buffer_bytes": "many"},
        {**GOOD, "layers": 5},
        {**GOOD, "layers": ["l0"]},
        {**GOOD, "version": None},
    ],
    ids=repr,
)
def test_a_malformed_layout_is_a_config_error(data: dict[str, Any]) -> None:
    with pytest.raises(TierConfigError):
        ChunkLayout.from_dict(data)


def test_the_engine_layout_still_round_trips() -> None:
    assert ChunkLayout.from_dict(GOOD).to_dict() == GOOD
