"""`kvstore bench serve`: argument checks, the report's arithmetic, the word tokenizer against
vLLM's own dataset code, and one run of the real suite (two OpenAI servers, vLLM's client)."""

from __future__ import annotations

import importlib.util
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvstore.bench import serve
from kvstore.bench.engines import BENCH_SPEC
from kvstore.bench.serve_client import Workload, client_argv
from kvstore.bench.serve_report import TargetResult, format_report, ratios
from kvstore.bench.serve_server import ServerSpec, prompt_sources, server_command, server_env
from kvstore.cli import app
from kvstore.tiny_model import add_word_tokenizer, word_of


def _refused(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    with pytest.raises(SystemExit) as exited:
        serve.parse_args(list(argv))
    assert exited.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--num-prompts", "10", "--num-prefixes", "4"], "--num-prompts 10: must be a multiple"),
        (["--prefix-len", "8"], "--prefix-len 8: must be >= 32"),
        (["--output-len", "0"], "--output-len 0: must be >= 1"),
        (["--reserved-cpus", "-1"], "--reserved-cpus -1: must be in 0.."),
        (["--engine-cache-tokens", "100"], "must hold the 2 requests in flight"),
        (["--engine-cache-tokens", "16384"], "must be below the prefixes' 16384 tokens"),
        (["--cpu-bytes", "1024"], "each must hold at least 4 chunks"),
        (["--prefix-len", "16384"], "the model takes at most"),
        (["--targets", "nonsense"], "invalid choice: 'nonsense'"),
    ],
)
def test_bad_arguments_are_refused_naming_the_value_and_what_is_allowed(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert message in _refused(capsys, *argv)


def test_defaults_make_a_working_set_the_engine_cannot_hold_and_a_cpu_tier_between() -> None:
    for argv in ([], ["--quick"]):
        args = serve.parse_args(argv)
        w = Workload(args.prefix_len, args.suffix_len, args.num_prefixes, args.num_prompts,
                     args.output_len, args.max_concurrency)  # fmt: skip
        assert args.max_concurrency * w.request_tokens <= args.engine_cache_tokens
        assert args.engine_cache_tokens < args.num_prefixes * args.prefix_len
        cpu_tokens = args.cpu_bytes // BENCH_SPEC.kv_bytes_per_token
        assert args.engine_cache_tokens < cpu_tokens < w.unique_prompt_tokens
        assert args.disk_bytes > w.unique_prompt_tokens * BENCH_SPEC.kv_bytes_per_token
        assert args.reserved_cpus == 1
    assert serve.parse_args(["--quick"]).num_prompts < serve.parse_args([]).num_prompts


def test_every_server_gets_the_same_reservation_and_only_kvstore_a_connector(
    tmp_path: Path,
) -> None:
    spec = ServerSpec(tmp_path, 2048, 1 << 26, "bfloat16", reserved_cpus=1)
    assert server_env(spec)["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    assert server_env(spec)["VLLM_ENABLE_V1_MULTIPROCESSING"] == "1"
    plain = server_command(spec, 8000, None)
    assert "--kv-transfer-config" not in plain
    assert plain[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    transfer = {"kv_connector": "KVStoreConnector", "kv_connector_module_path": "kvstore.vllm"}
    with_kvstore = server_command(spec, 8000, transfer)
    assert json.loads(with_kvstore[-1]) == transfer
    assert with_kvstore[:-2] == plain


def test_the_client_arguments_parse_with_vllms_own_parser(tmp_path: Path) -> None:
    from vllm.benchmarks.serve import add_cli_args
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()  # type: ignore[no-untyped-call]
    add_cli_args(parser)
    workload = Workload(1024, 64, 4, 12, 8, 2, seed=3)
    args = parser.parse_args(client_argv(workload, "http://127.0.0.1:1", tmp_path, tmp_path, "r"))
    assert args.dataset_name == "prefix_repetition"
    assert (args.prefix_repetition_prefix_len, args.prefix_repetition_suffix_len) == (1024, 64)
    assert (args.prefix_repetition_num_prefixes, args.num_prompts) == (4, 12)
    assert (args.max_concurrency, args.seed, args.ignore_eos) == (2, 3, True)
    assert args.save_result and args.result_filename == "r"


def test_the_word_tokenizer_round_trips_any_ids_and_vllms_dataset_gets_exact_lengths(
    tmp_path: Path,
) -> None:
    from transformers import AutoTokenizer
    from vllm.benchmarks.datasets.datasets import PrefixRepetitionRandomDataset
    from vllm.tokenizers import get_tokenizer

    add_word_tokenizer(tmp_path, 512)
    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path))
    assert tokenizer.vocab_size == 512
    ids = [0, 1, 2, *(random.Random(0).randrange(512) for _ in range(500))]
    text = str(tokenizer.decode(ids))
    assert text.split()[:4] == ["<unk>", "<s>", "</s>", word_of(ids[3])]
    assert tokenizer.encode(text) == ids  # nothing added, nothing merged
    samples = PrefixRepetitionRandomDataset(random_seed=0).sample(
        get_tokenizer(str(tmp_path)), 6, prefix_len=96, suffix_len=32, num_prefixes=2,
        output_len=4,
    )  # fmt: skip
    encoded = [tokenizer.encode(s.prompt) for s in samples]
    assert [len(e) for e in encoded] == [128] * 6
    assert [s.prompt_len for s in samples] == [128] * 6
    assert len({tuple(e[:96]) for e in encoded}) == 2  # two shared prefixes, as asked
    assert len({tuple(e[96:]) for e in encoded}) == 6


def test_a_second_build_of_the_same_tokenizer_writes_nothing(tmp_path: Path) -> None:
    add_word_tokenizer(tmp_path, 64)
    before = {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()}
    add_word_tokenizer(tmp_path, 64)
    assert {p.name: p.stat().st_mtime_ns for p in tmp_path.iterdir()} == before
    add_word_tokenizer(tmp_path, 128)  # another vocabulary: rebuilt
    assert json.loads((tmp_path / "tokenizer.json").read_text())["model"]["vocab"]["w127"] == 127


def _result(name: str, ttft: float, rps: float, **sources: float) -> TargetResult:
    bench = {"mean_ttft_ms": ttft, "median_ttft_ms": ttft / 2, "p99_ttft_ms": 3 * ttft,
             "request_throughput": rps, "output_throughput": 8 * rps, "completed": 12,
             "failed": 0}  # fmt: skip
    return TargetResult(name, name, bench, {"total": 1000.0, **sources})


def test_ratios_divide_each_target_by_the_baseline_of_the_same_run() -> None:
    results = {
        "baseline": _result("baseline", 400.0, 2.0, computed=800.0, device=200.0),
        "kvstore": _result("kvstore", 100.0, 5.0, computed=100.0, device=200.0, host=700.0),
    }
    got = ratios(results)
    assert list(got) == ["kvstore"]
    assert got["kvstore"]["mean_ttft_ms"] == pytest.approx(0.25)
    assert got["kvstore"]["p99_ttft_ms"] == pytest.approx(0.25)
    assert got["kvstore"]["request_throughput"] == pytest.approx(2.5)
    assert ratios({"kvstore": results["kvstore"]}) == {}  # no baseline, no ratio
    zero = {"baseline": _result("baseline", 0.0, 2.0), "kvstore": results["kvstore"]}
    assert math.isnan(ratios(zero)["kvstore"]["mean_ttft_ms"])


def test_the_report_shows_each_figure_the_sources_the_ratios_and_what_was_skipped() -> None:
    results = {
        "baseline": _result("baseline", 400.0, 2.0, computed=800.0, device=200.0),
        "kvstore": _result("kvstore", 100.0, 5.0, computed=100.0, device=200.0, host=600.0,
                           disk=100.0),
    }  # fmt: skip
    text = format_report(results, {"lmcache": "lmcache not installed"}, ["machine: 2 cores"])
    assert text.startswith("machine: 2 cores")
    assert "kvstore / baseline: mean TTFT ms 0.25x" in text
    assert "requests/s 2.50x" in text
    assert "lmcache: skipped: lmcache not installed" in text
    host = next(line for line in text.splitlines() if line.startswith("CPU tier (host)"))
    assert host.split()[-2:] == ["600", "(60%)"]
    assert "other external" not in text  # a source no target saw is left out


def test_prompt_sources_are_the_counters_deltas_by_source() -> None:
    labels = (("engine", "0"), ("model_name", "m"))

    def key(name: str, source: str | None = None) -> tuple[str, tuple[tuple[str, str], ...]]:
        extra = () if source is None else (("source", source),)
        return name, tuple(sorted(labels + extra))

    cached = "vllm:prompt_tokens_cached_by_source_total"
    by_source = "vllm:prompt_tokens_by_source_total"
    before = {key("vllm:prompt_tokens_total"): 100.0, key(cached, "device"): 10.0,
              key(by_source, "local_compute"): 90.0}  # fmt: skip
    after = {key("vllm:prompt_tokens_total"): 1100.0, key(cached, "device"): 110.0,
             key(cached, "host"): 500.0, key(cached, "disk"): 100.0,
             key(by_source, "local_compute"): 390.0, key(by_source, "local_cache_hit"): 110.0,
             key("vllm:prompt_tokens_cached_by_source_created", "host"): 1.7e9}  # fmt: skip
    got = prompt_sources(before, after)
    assert got == {"total": 1000.0, "device": 100.0, "host": 500.0, "disk": 100.0,
                   "computed": 300.0}  # fmt: skip


def test_lmcache_and_the_multi_turn_workload_say_why_they_were_skipped(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    skipped = serve.skip_reasons(serve.TARGETS)
    assert skipped["lmcache"].startswith("lmcache not installed")
    assert "not in the installed vllm wheel" in skipped["multi-turn workload"]
    assert "lmcache" not in serve.skip_reasons(["baseline", "kvstore"])


def test_the_cli_runs_serve_on_its_own_but_not_in_all() -> None:
    from kvstore.cli.bench import Suite

    assert Suite("serve") is Suite.SERVE
    result = CliRunner().invoke(app, ["bench", "--help"])
    assert "serve" in result.output


@pytest.mark.engine
@pytest.mark.timeout(600)
def test_the_quick_suite_serves_both_targets_and_kvstore_serves_prompt_tokens(
    tmp_path: Path,
) -> None:
    """The real suite, smallest mode: two OpenAI servers one after the other, vLLM's client.
    About 1.5-2 minutes on 2 AMX cores, mostly the two server starts; ~5 minutes with
    prefixes of 1024 tokens on a 2-vCPU EPYC without AVX-512, whose imports of vLLM take
    ~20 s a process."""
    out = tmp_path / "out"
    command = [sys.executable, "-m", "kvstore.bench.serve", "--quick", "--out", str(out),
               "--targets", "baseline", "kvstore"]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, timeout=540, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "VLLM_CPU_NUM_OF_RESERVED_CPU=1 for every server" in done.stdout
    assert "multi-turn workload: skipped:" in done.stdout
    document = json.loads((out / "serve.json").read_text())
    args = serve.parse_args(["--quick"])
    asked = args.num_prompts * (args.prefix_len + args.suffix_len)
    assert set(document["targets"]) == {"baseline", "kvstore"}
    for target in document["targets"].values():
        assert (target["completed"], target["failed"]) == (args.num_prompts, 0)
        assert target["total_input_tokens"] == asked  # the tokenizer kept every length
        assert target["sources"]["total"] == asked  # the server saw the same tokens
        for key in ("mean_ttft_ms", "median_ttft_ms", "p99_ttft_ms", "request_throughput"):
            assert target[key] > 0
    baseline, kvstore = document["targets"]["baseline"], document["targets"]["kvstore"]
    assert baseline["sources"].get("host", 0) + baseline["sources"].get("disk", 0) == 0
    offloaded = kvstore["sources"].get("host", 0) + kvstore["sources"].get("disk", 0)
    assert offloaded > 0  # some prompt tokens came from kvstore's tiers
    assert kvstore["sources"]["computed"] < baseline["sources"]["computed"]
    ratio = document["ratios_to_baseline"]["kvstore"]["mean_ttft_ms"]
    assert ratio == pytest.approx(kvstore["mean_ttft_ms"] / baseline["mean_ttft_ms"])
    assert (out / "serve.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
