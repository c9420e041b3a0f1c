"""The parent side of the engine scenarios: engine children, workloads and the token oracle.

`EngineHost` starts `python -m reliability.engine_host` (its own session, so a SIGKILL takes
exactly it), talks to it one JSON line at a time, and can kill it at any moment. A host is
started ahead of need: its ~8 s of imports overlap whatever runs meanwhile, and building an
engine in it then takes ~2 s.

`TokenOracle` holds the reference (the same prompts on an engine without kvstore) and checks
every answer against it with `kvstore.oracle.compare_greedy` (tie-aware): a sequence it
reports DIVERGED is a bad token served. `shared_prefix_prompts` makes the workloads.
"""

from __future__ import annotations

import json
import os
import queue
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from prometheus_client.metrics_core import Metric

from kvstore.oracle import GreedyRun, Verdict, compare_greedy
from kvstore.tiny_model import TinyLlamaSpec
from tests.support.oracle import runs_from

__all__ = [
    "CHUNK_BYTES",
    "CHUNK_TOKENS",
    "EngineHost",
    "HostError",
    "TokenOracle",
    "shared_prefix_prompts",
]

CHUNK_TOKENS = 32  # the engine's block size in `kvstore.vllm.engine.engine`
CHUNK_BYTES = TinyLlamaSpec().kv_bytes_per_token * CHUNK_TOKENS
_ROOT = Path(__file__).resolve().parent.parent
_VOCAB = (5, TinyLlamaSpec().vocab_size - 8)  # clear of the special tokens


class HostError(Exception):
    """An engine child died, hung past its limit, or answered a command with an error."""


class EngineHost:
    """One engine child (see the module docstring). Not thread-safe: one caller."""

    def __init__(self, log_path: Path, *, name: str = "engine") -> None:
        self.name = name
        self.log_path = log_path
        env = dict(os.environ, HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
        self._log = log_path.open("ab")
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "reliability.engine_host"],
            cwd=_ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            env=env,
            start_new_session=True,
            text=True,
        )
        self._lines: queue.Queue[str | None] = queue.Queue()
        self.answer_times: list[float] = []  # time.monotonic() of each line, as it arrived
        assert self._proc.stdout is not None
        threading.Thread(target=self._read, args=(self._proc.stdout,), daemon=True).start()
        self._is_ready = False

    @property
    def pid(self) -> int:
        return self._proc.pid

    def is_alive(self) -> bool:
        return self._proc.poll() is None

    def _read(self, stream: IO[str]) -> None:
        for line in stream:
            self.answer_times.append(time.monotonic())
            self._lines.put(line)
        self._lines.put(None)

    def wait_ready(self, timeout_s: float = 180.0) -> None:
        if not self._is_ready:
            answer = self.receive(timeout_s)
            if answer.get("op") != "ready":
                raise HostError(f"{self.name}: expected ready, got {answer}")
            self._is_ready = True

    def send(self, command: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        try:
            self._proc.stdin.write(json.dumps(command) + "\n")
            self._proc.stdin.flush()
        except OSError as exc:
            raise HostError(f"{self.name}: cannot send {command['op']}: {exc}") from exc

    def receive(self, timeout_s: float) -> dict[str, Any]:
        try:
            line = self._lines.get(timeout=timeout_s)
        except queue.Empty:
            raise HostError(f"{self.name}: no answer within {timeout_s:.0f} s") from None
        if line is None:
            code = self._proc.wait()
            raise HostError(f"{self.name}: the engine child exited {code}: {self.log_tail()}")
        answer: dict[str, Any] = json.loads(line)
        if not answer.get("ok", False):
            raise HostError(f"{self.name}: {answer.get('op')} failed: {answer.get('error')}")
        return answer

    def call(self, command: dict[str, Any], timeout_s: float = 180.0) -> dict[str, Any]:
        self.wait_ready()
        self.send(command)
        return self.receive(timeout_s)

    def drain_answers(self) -> list[dict[str, Any]]:
        """The answers that arrived before the child died (call after `kill`); a torn last
        line, or an answer saying a command failed, is left out."""
        answers = []
        while True:
            try:
                line = self._lines.get(timeout=10.0)
            except queue.Empty:
                break
            if line is None:
                break
            try:
                answer = json.loads(line)
            except ValueError:
                continue
            if answer.get("ok"):
                answers.append(answer)
        return answers

    def kill(self) -> None:
        """SIGKILL the child (its whole session) and reap it."""
        if self._proc.poll() is None:
            os.killpg(self._proc.pid, signal.SIGKILL)
        self._proc.wait()
        self._log.close()

    def close(self, timeout_s: float = 60.0) -> int | None:
        """Ask the child to shut its engine down and exit; kill it past `timeout_s`. Returns
        its exit status (None if it had to be killed)."""
        code: int | None = None
        if self._proc.poll() is None:
            try:
                self.send({"op": "exit"})
                code = self._proc.wait(timeout_s)
            except (HostError, subprocess.TimeoutExpired):
                code = None
        else:
            code = self._proc.returncode
        self.kill()
        return code

    def log_tail(self, num_chars: int = 1500) -> str:
        self._log.flush()
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return text[-num_chars:]


def shared_prefix_prompts(
    rng: random.Random,
    *,
    num_families: int,
    per_family: int,
    prefix_tokens: tuple[int, int] = (64, 160),
    suffix_tokens: tuple[int, int] = (24, 120),
) -> list[list[int]]:
    """`num_families` x `per_family` prompts: each family shares a random prefix (a system
    prompt, a document), each prompt adds its own random suffix."""
    prompts = []
    for _ in range(num_families):
        prefix = [rng.randint(*_VOCAB) for _ in range(rng.randint(*prefix_tokens))]
        for _ in range(per_family):
            suffix = [rng.randint(*_VOCAB) for _ in range(rng.randint(*suffix_tokens))]
            prompts.append(prefix + suffix)
    return prompts


def flat_samples(families: Iterable[Metric]) -> dict[str, float]:
    """Counter and gauge samples as `name{label="value",...}` -> value (labels sorted; no
    histograms, no `_created`): a registry's `collect()` or a parsed /metrics page."""
    values: dict[str, float] = {}
    for family in families:
        if family.type not in ("counter", "gauge"):
            continue
        for sample in family.samples:
            if sample.name.endswith("_created"):
                continue
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}" if labels else sample.name] = sample.value
    return values


@dataclass(slots=True)
class TokenOracle:
    """Every sequence served, checked against the run without kvstore (module docstring)."""

    reference: dict[tuple[int, ...], GreedyRun]
    num_sequences: int = 0
    num_cut_at_tie: int = 0
    num_diverged: int = 0
    failures: list[str] = field(default_factory=list)

    @classmethod
    def from_engine(
        cls, host: EngineHost, model_dir: str, prompts: Sequence[Sequence[int]], max_tokens: int
    ) -> TokenOracle:
        """Serve `prompts` on an engine without kvstore in `host` (closed afterwards)."""
        host.call({"op": "engine", "model": model_dir, "extra": None})
        unique = [list(p) for p in dict.fromkeys(tuple(p) for p in prompts)]
        answer = host.call({"op": "generate", "prompts": unique, "max_tokens": max_tokens})
        host.call({"op": "close"})
        runs = runs_from(answer)
        return cls({tuple(p): run for p, run in zip(unique, runs, strict=True)})

    def check(self, prompts: Sequence[Sequence[int]], answer: dict[str, Any]) -> int:
        """Compare one `generate` answer; returns how many sequences DIVERGED."""
        reference = [self.reference[tuple(p)] for p in prompts]
        report = compare_greedy(reference, runs_from(answer))
        self.num_sequences += len(report.checks)
        self.num_cut_at_tie += report.count(Verdict.CUT_AT_TIE)
        diverged = report.count(Verdict.DIVERGED)
        self.num_diverged += diverged
        if diverged and len(self.failures) < 10:
            self.failures.append(report.describe())
        return diverged

    def figures(self) -> dict[str, int]:
        return {
            "sequences_checked": self.num_sequences,
            "cut_at_near_ties": self.num_cut_at_tie,
            "diverged": self.num_diverged,
        }
