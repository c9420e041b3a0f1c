"""Scenario 1, kill -9 storms: an engine with kvstore (disk write-through on every new chunk)
SIGKILLed at a random moment while it serves, over and over, on one store and one region_dir.

A preparation run computes the reference (no kvstore) and writes two anchor prompts to the
store cleanly. Each trial then starts an engine in a fresh child (imported while the previous
trial ran), serves the anchors (their chunks must all come back from disk), sends three more
batches (half of each new prompts, so every trial writes), and kills the child at a random
moment within them. After each kill: `kvstore verify` must exit 0, every chunk the trial's
events log acknowledged on disk must still be there, and the next engine must start on the
same store and region_dir with no cleanup (the dead engine's region file reclaimed). A last,
clean engine serves everything once more and reports kvstore's error counters.
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
from reliability.store_checks import acknowledged_keys, region_files, store_keys, verify_store

__all__ = ["kill_storm"]

_MAX_TOKENS = 8
_BATCHES = 10  # after the anchors, per trial
_BATCH = 4  # prompts per batch, half of them new


@dataclass(slots=True)
class _Storm:
    ctx: RunContext
    rng: random.Random
    anchors: list[list[int]]
    fresh: list[list[int]]  # new prompts, consumed two per batch
    oracle: TokenOracle | None = None
    kills_by_answers: dict[int, int] = field(default_factory=dict)
    served: list[list[int]] = field(default_factory=list)
    found: list[str] = field(default_factory=list)
    figures: dict[str, Any] = field(default_factory=dict)

    @property
    def store(self) -> Path:
        return self.ctx.workdir / "store"

    @property
    def region_dir(self) -> Path:
        return self.ctx.workdir / "shm"

    def extra(self, trial: int) -> dict[str, Any]:
        return {
            "cpu_bytes": 24 * CHUNK_BYTES,  # small: CPU rows turn over, everything is written
            "disk_path": str(self.store),
            "disk_bytes": 4096 * CHUNK_BYTES,  # no disk eviction: acknowledged means kept
            "region_dir": str(self.region_dir),
            "events_log": str(self.ctx.workdir / f"events-{trial}.jsonl"),
            "audit_loads": True,
        }

    def add(self, name: str, amount: int = 1) -> None:
        self.figures[name] = self.figures.get(name, 0) + amount

    def note(self, line: str) -> None:
        if len(self.found) < 20:
            self.found.append(line)

    def check(self, prompts: list[list[int]], answer: dict[str, Any]) -> None:
        assert self.oracle is not None
        self.oracle.check(prompts, answer)
        self.served.extend(prompts)

    def batch(self) -> list[list[int]]:
        new = [self.fresh.pop() for _ in range(_BATCH // 2)]
        old = self.rng.sample(self.served, min(len(self.served), _BATCH - len(new)))
        return new + old

    def expected_hit_tokens(self) -> int:
        return sum((len(p) - 1) // CHUNK_TOKENS * CHUNK_TOKENS for p in self.anchors)


_STARTED = time.monotonic()


def _log(message: str) -> None:
    print(f"kill-storm [{time.monotonic() - _STARTED:5.0f} s]: {message}", file=sys.stderr,
          flush=True)  # fmt: skip


def _start(storm: _Storm, host: EngineHost, model: str, label: str, trial: int) -> None:
    """Start kvstore's engine in `host` on the storm's store; check the stale region went."""
    stale = region_files(storm.region_dir)
    answer = host.call({"op": "engine", "model": model, "extra": storm.extra(trial)})
    storm.figures.setdefault("engine_start_s", []).append(answer["start_s"])
    now = region_files(storm.region_dir)
    left = {name for name, inode in stale.items() if now.get(name) == inode}
    storm.add("stale_regions_reclaimed", len(stale) - len(left))
    if left or len(now) != 1:
        storm.note(f"{label}: after start the region dir holds {sorted(now)} (stale before: "
                   f"{sorted(stale)})")  # fmt: skip


def _serve_anchors(storm: _Storm, host: EngineHost, label: str) -> float:
    """Serve the anchors, which must come from disk whole; how long the batch took."""
    answer = host.call({"op": "generate", "prompts": storm.anchors, "max_tokens": _MAX_TOKENS})
    storm.check(storm.anchors, answer)
    hits = sum(answer["num_cached_tokens"])
    storm.add("disk_hit_tokens_after_restart", hits)
    if hits != storm.expected_hit_tokens():
        storm.note(f"{label}: anchors got {hits} tokens from disk, {storm.expected_hit_tokens()} "
                   "were stored")  # fmt: skip
    return float(answer["duration_s"])


def _trial(storm: _Storm, host: EngineHost, model: str, trial: int) -> None:
    """One trial on `host`: start, serve, kill at random, check the store."""
    label = f"trial {trial}"
    host.wait_ready()
    _start(storm, host, model, label, trial)
    batch_s = _serve_anchors(storm, host, label)
    batches = [storm.batch() for _ in range(_BATCHES)]
    for prompts in batches:
        host.send({"op": "generate", "prompts": prompts, "max_tokens": _MAX_TOKENS})
    answers = []
    for _ in range(storm.rng.randint(0, _BATCHES)):  # all of them: kill in the writes' tail
        answers.append(host.receive(180.0))
        batch_s = answers[-1]["duration_s"]
    delay_s = storm.rng.uniform(0.0, 1.5 * batch_s)
    time.sleep(delay_s)
    host.kill()
    answers += host.drain_answers()
    storm.add("kills")
    storm.kills_by_answers[len(answers)] = storm.kills_by_answers.get(len(answers), 0) + 1
    for prompts, answer in zip(batches, answers, strict=False):
        storm.check(prompts, answer)
    _after_kill(storm, label, trial)
    host.close()
    _log(f"{label}: SIGKILL {delay_s:.2f} s after the last awaited answer, {len(answers)}/"
         f"{_BATCHES} batches answered")  # fmt: skip


def _after_kill(storm: _Storm, label: str, trial: int) -> None:
    verified = verify_store(storm.store)
    storm.add("chunks_verified", verified.num_checked)
    if not verified.is_ok:
        storm.add("verify_failures")
        storm.note(f"{label}: kvstore verify exited {verified.exit_code} "
                   f"({verified.num_corrupt} corrupt) {verified.error}")  # fmt: skip
    acked = acknowledged_keys(storm.ctx.workdir / f"events-{trial}.jsonl")
    lost = acked - store_keys(storm.store)
    storm.add("chunks_acknowledged", len(acked))
    storm.add("chunks_lost", len(lost))
    if lost:
        storm.note(f"{label}: {len(lost)} of {len(acked)} acknowledged chunks not found, e.g. "
                   f"{sorted(lost)[0][:16]}")  # fmt: skip


def _prepare(storm: _Storm, host: EngineHost) -> str:
    """Build the model, the reference, and the anchors on disk (a clean run)."""
    model = str(host.call({"op": "model", "dir": str(storm.ctx.workdir / "model")})["dir"])
    everything = storm.anchors + storm.fresh
    storm.oracle = TokenOracle.from_engine(host, model, everything, _MAX_TOKENS)
    host.call({"op": "engine", "model": model, "extra": storm.extra(-1)})
    answer = host.call({"op": "generate", "prompts": storm.anchors, "max_tokens": _MAX_TOKENS})
    storm.check(storm.anchors, answer)
    prompts = storm.batch()
    storm.check(prompts, host.call({"op": "generate", "prompts": prompts, "max_tokens": 8}))
    host.call({"op": "summary"})  # drains: the anchors are on disk
    host.call({"op": "close"})
    return model


def _final(storm: _Storm, host: EngineHost, model: str, trials: int) -> None:
    """A clean engine after the last kill: starts, serves, and counts no errors."""
    label = "final run"
    _start(storm, host, model, label, trials)
    _serve_anchors(storm, host, label)
    sample = storm.rng.sample(storm.served, min(12, len(storm.served)))
    answer = host.call({"op": "generate", "prompts": sample, "max_tokens": _MAX_TOKENS})
    storm.check(sample, answer)
    summary = host.call({"op": "summary"})["summary"]
    disk = summary["tiers"]["disk"]
    errors = {
        "checksum_failures": disk["checksum_failures"],
        "load_failed_chunks": summary["load_failed_chunks"],
        "load_audit_mismatched": summary["load_audit"].get("mismatched", 0),
    }
    storm.figures["final_run_errors"] = errors
    if any(errors.values()):
        storm.note(f"{label}: kvstore counted errors {errors}")
    host.call({"op": "close"})
    verified = verify_store(storm.store)
    if not verified.is_ok:
        storm.note(f"{label}: kvstore verify exited {verified.exit_code} after a clean run")


@scenario(
    "kill-storm",
    number=1,
    title="kill -9 storms",
    pass_rule="after every SIGKILL: kvstore verify exits 0, 0 acknowledged chunks lost, the next "
    "engine starts on the same store and region_dir (stale region reclaimed) and serves every "
    "anchor chunk from disk; 0 sequences diverge from the run without kvstore",
    timeout_s=1200,
    smoke_timeout_s=240,
    needs=("engine",),
)
def kill_storm(ctx: RunContext) -> Outcome:
    trials = ctx.trials(smoke=2, full=30)
    rng = random.Random(ctx.seed)
    needed = (trials * _BATCHES + 1) * (_BATCH // 2)  # new prompts: 2 per batch, prep's too
    per_family = needed // 6 + 2  # 6 families
    prompts = prompts_of(rng, num_families=6, per_family=per_family)
    anchors = [prompts[0], prompts[per_family]]
    fresh = [p for p in prompts if p not in anchors]
    rng.shuffle(fresh)
    storm = _Storm(ctx, rng, anchors=anchors, fresh=fresh)
    hosts = [EngineHost(ctx.workdir / "engine-prep.log", name="prep")]
    try:
        hosts.append(EngineHost(ctx.workdir / "engine-0.log", name="engine 0"))
        model = _prepare(storm, hosts[0])
        _log("prepared: reference computed, anchors on disk")
        for trial in range(trials):  # the next child imports while this one serves
            hosts.append(EngineHost(ctx.workdir / f"engine-{trial + 1}.log", name="engine"))
            _trial(storm, hosts[-2], model, trial)
        _final(storm, hosts[-1], model, trials)
    finally:
        for host in hosts:
            host.close()
    return _outcome(storm, trials)


def _outcome(storm: _Storm, trials: int) -> Outcome:
    oracle = storm.oracle
    assert oracle is not None
    if oracle.failures:
        storm.found.extend(oracle.failures)
    figures = storm.figures
    starts = figures.pop("engine_start_s", [])
    figures["engine_start_s_median"] = sorted(starts)[len(starts) // 2] if starts else None
    figures["kills by batches answered before them"] = dict(sorted(storm.kills_by_answers.items()))
    figures["oracle"] = oracle.figures()
    return Outcome(
        trials=trials,
        faults_injected=figures.get("kills", 0),
        passed=not storm.found and figures.get("kills", 0) == trials,
        requests_served=oracle.num_sequences,
        chunks_lost=figures.get("chunks_lost", 0),
        bad_tokens_served=oracle.num_diverged,
        found=storm.found,
        details=figures,
    )
