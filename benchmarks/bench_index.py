"""Shortcut for a source checkout: the suite ships with kvstore (`kvstore bench index`)."""

from kvstore.bench.index import main

if __name__ == "__main__":
    main()
