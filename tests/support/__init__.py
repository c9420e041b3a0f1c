"""Helpers shared by the test suite and the reliability suite: fakes, oracles, real servers."""
