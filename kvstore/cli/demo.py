"""`kvstore demo`: the main job, on the embedded default (tiny local model, CPU engine)."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvstore.cli.app import app
from kvstore.oracle import Verdict

if TYPE_CHECKING:
    from kvstore.demo.runner import DemoResult

_err = Console(stderr=True)


@app.command()
def demo(
    directory: Annotated[Path, typer.Option("--dir", help="Where the model and store go.")] = Path(
        ".kvstore"
    ),
    conversations: Annotated[int, typer.Option(min=1, help="Concurrent conversations.")] = 6,
    turns: Annotated[int, typer.Option(min=1, help="Turns per conversation.")] = 6,
    baseline: Annotated[
        bool, typer.Option(help="Also run without kvstore and compare outputs.")
    ] = True,
    metrics_port: Annotated[int, typer.Option(help="Metrics port (0 = any free port).")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Run the real vLLM engine with KVStoreConnector on a multi-turn chat workload."""
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "WARNING")
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")  # stdout is for the report
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    logging.basicConfig(level=logging.WARNING)
    from kvstore.demo.runner import DemoOptions, run_demo

    options = DemoOptions(
        directory=directory,
        num_conversations=conversations,
        num_turns=turns,
        metrics_port=metrics_port,
        compare_baseline=baseline,
    )
    result = run_demo(options, on_progress=lambda m: _err.print(f"[dim]·[/dim] {m}"))
    data = _report_data(result)
    if as_json:
        typer.echo(json.dumps(data, indent=2))
    else:
        _print_report(data)
    if not result.is_correct:
        _err.print(f"[red]kvstore demo: the correctness check FAILED: {data['oracle']}[/red]")
        raise typer.Exit(1)


def _report_data(result: DemoResult) -> dict[str, Any]:
    checks = [result.audit.describe() if result.audit is not None else "no load audit"]
    if result.outputs is not None:
        checks.append(result.outputs.describe())
    return {
        "store_path": str(result.store_path),
        "metrics_url": result.metrics_url,
        "num_requests": result.num_requests,
        "prompt_tokens": result.prompt_tokens,
        "kvstore_hit_tokens": result.kvstore_hit_tokens,
        "engine_prefix_cache_hit_tokens": result.engine_hit_tokens,
        "prefill_tokens": result.prefill_tokens,
        "baseline_prefill_tokens": result.baseline_prefill_tokens,
        "elapsed_s": round(result.elapsed_s, 3),
        "baseline_elapsed_s": None
        if result.baseline_elapsed_s is None
        else round(result.baseline_elapsed_s, 3),
        "is_correct": result.is_correct,
        "oracle": "; ".join(checks),
        "load_audit": None if result.audit is None else {
            "verified": result.audit.verified,
            "mismatched": result.audit.mismatched,
            "unknown": result.audit.unknown,
        },
        "outputs": None if result.outputs is None else {
            "tie_epsilon": result.outputs.tie_epsilon,
            "equal": result.outputs.count(Verdict.EQUAL),
            "cut_at_tie": result.outputs.count(Verdict.CUT_AT_TIE),
            "diverged": result.outputs.count(Verdict.DIVERGED),
        },
        "turns": [
            {
                "turn": t.turn,
                "prompt_tokens": t.prompt_tokens,
                "engine_cache_tokens": t.engine_cache_tokens,
                "cpu_tokens": t.cpu_tokens,
                "disk_tokens": t.disk_tokens,
                "computed_tokens": t.computed_tokens,
            }
            for t in result.turns
        ],
        "summary": result.summary,
    }  # fmt: skip


def _print_report(data: dict[str, Any]) -> None:
    console = Console()
    summary = data["summary"]
    table = Table(title="kvstore tiers", title_justify="left")
    for column in (
        "tier",
        "hit chunks",
        "hit tokens",
        "stored chunks",
        "evicted",
        "checksum errors",
    ):
        table.add_column(column, justify="left" if column == "tier" else "right")
    for tier, stats in summary.get("tiers", {}).items():
        table.add_row(
            tier,
            f"{stats['hit_chunks']:.0f}",
            f"{stats['hit_tokens']:.0f}",
            f"{stats['stored_chunks']:.0f}",
            f"{stats['evicted_chunks']:.0f}",
            f"{stats['checksum_failures']:.0f}",
        )
    console.print(table)
    moved = Table(title="bytes moved", title_justify="left")
    moved.add_column("direction")
    moved.add_column("bytes", justify="right")
    for direction, num_bytes in summary.get("bytes", {}).items():
        moved.add_row(direction, f"{num_bytes:,.0f}")
    console.print(moved)
    prompt_tokens = max(1, data["prompt_tokens"])
    saved = data["kvstore_hit_tokens"]
    console.print(
        f"{data['num_requests']} requests, {data['prompt_tokens']:,} prompt tokens: "
        f"kvstore served {saved:,} ({100 * saved / prompt_tokens:.1f}%), the engine's own "
        f"prefix cache {data['engine_prefix_cache_hit_tokens']:,}"
    )
    if data["baseline_prefill_tokens"] is not None:
        console.print(
            f"prefill computed: {data['prefill_tokens']:,} tokens with kvstore, "
            f"{data['baseline_prefill_tokens']:,} without; wall time {data['elapsed_s']:.1f}s "
            f"vs {data['baseline_elapsed_s']:.1f}s (the tiny demo model recomputes almost for "
            "free: `kvstore bench connector` measures time to first token on a larger one)"
        )
    verdict = "[green]correct[/green]" if data["is_correct"] else "[red]WRONG[/red]"
    console.print(f"correctness ({verdict}): {data['oracle']}")
    if data["metrics_url"]:
        console.print(f"metrics were served at {data['metrics_url']} while the engine ran")
    store = data["store_path"]
    console.print(f"inspect the store: kvstore stat {store} ; kvstore ls {store}")
