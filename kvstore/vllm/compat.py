"""What differs between the vLLM releases kvstore supports (0.32, 0.33, 0.34), in one place.

kvstore reads vLLM's objects by duck typing (a field read with a default where a release lacks
it), never by version number. The reads that need more than a `getattr` live here; the rest are
listed so that one file says what kvstore depends on in each release. README "Which vLLM"
summarises it for users; `make test-vllm-versions` runs the fast suite against each release.

Scheduler side (`KVStoreConnector` as vLLM's scheduler calls it):
- Resumed requests (preempted, then scheduled again): 0.32/0.33 send them in
  `scheduled_cached_reqs` with `resumed_req_ids` naming them and `new_block_ids` holding their
  whole block table; 0.34 dropped `resumed_req_ids` and sends them in `scheduled_new_reqs`,
  like new requests. `resumed_req_ids` below reads the set where it exists (empty otherwise);
  requests in `scheduled_new_reqs` always take their block table from there.
- `supports_sleep_mode(kv_transfer_config)`: a classmethod vLLM >= 0.33 calls with one
  argument when `enable_sleep_mode` is set (0.32 never calls it). kvstore answers False, so
  vLLM refuses the configuration with its own message ("... does not support sleep mode.");
  on 0.32 the connector's constructor refuses it with the same message.
- Requests that may not read external KV (`Request.skip_reading_prefix_cache` on 0.32/0.33,
  `skip_reading_external_kv` on 0.34, which also covers prompt-logprob requests): every
  release asks the connector and discards the answer; kvstore reads neither attribute, and the
  `update_state_after_alloc(..., 0)` that follows releases what the lookup held.
- `may_load_async(request)` (0.34, with `--max-num-inflight-kv-loads`): vLLM's default (the
  P/D `do_remote_prefill` flag) is right for kvstore: whether a hit loads asynchronously is
  only known at lookup (it depends on the step's sync-load budget), and a false positive
  would hold back other loads. Not overridden.
- `supports_lookahead_block_hashes` (0.34): default False, so vLLM keeps plain prefix hashes
  (`num_hash_lookahead_tokens == 0`), the keys kvstore stores under. Not overridden.
- `Request.all_token_ids` is a list (0.32/0.33) or a `TokenBuffer` whose slices are lists
  (0.34); kvstore only slices it.

Worker side:
- `unregister_kv_caches` / `restore_kv_caches` (0.33+): vLLM calls them around sleep, and in
  0.34 also when its extensible KV cache on CUDA releases and re-maps its physical memory
  (`release_kv_cache_memory`, a weight update borrowing the memory) - with sleep mode off.
  kvstore implements them (`ConnectorWorker.unregister_kv_caches`).
- `kv_cache_access` (0.34): default `IN_PROCESS` is right (kvstore copies with torch ops in
  the worker process), so the extensible KV cache stays on. Not overridden.
- Under speculative decoding the V2 model runner (0.33+) reads `get_finished` and
  `build_connector_worker_meta` *before* `wait_for_save` (which it runs after the drafter,
  `finalize_step`); 0.32 calls `wait_for_save` first. kvstore reports a store in the step
  after it completes either way, and keeps the request's blocks until then.
- 0.34 drives connectors only from the V2 model runner (`vllm/v1/worker/gpu/kv_connector.py`,
  and `vllm/v1/worker/cpu/kv_connector.py` for the CPU platform); kvstore uses only the hooks
  both runners call.

LMDBTier (vLLM's `SecondaryTierManager`):
- `touch(keys, req_context)` was dropped from the interface in 0.34; LMDBTier keeps it for
  0.32/0.33. On every release a load (which pins the chunk) refreshes its recency.
- `JobResult.deferred_release` (0.34): LMDBTier never reports a failed promotion while its
  I/O can still write the primary slots (a read is answered only once it has finished), so
  it leaves the field at its default, None.
- Failed stores feed 0.34's backpressure detector (`on_store_failed`) instead of its latency
  average; LMDBTier reports a store it could not write (queue full, disk down, no room) as
  failed, which only counts where the user configured a `failure_threshold`.

Events: `BlockStored.lookahead_token_ids` (0.33+) defaults to None, which is right for the
plain prefix hashes kvstore publishes (see `supports_lookahead_block_hashes`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

__all__ = ["resumed_req_ids"]


def resumed_req_ids(cached_reqs: Any) -> Collection[str]:
    """The requests of `scheduled_cached_reqs` (vLLM's `CachedRequestData`) whose
    `new_block_ids` replace their block table instead of extending it: those resumed after
    preemption on vLLM 0.32/0.33. Empty on 0.34, which sends resumed requests in
    `scheduled_new_reqs`."""
    resumed: Collection[str] | None = getattr(cached_reqs, "resumed_req_ids", None)
    return resumed if resumed is not None else ()
