"""Shortcut for a source checkout: the suite ships with kvstore (`kvstore bench tiers`)."""

from kvstore.bench.tiers import main

if __name__ == "__main__":
    main()
