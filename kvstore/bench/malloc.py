"""A measurement control for the benchmarks: glibc's malloc thresholds, fixed and the same for
every engine a run starts (`--fixed-malloc`).

glibc moves its mmap threshold up to the size of the largest mmapped block a process freed so
far (up to 32 MiB), and its trim threshold with it. Whether a prefill's activations then come
from reused heap pages or from fresh mmaps, page-faulted anew each step, depends on each
process's allocation history. On the 2-vCPU AMX VM (in-process layout, 2048-token prompts),
two engines with the same configuration and no connector, timed in turn on the same kind of
prompt, differed by up to 1.34x over 20 requests each; four such engines had medians from
0.187 s to 0.233 s, and one of two took 327 K page faults in 12 s where the other took 18 K.
With both thresholds fixed for every engine, the four agreed within 4%. A benchmark that pairs
one engine with kvstore and one without otherwise measures, in part, which engine drew the
better history. The flag sets the same values for the baselines and for kvstore's engines and
the reports say so; without it the engines run with glibc's defaults, as a user's do.
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping, MutableMapping

__all__ = ["FIXED_MALLOC_ENV", "add_fixed_malloc_argument", "apply_fixed_malloc", "malloc_words"]

FIXED_MALLOC_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(32 << 20),  # glibc's dynamic ceiling: blocks below it reuse
    "MALLOC_TRIM_THRESHOLD_": str(4 << 30),  # the heap is not given back between steps
}


def add_fixed_malloc_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--fixed-malloc",
        action="store_true",
        help="fix glibc's malloc mmap and trim thresholds for every engine (baselines too), so "
        "that engines do not differ by their allocation history (see kvstore/bench/malloc.py)",
    )


def apply_fixed_malloc(is_fixed: bool, env: MutableMapping[str, str]) -> str:
    """Set the fixed thresholds in `env` (the environment the run's engines start with) when
    `is_fixed`; returns the words for the report."""
    if is_fixed:
        env.update(FIXED_MALLOC_ENV)
    return malloc_words(env)


def malloc_words(env: Mapping[str, str]) -> str:
    """What a report says of the engines' malloc settings in `env`."""
    if all(env.get(name) == value for name, value in FIXED_MALLOC_ENV.items()):
        settings = " ".join(f"{name}={value}" for name, value in FIXED_MALLOC_ENV.items())
        return f"malloc thresholds fixed for every engine ({settings})"
    if any(name in env for name in FIXED_MALLOC_ENV):
        return "malloc thresholds set by the caller's environment"
    return "glibc malloc defaults"
