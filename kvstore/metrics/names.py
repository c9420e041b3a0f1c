"""Every metric name kvstore exports, as it appears on the wire (counters with `_total`).

The dashboard lint test checks each Grafana query against `METRIC_NAMES`; a test checks that a
fresh registry exports exactly these.
"""

from __future__ import annotations

__all__ = [
    "BUILD_INFO",
    "CHECKSUM_FAILURES",
    "CONFIG_INFO",
    "CPU_CAPACITY_ROWS",
    "CPU_USED_ROWS",
    "EVICTED_CHUNKS",
    "HIT_CHUNKS",
    "HIT_TOKENS",
    "IO_ERRORS",
    "HYBRID_MANAGER_OFF",
    "KEYS_STABLE",
    "LOAD_AUDIT_CHUNKS",
    "LOAD_FAILED_CHUNKS",
    "LOOKUPS",
    "LOOKUP_CHUNKS",
    "LOOKUP_TOKENS",
    "METRIC_NAMES",
    "QUEUE_CAPACITY",
    "QUEUE_DEPTH",
    "QUEUE_DROPPED",
    "REMOTE_BREAKER_NODES",
    "REMOTE_ROUND_TRIP_SECONDS",
    "REMOVED_CHUNKS",
    "SERVE_METRIC_NAMES",
    "SINK_DROPPED_EVENTS",
    "PIPELINE_INFLIGHT",
    "SINK_ERRORS",
    "SINK_WRITTEN_EVENTS",
    "STORED_CHUNKS",
    "STORE_FILE_BYTES",
    "STORE_NAMESPACES",
    "TIER_CAPACITY_BYTES",
    "TIER_ENTRIES",
    "TIER_UP",
    "TIER_USED_BYTES",
    "TRANSFERS",
    "TRANSFER_BYTES",
    "TRANSFER_DURATION_SECONDS",
    "TRANSFER_SIZE_BYTES",
]

# Lookups (one per vLLM `get_num_new_matched_tokens`), and what they found per tier.
LOOKUPS = "kvstore_lookups_total"
LOOKUP_CHUNKS = "kvstore_lookup_chunks_total"
LOOKUP_TOKENS = "kvstore_lookup_tokens_total"
HIT_CHUNKS = "kvstore_hit_chunks_total"  # {tier}
HIT_TOKENS = "kvstore_hit_tokens_total"  # {tier}

# Placement, from the internal events.
STORED_CHUNKS = "kvstore_stored_chunks_total"  # {tier}
REMOVED_CHUNKS = "kvstore_removed_chunks_total"  # {tier, reason}
EVICTED_CHUNKS = "kvstore_evicted_chunks_total"  # {tier}

# Transfers.
TRANSFERS = "kvstore_transfers_total"  # {direction, result}
TRANSFER_BYTES = "kvstore_transfer_bytes_total"  # {direction}
TRANSFER_DURATION_SECONDS = "kvstore_transfer_duration_seconds"  # histogram {direction}
TRANSFER_SIZE_BYTES = "kvstore_transfer_size_bytes"  # histogram {direction}

# Occupancy.
TIER_USED_BYTES = "kvstore_tier_used_bytes"  # {tier}
TIER_CAPACITY_BYTES = "kvstore_tier_capacity_bytes"  # {tier}
TIER_ENTRIES = "kvstore_tier_entries"  # {tier}
TIER_UP = "kvstore_tier_up"  # {tier}: 1 serving, 0 down (its I/O task died for good)
CPU_USED_ROWS = "kvstore_cpu_used_rows"
CPU_CAPACITY_ROWS = "kvstore_cpu_capacity_rows"

# Queues and event sinks.
QUEUE_DEPTH = "kvstore_queue_depth"  # {queue}
QUEUE_CAPACITY = "kvstore_queue_capacity"  # {queue}
QUEUE_DROPPED = "kvstore_queue_dropped_total"  # {queue, reason}
SINK_WRITTEN_EVENTS = "kvstore_sink_written_events_total"  # {sink}
SINK_DROPPED_EVENTS = "kvstore_sink_dropped_events_total"  # {sink, reason}
SINK_ERRORS = "kvstore_sink_errors_total"  # {sink}
# {what}: cpu_pins, disk_pins, holds, promoting, jobs, tracked_requests (a leak grows one of them)
PIPELINE_INFLIGHT = "kvstore_pipeline_inflight"

# The remote tier (Redis).
REMOTE_ROUND_TRIP_SECONDS = "kvstore_remote_round_trip_seconds"  # histogram {op, result}
REMOTE_BREAKER_NODES = "kvstore_remote_breaker_nodes"  # {state}: closed, half_open, open

# Errors.
CHECKSUM_FAILURES = "kvstore_checksum_failures_total"  # {tier}
IO_ERRORS = "kvstore_io_errors_total"  # {op}
LOAD_FAILED_CHUNKS = "kvstore_load_failed_chunks_total"
LOAD_AUDIT_CHUNKS = "kvstore_load_audit_chunks_total"  # {result}: verified, mismatched, unknown
LOAD_DECISIONS = "kvstore_load_decisions_total"  # {tier, decision}: load, recompute, gave_up

# Identity.
KEYS_STABLE = "kvstore_keys_stable"
HYBRID_MANAGER_OFF = "kvstore_hybrid_manager_off"
BUILD_INFO = "kvstore_build_info"  # {version, python_version}
CONFIG_INFO = "kvstore_config_info"  # {<config key>...}

# The store file itself (the engine's exporter and `kvstore serve`).
STORE_FILE_BYTES = "kvstore_store_file_bytes"
STORE_NAMESPACES = "kvstore_store_namespaces"

METRIC_NAMES: tuple[str, ...] = (
    LOOKUPS,
    LOOKUP_CHUNKS,
    LOOKUP_TOKENS,
    HIT_CHUNKS,
    HIT_TOKENS,
    STORED_CHUNKS,
    REMOVED_CHUNKS,
    EVICTED_CHUNKS,
    TRANSFERS,
    TRANSFER_BYTES,
    TRANSFER_DURATION_SECONDS,
    TRANSFER_SIZE_BYTES,
    TIER_USED_BYTES,
    TIER_CAPACITY_BYTES,
    TIER_ENTRIES,
    TIER_UP,
    CPU_USED_ROWS,
    CPU_CAPACITY_ROWS,
    QUEUE_DEPTH,
    QUEUE_CAPACITY,
    QUEUE_DROPPED,
    SINK_WRITTEN_EVENTS,
    SINK_DROPPED_EVENTS,
    SINK_ERRORS,
    PIPELINE_INFLIGHT,
    REMOTE_ROUND_TRIP_SECONDS,
    REMOTE_BREAKER_NODES,
    CHECKSUM_FAILURES,
    IO_ERRORS,
    LOAD_FAILED_CHUNKS,
    LOAD_AUDIT_CHUNKS,
    LOAD_DECISIONS,
    KEYS_STABLE,
    HYBRID_MANAGER_OFF,
    BUILD_INFO,
    CONFIG_INFO,
    STORE_FILE_BYTES,
    STORE_NAMESPACES,
)
"""Every metric name kvstore defines (the engine exporter's and `kvstore serve`'s)."""

SERVE_METRIC_NAMES: tuple[str, ...] = (
    TIER_USED_BYTES,
    TIER_CAPACITY_BYTES,
    TIER_ENTRIES,
    STORE_FILE_BYTES,
    STORE_NAMESPACES,
    BUILD_INFO,
)
"""What `kvstore serve` exports (the disk tier's occupancy and the store file)."""
