"""`--fixed-malloc`: the benchmarks' control for glibc's history-dependent malloc thresholds."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvstore.bench.malloc import FIXED_MALLOC_ENV, apply_fixed_malloc, malloc_words

# A child that mallocs 1 MiB and says whether glibc served it from the heap (brk) or an mmap.
_PROBE = """
import ctypes
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
address = libc.malloc(1 << 20)
for line in open("/proc/self/maps"):
    span, *rest = line.split()
    low, high = (int(x, 16) for x in span.split("-"))
    if low <= address < high:
        print("heap" if line.rstrip().endswith("[heap]") else "mmap")
        break
"""


def _where_1mib_lands(env: dict[str, str]) -> str:
    out = subprocess.run(
        [sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def test_without_the_flag_nothing_is_set_and_the_report_says_defaults() -> None:
    env = {"PATH": "/usr/bin"}
    assert apply_fixed_malloc(False, env) == "glibc malloc defaults"
    assert env == {"PATH": "/usr/bin"}


def test_the_flag_sets_both_thresholds_and_the_report_names_them() -> None:
    env: dict[str, str] = {}
    words = apply_fixed_malloc(True, env)
    assert env == FIXED_MALLOC_ENV
    assert words.startswith("malloc thresholds fixed for every engine")
    assert all(f"{name}={value}" in words for name, value in FIXED_MALLOC_ENV.items())


def test_a_threshold_the_caller_set_is_not_reported_as_defaults() -> None:
    env = {"MALLOC_MMAP_THRESHOLD_": "65536"}
    assert malloc_words(env) == "malloc thresholds set by the caller's environment"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc")
def test_an_engine_process_started_with_the_flag_serves_large_blocks_from_the_heap() -> None:
    """What the flag is for: glibc's initial threshold (128 KiB) mmaps a fresh 1 MiB block,
    page-faulted anew after each free; the fixed threshold keeps such blocks on the heap."""
    base = {k: v for k, v in os.environ.items() if k not in FIXED_MALLOC_ENV}
    assert _where_1mib_lands(base) == "mmap"
    fixed = dict(base)
    apply_fixed_malloc(True, fixed)
    assert _where_1mib_lands(fixed) == "heap"
