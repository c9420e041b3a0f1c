"""`kvstore simulate TRACE`: capacity planning by replaying a prompt trace through the pipeline.

Each prompt goes through `kvstore.simulate.simulate_replicas` (the real `TierPipeline` over an
in-memory tier service, driven the way vLLM drives the connector). One run prints the hits per tier;
`--replicas N` spreads the prompts over N engines (`--routing`), each with its own CPU and disk
tiers, sharing one remote tier of `--remote-bytes` (Redis with allkeys-lru), and adds a row per
replica. `--sweep` tries every combination of the comma-separated
`--cpu-bytes`/`--disk-bytes`/`--remote-bytes` sizes and repeated `--policy`, and `--plot` draws hit
ratio against size. `--make-trace OUT` writes a sample multi-turn chat trace to try it on.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from kvstore.cli._common import (
    UsageError,
    cli_errors,
    emit_json,
    err_console,
    format_bytes,
    parse_size_option,
)
from kvstore.cli._describe import new_table
from kvstore.cli._trace import ChatTraceSpec, make_chat_trace, write_trace
from kvstore.cli.app import app

if TYPE_CHECKING:  # the simulator loads when a simulation runs, not for `kvstore --help`
    from kvstore.simulate import ReplicaSimulation, SimulationResult

__all__ = ["Policy", "Routing", "SimulationPlan", "simulate_command"]

# KV bytes per token of Llama-3.1-8B in bf16: 32 layers x 8 KV heads x 128 dims x (K, V) x 2 B.
DEFAULT_BYTES_PER_TOKEN = 32 * 8 * 128 * 2 * 2


class Policy(StrEnum):
    LRU = "lru"
    ARC = "arc"


class Routing(StrEnum):
    """How the router spreads prompts over replicas (see `kvstore.simulate.ROUTINGS`)."""

    ROUND_ROBIN = "round-robin"
    RANDOM = "random"


class SimulationPlan:
    """Validated sizes of a run or a sweep."""

    def __init__(
        self,
        cpu_bytes: str,
        disk_bytes: str,
        chunk_bytes: str | None,
        block_size: int,
        remote_bytes: str = "0",
    ) -> None:
        self.block_size = block_size
        self.chunk_bytes = (
            block_size * DEFAULT_BYTES_PER_TOKEN
            if chunk_bytes is None
            else parse_size_option("--chunk-bytes", chunk_bytes)
        )
        if self.chunk_bytes < 1:
            raise UsageError(f"--chunk-bytes must be at least 1 byte, got {chunk_bytes!r}")
        self.cpu_sizes = _size_list("--cpu-bytes", cpu_bytes)
        self.disk_sizes = _size_list("--disk-bytes", disk_bytes)
        self.remote_sizes = _size_list("--remote-bytes", remote_bytes)
        for size in self.cpu_sizes:
            if size < self.chunk_bytes:
                raise UsageError(
                    f"--cpu-bytes {format_bytes(size)} holds no chunk of "
                    f"{format_bytes(self.chunk_bytes)} (--chunk-bytes); give more"
                )
        for option, sizes in (
            ("--disk-bytes", self.disk_sizes),
            ("--remote-bytes", self.remote_sizes),
        ):
            for size in sizes:
                if 0 < size < self.chunk_bytes:
                    tier = option.removeprefix("--").removesuffix("-bytes")
                    raise UsageError(
                        f"{option} {format_bytes(size)} must be 0 (no {tier} tier) or hold at "
                        f"least one chunk of {format_bytes(self.chunk_bytes)}"
                    )

    @property
    def num_runs(self) -> int:
        return len(self.cpu_sizes) * len(self.disk_sizes) * len(self.remote_sizes)


def _size_list(option: str, text: str) -> list[int]:
    sizes = [parse_size_option(option, part) for part in text.split(",") if part.strip()]
    if not sizes:
        raise UsageError(f"{option}: expected one size or a comma-separated list, got {text!r}")
    return sizes


@dataclass(frozen=True, slots=True)
class Fleet:
    """The replicas a run models and how prompts reach them."""

    num_replicas: int = 1
    routing: Routing = Routing.ROUND_ROBIN
    seed: int = 0
    engine_chunks: int = 0
    admission_min_sightings: int = 1


def _run_all(
    prompts: list[list[int]], plan: SimulationPlan, policies: list[Policy], fleet: Fleet
) -> list[ReplicaSimulation]:
    """`simulate_replicas` for every policy x CPU x disk x remote size, with a progress line on
    stderr."""
    runs = [
        (policy, cpu, disk, remote)
        for policy in policies
        for cpu in plan.cpu_sizes
        for disk in plan.disk_sizes
        for remote in plan.remote_sizes
    ]
    from kvstore.simulate import simulate_replicas

    results: list[ReplicaSimulation] = []
    with err_console().status("simulating") as status:
        for policy, cpu, disk, remote in runs:
            status.update(f"simulating {len(results) + 1}/{len(runs)}")
            results.append(
                simulate_replicas(
                    prompts,
                    num_replicas=fleet.num_replicas,
                    remote_bytes=remote,
                    num_tokens_per_chunk=plan.block_size,
                    cpu_rows=cpu // plan.chunk_bytes,
                    disk_bytes=disk,
                    chunk_bytes=plan.chunk_bytes,
                    policy=policy.value,
                    engine_chunks=fleet.engine_chunks,
                    admission_min_sightings=fleet.admission_min_sightings,
                    routing=fleet.routing.value,
                    seed=fleet.seed,
                )
            )
    return results


def _ratio(part: int, whole: int) -> float:
    return round(part / whole, 6) if whole else 0.0


def result_json(result: SimulationResult, chunk_bytes: int) -> dict[str, Any]:
    """`SimulationResult.as_row()` plus the sizes in bytes and per-tier ratios."""
    num_asked = result.num_chunks - result.num_engine_hit_chunks
    row: dict[str, Any] = dict(result.as_row())
    row.update(
        cpu_bytes=result.num_cpu_rows * chunk_bytes,
        disk_bytes=result.disk_capacity_bytes,
        remote_bytes=result.remote_capacity_bytes,
        chunk_bytes=chunk_bytes,
        num_hit_tokens=result.num_hit_tokens,
        cpu_hit_ratio=_ratio(result.num_cpu_hit_chunks, num_asked),
        disk_hit_ratio=_ratio(result.num_disk_hit_chunks, num_asked),
        remote_hit_ratio=_ratio(result.num_remote_hit_chunks, num_asked),
    )
    return row


def simulation_json(simulation: ReplicaSimulation, chunk_bytes: int) -> dict[str, Any]:
    """Every replica together (`result_json`), the fleet, and one row per replica."""
    return {
        **result_json(simulation.overall, chunk_bytes),
        "num_replicas": len(simulation.replicas),
        "routing": simulation.routing,
        "per_replica": [
            {"replica": i, **result_json(result, chunk_bytes)}
            for i, result in enumerate(simulation.replicas)
        ],
    }


def _percent(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f}%" if whole else "-"


def _title(row: dict[str, Any]) -> str:
    """E.g. `lru: 4 replicas (random) of cpu 64.0 MiB (16 rows), disk 0 B each, remote 1.0 GiB
    shared, chunk 4.0 MiB`."""
    tiers = (
        f"cpu {format_bytes(row['cpu_bytes'])} ({row['num_cpu_rows']:,} rows), "
        f"disk {format_bytes(row['disk_bytes'])}"
    )
    is_fleet = row["num_replicas"] > 1
    if is_fleet:
        tiers = f"{row['num_replicas']} replicas ({row['routing']}) of {tiers} each"
    if row["remote_bytes"]:
        tiers += f", remote {format_bytes(row['remote_bytes'])}" + (" shared" if is_fleet else "")
    return f"{row['policy']}: {tiers}, chunk {format_bytes(row['chunk_bytes'])}"


def _print_single(row: dict[str, Any]) -> None:
    console = Console(highlight=False)
    num_tokens = row["num_tokens_per_chunk"]
    numeric = ("chunks", "tokens", "of prompt chunks")
    table = new_table("served by", "chunks", "tokens", "of prompt chunks", numeric=numeric)
    served = [
        ("engine prefix cache", row["num_engine_hit_chunks"]),
        ("kvstore cpu", row["num_cpu_hit_chunks"]),
        ("kvstore disk", row["num_disk_hit_chunks"]),
        *([("kvstore remote", row["num_remote_hit_chunks"])] if row["remote_bytes"] else []),
        ("computed (miss)", row["num_miss_chunks"]),
    ]
    for label, chunks in served:
        table.add_row(
            label, f"{chunks:,}", f"{chunks * num_tokens:,}", _percent(chunks, row["num_chunks"])
        )
    table.title = _title(row)
    console.print(table)
    remote = f", remote {100 * row['remote_hit_ratio']:.1f}%" if row["remote_bytes"] else ""
    console.print(
        f"{row['num_requests']:,} requests, {row['num_prompt_tokens']:,} prompt tokens; "
        f"offload hit ratio {100 * row['hit_ratio']:.1f}% "
        f"(cpu {100 * row['cpu_hit_ratio']:.1f}%, disk {100 * row['disk_hit_ratio']:.1f}%"
        f"{remote})"
    )
    if row["num_replicas"] > 1:
        console.print(_replica_table(row["per_replica"]))


def _replica_table(rows: list[dict[str, Any]]) -> Table:
    columns = ("replica", "requests", "cpu hits", "disk hits", "remote hits", "computed")
    table = new_table(*columns, "hit ratio", numeric=(*columns, "hit ratio"), title="per replica")
    for row in rows:
        table.add_row(
            str(row["replica"]),
            f"{row['num_requests']:,}",
            *(
                f"{row[name]:,}"
                for name in (
                    "num_cpu_hit_chunks",
                    "num_disk_hit_chunks",
                    "num_remote_hit_chunks",
                    "num_miss_chunks",
                )
            ),
            f"{100 * row['hit_ratio']:.1f}%",
        )
    return table


def _print_sweep(rows: list[dict[str, Any]]) -> None:
    """One row per run. With a remote tier, headers take two lines and the hit tokens (in the
    JSON) make room for its size and hits; sizes wrap rather than get cut in a narrow pipe."""
    has_remote = any(row["remote_bytes"] for row in rows)
    tiers = ("cpu", "disk", "remote") if has_remote else ("cpu", "disk")
    sep = "\n" if has_remote else " "
    tokens = () if has_remote else ("hit tokens",)
    columns = ("policy", *tiers, *(f"{tier}{sep}hits" for tier in tiers), *tokens, f"hit{sep}ratio")
    title = "simulated hit rates"
    if rows and rows[0]["num_replicas"] > 1:
        title += f" of {rows[0]['num_replicas']} replicas ({rows[0]['routing']})"
    table = new_table(*columns, numeric=columns[1:], wrap=tiers, title=title)
    for row in rows:
        table.add_row(
            row["policy"],
            *(format_bytes(row[f"{tier}_bytes"]) for tier in tiers),
            *(f"{row[f'num_{tier}_hit_chunks']:,}" for tier in tiers),
            *(() if has_remote else (f"{row['num_hit_tokens']:,}",)),
            f"{100 * row['hit_ratio']:.1f}%",
        )
    Console(highlight=False).print(table)


def _make_trace(out: Path, spec: ChatTraceSpec, *, as_json: bool) -> None:
    prompts = make_chat_trace(spec)
    write_trace(out, prompts)
    document = {
        "trace_path": str(out),
        "num_requests": len(prompts),
        "num_prompt_tokens": sum(len(p) for p in prompts),
        "num_conversations": spec.num_conversations,
        "num_turns": spec.num_turns,
    }
    if as_json:
        emit_json(document)
    else:
        Console(highlight=False).print(
            f"wrote {out}: {len(prompts)} prompts, {document['num_prompt_tokens']:,} tokens "
            f"({spec.num_conversations} conversations x {spec.num_turns} turns)"
        )


def _load(trace: Path | None) -> list[list[int]]:
    from kvstore.simulate import TraceFormatError, load_trace

    if trace is None:
        raise UsageError("give a TRACE file (or --make-trace OUT.jsonl to write a sample one)")
    if not trace.is_file():
        raise UsageError(f"trace {trace} is not a file; expected JSONL of prompt_token_ids")
    try:
        return load_trace(trace)
    except (TraceFormatError, UnicodeDecodeError) as exc:
        raise UsageError(str(exc)) from exc


def _check_options(
    plan: SimulationPlan, policies: list[Policy], *, is_sweep: bool, plot: Path | None
) -> None:
    if not is_sweep and (plan.num_runs > 1 or len(policies) > 1):
        raise UsageError("several sizes or policies need --sweep")
    if plot is not None and not is_sweep:
        raise UsageError("--plot draws a sweep; add --sweep")


@app.command(name="simulate")
def simulate_command(
    trace: Annotated[
        Path | None, typer.Argument(help='JSONL trace: one {"prompt_token_ids": [...]} a line.')
    ] = None,
    cpu_bytes: Annotated[
        str | None, typer.Option(help="CPU tier size, e.g. 4GiB (comma-separated with --sweep).")
    ] = None,
    disk_bytes: Annotated[
        str, typer.Option(help="Disk tier size, 0 = none (comma-separated with --sweep).")
    ] = "0",
    replicas: Annotated[
        int, typer.Option(min=1, help="Engines, each with its own cpu and disk tiers.")
    ] = 1,
    remote_bytes: Annotated[
        str,
        typer.Option(
            help="Remote tier (Redis, allkeys-lru) all replicas share, 0 = none "
            "(comma-separated with --sweep)."
        ),
    ] = "0",
    routing: Annotated[
        Routing, typer.Option(help="How prompts reach replicas (random uses --seed).")
    ] = Routing.ROUND_ROBIN,
    policy: Annotated[
        list[Policy] | None, typer.Option(help="Eviction policy, both tiers (repeat to sweep).")
    ] = None,
    block_size: Annotated[int, typer.Option(min=1, help="Tokens per chunk.")] = 32,
    chunk_bytes: Annotated[
        str | None,
        typer.Option(help="Bytes of one chunk [default: block size x 128 KiB, Llama-3-8B bf16]."),
    ] = None,
    engine_chunks: Annotated[
        int, typer.Option(min=0, help="Chunks the engine's own prefix cache holds (0 = none).")
    ] = 0,
    admission: Annotated[
        int,
        typer.Option(
            min=1,
            help="admission_min_sightings: write a chunk to disk once seen this many times.",
        ),
    ] = 1,
    is_sweep: Annotated[bool, typer.Option("--sweep", help="Try every size and policy.")] = False,
    plot: Annotated[Path | None, typer.Option(help="With --sweep: write a PNG here.")] = None,
    make_trace: Annotated[
        Path | None, typer.Option(help="Write a sample multi-turn chat trace here and exit.")
    ] = None,
    conversations: Annotated[int, typer.Option(min=1, help="--make-trace: conversations.")] = 8,
    turns: Annotated[int, typer.Option(min=1, help="--make-trace: turns each.")] = 6,
    seed: Annotated[
        int, typer.Option(help="Random seed of --make-trace and of --routing random.")
    ] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="One JSON document on stdout.")] = False,
) -> None:
    """Replay a prompt trace through the real tier pipeline and print hit rates per tier."""
    with cli_errors():
        if make_trace is not None:
            spec = ChatTraceSpec(num_conversations=conversations, num_turns=turns, seed=seed)
            _make_trace(make_trace, spec, as_json=as_json)
            return
        if cpu_bytes is None:
            raise UsageError("--cpu-bytes is required, e.g. --cpu-bytes 4GiB")
        policies = list(dict.fromkeys(policy or [Policy.LRU]))
        plan = SimulationPlan(cpu_bytes, disk_bytes, chunk_bytes, block_size, remote_bytes)
        _check_options(plan, policies, is_sweep=is_sweep, plot=plot)
        prompts = _load(trace)
        fleet = Fleet(replicas, routing, seed, engine_chunks, admission)
        results = _run_all(prompts, plan, policies, fleet)
        rows = [simulation_json(result, plan.chunk_bytes) for result in results]
        if plot is not None:
            overall = [result.overall for result in results]
            from kvstore.cli._plot import plot_sweep

            plot_sweep(overall, plot, chunk_bytes=plan.chunk_bytes, title=str(trace))
            err_console().print(f"wrote {plot}")
    if as_json:
        emit_json({"trace_path": str(trace), "results": rows} if is_sweep else rows[0])
    elif is_sweep:
        _print_sweep(rows)
    else:
        _print_single(rows[0])
