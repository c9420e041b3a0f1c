"""Fuzz targets and the rule they are held to: never a crash, never a hang, a clear own error.

A `FuzzTarget` pairs a hypothesis strategy of hostile inputs with an `exercise` that feeds one
input to the code under test. The exercise catches nothing itself: `check` accepts a normal
return or one of the target's `allowed` errors (the package's own error types) and turns
anything else, or a run past `example_timeout_s`, into a `Crash`. Exercises that compare data
(a store must never hand back bytes other than those written) raise `WrongData` themselves.

`run_target` drives a target with hypothesis outside pytest, counting the inputs it fed and
keeping the shrunk first crash; `tests/reliability` runs the same targets under pytest.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import hypothesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from reliability.checks import Crash
from reliability.isolation import Hang, time_limit

__all__ = ["PROFILE", "FuzzTarget", "TargetResult", "check", "fuzz_settings", "run_target"]

settings.register_profile(
    "reliability",
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("reliability-ci", settings.get_profile("reliability"), derandomize=True)
PROFILE = os.environ.get(
    "KVSTORE_RELIABILITY_PROFILE", "reliability-ci" if os.environ.get("CI") else "reliability"
)
"""The hypothesis profile of the reliability tests: `reliability` (random, no deadline), or
`reliability-ci` (derandomized: the same examples every CI run) when `CI` is set. Profiles are
applied per test (`fuzz_settings`), never loaded globally, so other tests keep their defaults."""


def fuzz_settings(max_examples: int) -> settings:
    """The active reliability profile with `max_examples` examples."""
    return settings(settings.get_profile(PROFILE), max_examples=max_examples)


@dataclass(frozen=True, slots=True)
class FuzzTarget:
    """One parser (or store record) under fuzz; see the module docstring."""

    name: str
    description: str
    strategy: st.SearchStrategy[Any]
    exercise: Callable[[Any], object]
    allowed: tuple[type[BaseException], ...]
    max_examples: int = 200
    example_timeout_s: float = 20.0


def check(target: FuzzTarget, value: Any) -> None:
    """Feed `value` to `target`; raise `Crash` unless it returns or raises an allowed error."""
    try:
        with time_limit(target.example_timeout_s):
            target.exercise(value)
    except target.allowed:
        return
    except Crash:
        raise
    except Hang as exc:
        raise Crash(f"{target.name}: hung ({exc})") from exc
    except Exception as exc:
        raise Crash(f"{target.name}: {type(exc).__name__}: {str(exc)[:300]}") from exc


@dataclass(frozen=True, slots=True)
class TargetResult:
    name: str
    num_inputs: int
    crash: str = ""


def run_target(target: FuzzTarget, *, max_examples: int, seed: int) -> TargetResult:
    """Fuzz `target` with `max_examples` inputs (plus shrinking after a crash)."""
    num_inputs = 0

    def feed(value: Any) -> None:
        nonlocal num_inputs
        num_inputs += 1
        check(target, value)

    test = hypothesis.seed(seed)(
        settings(
            max_examples=max_examples,
            deadline=None,
            database=None,
            print_blob=False,
            suppress_health_check=list(HealthCheck),
        )(given(target.strategy)(feed))
    )
    try:
        test()
    except Crash as exc:
        return TargetResult(target.name, num_inputs, _first_line(exc))
    return TargetResult(target.name, num_inputs)


def _first_line(exc: BaseException) -> str:
    notes = [note for note in getattr(exc, "__notes__", ()) if "Falsifying" not in note]
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return " ".join([text[:300], *(note[:200] for note in notes[:1])])
