"""vLLM's primary CPU tier as rows, for `LMDBTier`'s copies (`PrimarySlots`)."""

from __future__ import annotations

from kvstore.errors import ConfigError

__all__ = ["PrimarySlots"]


class PrimarySlots:
    """vLLM's primary CPU tier as rows: slot `c` is `strides[0]` bytes at `c * strides[0]`."""

    def __init__(self, view: memoryview) -> None:
        if view.ndim < 1 or view.strides is None or not view.c_contiguous:
            raise ConfigError(
                f"LMDBTier: the primary KV view must be a C-contiguous [num_slots, slot_bytes] "
                f"buffer, got ndim={view.ndim}, strides={view.strides}"
            )
        self.slot_bytes = int(view.strides[0])
        self.num_slots = int(view.shape[0]) if view.shape else 0
        if self.slot_bytes <= 0 or view.nbytes != self.num_slots * self.slot_bytes:
            raise ConfigError(
                f"LMDBTier: the primary KV view has {view.nbytes} bytes, not "
                f"{self.num_slots} slots x {self.slot_bytes} bytes"
            )
        self._flat = view.cast("B")

    def row(self, index: int) -> memoryview:
        start = index * self.slot_bytes
        return self._flat[start : start + self.slot_bytes]

    def release(self) -> None:
        self._flat.release()
