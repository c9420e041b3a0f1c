"""`kvstore simulate`: the same hit counts as `kvstore.simulate.simulate`, sweeps and plots."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.simulate import load_trace, simulate

from .helpers import run, run_json

CHUNK_BYTES = 1 << 20
BLOCK = 32


@pytest.fixture
def trace(tmp_path: Path) -> Path:
    path = tmp_path / "trace.jsonl"
    doc = run_json(
        "simulate", "--make-trace", path, "--conversations", "4", "--turns", "4", "--seed", "7"
    )
    assert doc["num_requests"] == 16
    assert doc["num_prompt_tokens"] == sum(len(p) for p in load_trace(path))
    return path


def direct(trace: Path, cpu_bytes: int, disk_bytes: int, policy: str) -> dict[str, object]:
    result = simulate(
        load_trace(trace),
        num_tokens_per_chunk=BLOCK,
        cpu_rows=cpu_bytes // CHUNK_BYTES,
        disk_bytes=disk_bytes,
        chunk_bytes=CHUNK_BYTES,
        policy=policy,
        engine_chunks=8,
    )
    return dict(result.as_row())


SIZES = ("--block-size", str(BLOCK), "--chunk-bytes", "1MiB", "--engine-chunks", "8")


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_simulate_matches_the_library(trace: Path, policy: str) -> None:
    doc = run_json(
        "simulate", trace, "--cpu-bytes", "8MiB", "--disk-bytes", "32MiB", "--policy", policy,
        *SIZES,
    )  # fmt: skip
    expected = direct(trace, 8 << 20, 32 << 20, policy)
    assert {key: doc[key] for key in expected} == expected
    assert doc["num_cpu_hit_chunks"] > 0
    assert doc["num_disk_hit_chunks"] > 0
    assert (doc["cpu_bytes"], doc["disk_bytes"], doc["chunk_bytes"]) == (8 << 20, 32 << 20, 1 << 20)
    asked = doc["num_chunks"] - doc["num_engine_hit_chunks"]
    assert doc["cpu_hit_ratio"] == pytest.approx(doc["num_cpu_hit_chunks"] / asked, abs=1e-6)


def test_admission_delays_disk_writes_to_a_chunk_s_second_sighting(tmp_path: Path) -> None:
    """`--admission 2` (`admission_min_sightings`): prompts seen once write nothing to disk;
    seen twice, they are written at the second sighting (and only then can a third be served
    from disk)."""
    path = tmp_path / "twice.jsonl"
    prompts = [[(7 * p + i) % 900 + 1 for i in range(4 * BLOCK + 5)] for p in range(12)]
    lines = [f'{{"prompt_token_ids": {prompt}}}' for prompt in prompts * 3]
    path.write_text("\n".join(lines) + "\n")
    tiny = ("--cpu-bytes", "8MiB", "--disk-bytes", "256MiB", *SIZES[:4])  # 8 rows, 48 chunks
    once = run_json("simulate", path, *tiny)
    twice = run_json("simulate", path, *tiny, "--admission", "2")
    assert once["num_written_chunks"] == twice["num_written_chunks"] == 12 * 4
    assert once["num_disk_hit_chunks"] > twice["num_disk_hit_chunks"] > 0
    single = tmp_path / "once.jsonl"
    single.write_text("\n".join(lines[:12]) + "\n")
    assert run_json("simulate", single, *tiny, "--admission", "2")["num_written_chunks"] == 0
    assert run_json("simulate", single, *tiny)["num_written_chunks"] == 12 * 4


def test_simulate_human_prints_hits_per_tier(trace: Path) -> None:
    result = run("simulate", trace, "--cpu-bytes", "8MiB", "--disk-bytes", "32MiB", *SIZES)
    assert result.exit_code == 0, result.stderr
    expected = direct(trace, 8 << 20, 32 << 20, "lru")
    for text in ("kvstore cpu", "kvstore disk", "computed (miss)", "offload hit ratio"):
        assert text in result.stdout
    assert f"{expected['num_disk_hit_chunks']:,}" in result.stdout


def test_sweep_runs_every_combination(trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "hits.png"
    args = ("--cpu-bytes", "2MiB,8MiB,32MiB", "--disk-bytes", "0,64MiB", "--sweep")
    doc = run_json(
        "simulate", trace, *args, "--policy", "lru", "--policy", "arc", "--plot", plot, *SIZES
    )
    results = doc["results"]
    assert len(results) == 2 * 3 * 2
    combos = [(r["policy"], r["cpu_bytes"], r["disk_bytes"]) for r in results]
    assert combos == [
        (policy, cpu << 20, disk << 20)
        for policy in ("lru", "arc")
        for cpu in (2, 8, 32)
        for disk in (0, 64)
    ]
    for row in results:
        expected = direct(trace, row["cpu_bytes"], row["disk_bytes"], row["policy"])
        assert row["num_hit_chunks"] == expected["num_hit_chunks"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sweep_human_table_and_a_plot_over_disk_sizes(trace: Path, tmp_path: Path) -> None:
    plot = tmp_path / "disk.png"
    args = ("--cpu-bytes", "4MiB", "--disk-bytes", "0,16MiB,64MiB", "--sweep", "--plot", plot)
    result = run("simulate", trace, *args, *SIZES)
    assert result.exit_code == 0, result.stderr
    assert "simulated hit rates" in result.stdout
    assert "hit ratio" in result.stdout
    rows = [line.split() for line in result.stdout.splitlines() if line.startswith(" lru")]
    assert [row[1:3] for row in rows] == [["4.0", "MiB"]] * 3
    assert plot.stat().st_size > 1000
    assert f"wrote {plot}" in result.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--disk-bytes", "1GiB"), "--cpu-bytes is required"),
        (("--cpu-bytes", "lots"), "--cpu-bytes"),
        (("--cpu-bytes", "1MiB,2MiB"), "need --sweep"),
        (("--cpu-bytes", "1MiB", "--policy", "lru", "--policy", "arc"), "need --sweep"),
        (("--cpu-bytes", "1MiB", "--plot", "x.png"), "add --sweep"),
        (("--cpu-bytes", "512KiB"), "holds no chunk"),
        (("--cpu-bytes", "1MiB", "--disk-bytes", "100KiB"), "at least one chunk"),
    ],
)
def test_simulate_usage_errors(trace: Path, args: tuple[str, ...], message: str) -> None:
    result = run("simulate", trace, *args, "--chunk-bytes", "1MiB")
    assert result.exit_code == 2, result.stderr
    assert message in result.stderr
    assert result.stdout == ""


def test_simulate_needs_a_trace(tmp_path: Path) -> None:
    result = run("simulate", "--cpu-bytes", "1GiB")
    assert result.exit_code == 2
    assert "--make-trace" in result.stderr
    missing = run("simulate", tmp_path / "nope.jsonl", "--cpu-bytes", "1GiB")
    assert missing.exit_code == 2
    assert "is not a file" in missing.stderr


def test_simulate_rejects_a_malformed_trace(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt_token_ids": [1, 2, 3]}\n{"prompt": "hello"}\n')
    result = run("simulate", bad, "--cpu-bytes", "1GiB")
    assert result.exit_code == 2
    assert f"{bad}:2" in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1
