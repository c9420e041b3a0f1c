"""Benchmarks that ship with kvstore (`kvstore bench`): each measures against a baseline in
the same run, because shared machines are noisy."""
