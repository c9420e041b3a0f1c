"""The index's invariants, checked in full (O(entries)): for tests and debugging."""

from __future__ import annotations

from collections.abc import Mapping, Set

from kvstore.index.errors import InvariantError
from kvstore.index.table import READY, REMOVING, STORING, CPUTable, DiskTable, TierTable
from kvstore.keys import BlockKey, short_hex

__all__ = ["check_index"]


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise InvariantError(message)


def check_table(table: TierTable) -> None:
    """Accounting, counters and policy membership of one tier."""
    tier = table.tier
    entries = table.entries.values()
    _require(
        table.used_bytes + table.free_bytes == table.capacity_bytes,
        f"{tier}: used {table.used_bytes} + free {table.free_bytes} != capacity "
        f"{table.capacity_bytes}",
    )
    _require(
        0 <= table.used_bytes <= table.capacity_bytes,
        f"{tier}: used {table.used_bytes} bytes outside [0, {table.capacity_bytes}]",
    )
    used_bytes = sum(entry.size_bytes for entry in entries)
    _require(
        used_bytes == table.used_bytes,
        f"{tier}: entries hold {used_bytes} bytes, accounted {table.used_bytes}",
    )
    _check_entries(table)


def _check_entries(table: TierTable) -> None:
    """Counters, states and policy membership agree with the entries."""
    tier = table.tier
    entries = table.entries.values()
    counts = {
        "num_storing": sum(entry.state is STORING for entry in entries),
        "num_removing": sum(entry.state is REMOVING for entry in entries),
        "num_pinned": sum(entry.num_pins > 0 for entry in entries),
        "num_evictable": sum(entry.state is READY and entry.num_pins == 0 for entry in entries),
    }
    for name, count in counts.items():
        _require(
            getattr(table, name) == count,
            f"{tier}: {name} is {getattr(table, name)}, entries say {count}",
        )
    for key, entry in table.entries.items():
        _require(
            key == entry.key, f"{tier}: entry {short_hex(entry.key)} filed under {short_hex(key)}"
        )
        _require(entry.num_pins >= 0, f"{tier}: {short_hex(key)} has {entry.num_pins} pins")
        _require(
            entry.state is not REMOVING or entry.num_pins > 0,
            f"{tier}: {short_hex(key)} is removing but unpinned (should have been freed)",
        )
        in_policy = key in table.policy
        _require(
            in_policy == (entry.state is not REMOVING),
            f"{tier}: {short_hex(key)} ({entry.state}) policy membership is {in_policy}",
        )
    num_in_policy = len(table.entries) - counts["num_removing"]
    _require(
        len(table.policy) == num_in_policy,
        f"{tier}: policy holds {len(table.policy)} keys, the tier {num_in_policy}",
    )


def check_rows(cpu: CPUTable) -> None:
    """Every row is owned by exactly one entry or free."""
    owned = [entry.row for entry in cpu.entries.values()]
    _require(len(set(owned)) == len(owned), "cpu: a row is owned by two entries")
    free = cpu.free_rows
    _require(len(set(free)) == len(free), "cpu: a row is on the free list twice")
    _require(not set(owned) & set(free), "cpu: a row is both owned and free")
    _require(
        set(owned) | set(free) == set(range(cpu.num_rows)),
        f"cpu: owned and free rows do not make up range({cpu.num_rows})",
    )


def check_index(
    cpu: CPUTable,
    disk: DiskTable | None,
    holds: Mapping[BlockKey, int],
    promoting: Set[BlockKey],
) -> None:
    check_table(cpu)
    check_rows(cpu)
    if disk is not None:
        check_table(disk)
    for key, num_holds in holds.items():
        entry = cpu.entries.get(key)
        _require(entry is not None, f"held chunk {short_hex(key)} is not in cpu")
        assert entry is not None
        _require(
            num_holds >= 1 and entry.num_pins >= num_holds,
            f"{short_hex(key)}: {num_holds} holds but {entry.num_pins} pins",
        )
    for key in promoting:
        cpu_entry = cpu.entries.get(key)
        disk_entry = None if disk is None else disk.entries.get(key)
        _require(
            cpu_entry is not None and cpu_entry.state is STORING,
            f"promoting chunk {short_hex(key)} has no storing cpu entry",
        )
        _require(
            disk_entry is not None and disk_entry.num_pins > 0,
            f"promoting chunk {short_hex(key)} has no pinned disk entry",
        )
    if disk is not None:
        for key, entry in disk.entries.items():
            if entry.state is STORING:
                cpu_entry = cpu.entries.get(key)
                _require(
                    cpu_entry is not None and cpu_entry.num_pins > 0,
                    f"disk write of {short_hex(key)} in flight without a pinned cpu row",
                )
