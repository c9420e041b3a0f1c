"""Time to first token: recompute vs. kvstore's tiers (see `kvstore.bench.connector`).

    .venv/bin/python benchmarks/bench_connector.py [--tokens 2048 8192] [--repeats 5] [--check]

The benchmark ships with kvstore (`kvstore bench connector`); this script is a shortcut for a
source checkout.
"""

import sys

from kvstore.bench.connector import main

if __name__ == "__main__":
    sys.exit(main())
