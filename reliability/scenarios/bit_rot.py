"""Scenario 2, bit rot: random bits flipped in random values of a live store, between engine runs
and while the engine runs, by a process other than the engine (through LMDB, as a disk or a
stray writer would leave them: the per-key checksum untouched).

Each round is one engine run on the store: values flipped before it starts; it serves the
prompts of earlier rounds (their chunks come from disk); it serves new prompts, whose chunks
are written through; those values are flipped while it serves other prompts (which also push
them out of the small CPU tier); it serves the new prompts again, so every one of those values
is read back from disk. The load audit compares every chunk loaded with what this engine
computed, so a flipped value that slipped through would be a mismatch, and every sequence is
checked against the run without kvstore. Afterwards `kvstore verify` finds the flipped values
the engine never read; `--repair` clears them for the next round.

Every flip must end up in exactly one place: detected by the engine on read (a checksum
failure counted, the chunk removed as corrupt, the request recomputed) or, never read, found
by verify.
"""

from __future__ import annotations

import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from reliability.engines import CHUNK_BYTES, CHUNK_TOKENS, EngineHost, TokenOracle
from reliability.engines import shared_prefix_prompts as prompts_of
from reliability.registry import Outcome, RunContext, scenario
from reliability.store_checks import (
    Flip,
    ancestors,
    flip_values,
    removed_keys,
    store_keys,
    verify_store,
)

__all__ = ["bit_rot"]

_MAX_TOKENS = 8
_NEW = 4  # new prompts per round
_FLIPS = 6  # values flipped before each run, and again while it runs


@dataclass(slots=True)
class _Rot:
    ctx: RunContext
    rng: random.Random
    oracle: TokenOracle
    model: str
    old: list[list[int]]
    new: list[list[int]]
    found: list[str] = field(default_factory=list)
    figures: dict[str, int] = field(default_factory=dict)

    @property
    def store(self) -> Path:
        return self.ctx.workdir / "store"

    def extra(self, label: str) -> dict[str, Any]:
        return {
            "cpu_bytes": 16 * CHUNK_BYTES,  # small: loads come from disk
            "disk_path": str(self.store),
            "disk_bytes": 4096 * CHUNK_BYTES,
            "region_dir": str(self.ctx.workdir / "shm"),
            "events_log": str(self.ctx.workdir / f"events-{label}.jsonl"),
            "audit_loads": True,
        }

    def add(self, name: str, amount: int = 1) -> None:
        self.figures[name] = self.figures.get(name, 0) + amount

    def serve(self, host: EngineHost, prompts: list[list[int]]) -> dict[str, Any]:
        answer = host.call({"op": "generate", "prompts": prompts, "max_tokens": _MAX_TOKENS})
        self.oracle.check(prompts, answer)
        return answer


def _log(message: str) -> None:
    print(f"bit-rot: {message}", file=sys.stderr, flush=True)


def _round(rot: _Rot, host: EngineHost, number: int) -> None:
    kept = store_keys(rot.store)
    before = flip_values(rot.store, _FLIPS, rot.rng)
    host.call({"op": "engine", "model": rot.model, "extra": rot.extra(str(number))})
    old = rot.rng.sample(rot.old, min(12, len(rot.old)))
    for start in range(0, len(old), 4):
        rot.serve(host, old[start : start + 4])
    # drained first: a chunk found corrupt above is rewritten once recomputed, and were that
    # rewrite to land after `known`, it could be flipped again below as a "new" chunk
    host.call({"op": "summary"})
    known = store_keys(rot.store)
    new = [rot.new.pop() for _ in range(_NEW)]
    for prompt in new:  # one at a time: each fits the CPU tier, so every chunk is written
        rot.serve(host, [prompt])
    host.call({"op": "summary"})  # their chunks are on disk now
    written = frozenset(store_keys(rot.store) - known)
    filler = rot.rng.sample(rot.old, min(8, len(rot.old)))  # pushes them out of the CPU tier
    host.send({"op": "generate", "prompts": filler[:4], "max_tokens": _MAX_TOKENS})
    time.sleep(rot.rng.uniform(0.0, 0.3))
    live = flip_values(rot.store, _FLIPS, rot.rng, only=written)
    rot.oracle.check(filler[:4], host.receive(180.0))
    rot.serve(host, filler[4:])
    for prompt in new:  # every live-flipped value is read back from disk
        rot.serve(host, [prompt])
    rot.old.extend(new)
    report = host.call({"op": "summary"})
    host.call({"op": "close"})
    _tally(rot, number, kept, before, live, report["summary"])


def _tally(
    rot: _Rot, number: int, kept: set[str], before: list[Flip], live: list[Flip],
    summary: dict[str, Any],
) -> None:  # fmt: skip
    label = f"round {number}"
    flipped = {flip.chunk_hex for flip in before + live}
    lost = (kept - flipped) - store_keys(rot.store)
    rot.add("chunks_lost", len(lost))
    if lost:
        rot.found.append(f"{label}: {len(lost)} chunks nobody flipped are gone from disk")
    log = rot.ctx.workdir / f"events-{number}.jsonl"
    detected = removed_keys(log, "corrupt")
    unread = _behind_a_failed_chunk({f.chunk_hex for f in live} - detected, detected, log)
    rot.add("flipped_while_serving", len(live))
    rot.add("flipped_while_serving_unread_behind_a_failed_chunk", len(unread))
    live_read = {flip.chunk_hex for flip in live} - unread
    _account(rot, label, summary, flipped, live_read, detected)


def _behind_a_failed_chunk(keys: set[str], detected: set[str], log: Path) -> set[str]:
    """The `keys` with a detected chunk before them in their prompt: the load stopped at that
    chunk, so these were never read (a miss from there on), and stay for verify to find."""
    parents = ancestors(log)
    behind = set()
    for key in keys:
        parent = parents.get(key)
        while parent is not None and parent not in detected:
            parent = parents.get(parent)
        if parent is not None:
            behind.add(key)
    return behind


def _account(
    rot: _Rot,
    label: str,
    summary: dict[str, Any],
    flipped: set[str],
    live_read: set[str],
    detected: set[str],
) -> None:
    verified = verify_store(rot.store)
    on_disk = set(verified.corrupt_keys)
    failures = int(summary["tiers"]["disk"]["checksum_failures"])
    mismatched = int(summary["load_audit"].get("mismatched", 0))
    rot.add("values_flipped", len(flipped))
    rot.add("flipped_while_serving_read_back", len(live_read))
    rot.add("detected_on_read", len(detected & flipped))
    rot.add("found_by_verify_never_read", len(on_disk))
    rot.add("checksum_failures_counted", failures)
    rot.add("load_audit_verified", int(summary["load_audit"].get("verified", 0)))
    rot.add("load_audit_mismatched", mismatched)
    problems = []
    if detected - flipped or on_disk - flipped:
        problems.append(f"corruption nobody injected: {sorted((detected | on_disk) - flipped)}")
    if flipped - detected - on_disk:
        problems.append(f"{len(flipped - detected - on_disk)} flipped values neither detected "
                        "nor found by verify")  # fmt: skip
    if detected & on_disk:
        problems.append(f"{len(detected & on_disk)} detected values still corrupt on disk")
    if live_read - detected:
        problems.append(f"{len(live_read - detected)} of {len(live_read)} values flipped while "
                        "serving and read back went undetected")  # fmt: skip
    if failures != len(detected):
        problems.append(f"{failures} checksum failures counted for {len(detected)} removals")
    if mismatched:
        problems.append(f"the load audit found {mismatched} loaded chunks that differ")
    rot.found.extend(f"{label}: {problem}" for problem in problems)
    repaired = verify_store(rot.store, repair=True)
    if not repaired.is_ok:
        rot.found.append(f"{label}: verify --repair exited {repaired.exit_code}")
    _log(f"{label}: flipped {len(flipped)}, detected {len(detected)}, verify {len(on_disk)}")


def _prompt_blocks_only(prompt: list[int]) -> list[int]:
    """`prompt` cut so that its generated tokens never complete a block: then every chunk it
    writes is one a later request for the same prompt reads back."""
    whole = len(prompt) // CHUNK_TOKENS * CHUNK_TOKENS
    return prompt[: whole + (CHUNK_TOKENS - _MAX_TOKENS) // 2]


@scenario(
    "bit-rot",
    number=2,
    title="bit rot",
    pass_rule="every flipped value is detected on read (a miss, the chunk removed, a checksum "
    "failure counted) or, never read, found by verify; every value flipped while serving is "
    "detected when its prompt comes back (unless an earlier chunk of that prompt failed "
    "first); 0 load-audit mismatches; 0 sequences diverge",
    timeout_s=600,
    smoke_timeout_s=180,
    needs=("engine",),
)
def bit_rot(ctx: RunContext) -> Outcome:
    rounds = ctx.trials(smoke=1, full=8)
    rng = random.Random(ctx.seed + 2)
    prompts = prompts_of(rng, num_families=4, per_family=2 + rounds)
    old = [prompts[i] for i in range(0, len(prompts), 2 + rounds)]
    old += [prompts[i + 1] for i in range(0, len(prompts), 2 + rounds)]
    new = [_prompt_blocks_only(p) for p in prompts if p not in old]
    prompts = old + new
    host = EngineHost(ctx.workdir / "engine.log", name="bit-rot engine")
    try:
        model = str(host.call({"op": "model", "dir": str(ctx.workdir / "model")})["dir"])
        oracle = TokenOracle.from_engine(host, model, prompts, _MAX_TOKENS)
        rot = _Rot(ctx, rng, oracle, model, old, new)
        host.call({"op": "engine", "model": model, "extra": rot.extra("prep")})
        for start in range(0, len(old), 4):
            rot.serve(host, old[start : start + 4])
        host.call({"op": "close"})
        for number in range(rounds):
            _round(rot, host, number)
    finally:
        host.close()
    figures = rot.figures
    return Outcome(
        trials=rounds,
        faults_injected=figures.get("values_flipped", 0),
        passed=not rot.found and not oracle.num_diverged,
        requests_served=oracle.num_sequences,
        chunks_lost=figures.get("chunks_lost", 0),
        bad_tokens_served=oracle.num_diverged,
        found=rot.found + oracle.failures,
        details={**figures, "oracle": oracle.figures()},
    )
