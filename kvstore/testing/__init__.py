"""Helpers shared by the test suite, the demo and the benchmarks (no pytest import here)."""
