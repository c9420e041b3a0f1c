"""What `kvstore demo` reports: the `--json` document, the tables, and what to do next.

Every "what next" line is a command that works as printed, with the demo's own directory in it.
"""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from kvstore.oracle import Verdict

if TYPE_CHECKING:
    from kvstore.demo.runner import DemoResult, TurnStats

__all__ = ["DemoFiles", "NextStep", "next_steps", "print_next_steps", "print_report", "report_data"]

_LIVE_METRICS_PORT = 9400  # the engine target of grafana/prometheus.yml
_STORE_METRICS_PORT = 9401  # the `kvstore serve` target of grafana/prometheus.yml


@dataclass(frozen=True, slots=True)
class DemoFiles:
    """What the demo wrote besides the store."""

    log_path: Path | None  # vLLM's and torch's output (None with -v: it went to the terminal)
    picture_path: Path | None  # None without matplotlib


@dataclass(frozen=True, slots=True)
class NextStep:
    what: str
    commands: tuple[str, ...]


def report_data(result: DemoResult, files: DemoFiles) -> dict[str, Any]:
    """The `--json` document (and what the human report prints)."""
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
        "oracle": "; ".join(_checks(result)),
        "load_audit": _audit_data(result),
        "kv": _kv_data(result),
        "outputs": _outputs_data(result),
        "turns": [_turn_data(t) for t in result.turns],
        "summary": result.summary,
        "log_path": None if files.log_path is None else str(files.log_path),
        "picture_path": None if files.picture_path is None else str(files.picture_path),
    }  # fmt: skip


def _checks(result: DemoResult) -> list[str]:
    """One sentence per oracle, in the order of `kvstore.oracle`."""
    if result.loads.num_blocks == 0:
        loads = "kvstore loaded nothing"
        if result.expects_loads:
            loads += " although the history outgrew the engine's cache: loads were EXPECTED"
        checks = [loads]
    else:
        checks = [result.audit.describe() if result.audit is not None else "no load audit"]
        if result.kv is not None:
            checks.append(result.kv.describe())
    if result.outputs is not None:
        checks.append(result.outputs.describe())
    return checks


def _kv_data(result: DemoResult) -> dict[str, Any]:
    loads = result.loads
    data: dict[str, Any] = {
        "loads": loads.num_loads,
        "loaded_blocks": loads.num_blocks,
        "failed_blocks": loads.num_failed_blocks,
        "aborted_blocks": loads.num_aborted_blocks,
        "loads_expected": result.expects_loads,
    }
    if result.kv is not None:
        kv = result.kv
        data.update(
            compared_blocks=kv.num_compared,
            differing_blocks=len(kv.mismatches),
            unreferenced_blocks=kv.num_unreferenced,
            max_error=kv.max_error,
            tolerance=kv.tolerance,
        )
    return data


def _audit_data(result: DemoResult) -> dict[str, int] | None:
    if result.audit is None:
        return None
    audit = result.audit
    return {"verified": audit.verified, "mismatched": audit.mismatched, "unknown": audit.unknown}


def _outputs_data(result: DemoResult) -> dict[str, Any] | None:
    if result.outputs is None:
        return None
    return {
        "tie_epsilon": result.outputs.tie_epsilon,
        "sequences": len(result.outputs.checks),
        "equal": result.outputs.count(Verdict.EQUAL),
        "equal_ratio": round(result.outputs.equal_ratio, 4),
        "min_equal_ratio": result.outputs.min_equal_ratio,
        "cut_at_tie": result.outputs.count(Verdict.CUT_AT_TIE),
        "diverged": result.outputs.count(Verdict.DIVERGED),
    }


def _turn_data(turn: TurnStats) -> dict[str, int]:
    return {
        "turn": turn.turn,
        "prompt_tokens": turn.prompt_tokens,
        "engine_cache_tokens": turn.engine_cache_tokens,
        "cpu_tokens": turn.cpu_tokens,
        "disk_tokens": turn.disk_tokens,
        "computed_tokens": turn.computed_tokens,
    }


def print_report(console: Console, data: dict[str, Any]) -> None:
    """The tier tables, where the tokens came from, the correctness verdict."""
    console.print(_tiers_table(data["summary"]))
    console.print(_bytes_table(data["summary"]))
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
    console.print(f"correctness ({verdict}): {escape(data['oracle'])}")
    if data["metrics_url"]:
        console.print(f"metrics were served at {data['metrics_url']} while the engine ran")


def _tiers_table(summary: dict[str, Any]) -> Table:
    table = Table(title="kvstore tiers", title_justify="left")
    columns = ("tier", "hit chunks", "hit tokens", "stored chunks", "evicted", "checksum errors")
    for column in columns:
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
    return table


def _bytes_table(summary: dict[str, Any]) -> Table:
    table = Table(title="bytes moved", title_justify="left")
    table.add_column("direction")
    table.add_column("bytes", justify="right")
    for direction, num_bytes in summary.get("bytes", {}).items():
        table.add_row(direction, f"{num_bytes:,.0f}")
    return table


def next_steps(directory: Path) -> list[NextStep]:
    """Commands to try after the demo, on the demo's own directory."""
    store = shlex.quote(str(directory / "store"))
    port = _LIVE_METRICS_PORT
    return [
        NextStep(
            "inspect the store",
            (
                f"kvstore stat {store}",
                f"kvstore ls {store} --sort hits --limit 10",
                f"kvstore verify {store}",
            ),
        ),
        NextStep(
            "watch the metrics while an engine runs, in two terminals",
            (
                f"kvstore demo --dir {shlex.quote(str(directory))} --metrics-port {port}",
                f'watch -n1 "curl -s 127.0.0.1:{port}/metrics | grep ^kvstore_hit_tokens_total"',
            ),
        ),
        NextStep(
            "the store's own metrics, without an engine",
            (f"kvstore serve {store} --port {_STORE_METRICS_PORT}",),
        ),
        _prometheus_step(),
        NextStep(
            "time to first token with and without kvstore, on a larger model",
            ("kvstore bench connector",),
        ),
    ]


def _prometheus_step() -> NextStep:
    """Prometheus scraping both ports (grafana/ of a source checkout, beside the package)."""
    grafana = Path(__file__).resolve().parents[2] / "grafana"
    what = f"Prometheus scraping ports {_LIVE_METRICS_PORT} and {_STORE_METRICS_PORT}"
    if not (grafana / "prometheus.yml").is_file():
        return NextStep(f"{what}, and Grafana: see grafana/README.md in kvstore's repository", ())
    shown = _shortest(grafana)
    return NextStep(
        f"{what} (Grafana: {shown / 'README.md'})",
        (f"prometheus --config.file={shlex.quote(str(shown / 'prometheus.yml'))}",),
    )


def _shortest(path: Path) -> Path:
    """`path` relative to the working directory when it lies under it, else absolute."""
    relative = Path(os.path.relpath(path))
    return path if relative.parts[:1] == ("..",) else relative


def print_next_steps(console: Console, steps: list[NextStep]) -> None:
    console.print("[bold]what next[/bold]")
    for step in steps:
        console.print(f"  {escape(step.what)}:", soft_wrap=True)
        for command in step.commands:
            console.print(f"    [cyan]{escape(command)}[/cyan]", soft_wrap=True)
