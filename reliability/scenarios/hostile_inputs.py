"""Scenario 4, hostile inputs: every record kvstore parses, fuzzed; damaged store files."""

from __future__ import annotations

from reliability.checks import Crash
from reliability.damage import DAMAGES, check_damage
from reliability.fuzz import FuzzTarget, run_target
from reliability.parser_targets import PARSER_TARGETS, lmdb_tier_options_target
from reliability.registry import Outcome, RunContext, scenario
from reliability.store_targets import STORE_TARGETS

_HISTORY = (
    "store records (format, capacity, namespace, counts, meta) crashed the API and every CLI "
    "command with DecodeError/KeyError/struct.error/UnicodeDecodeError; now StoreDamagedError "
    "(exit 1)",
    "a meta record with NaN/huge times or a 2^63 size crashed ls/stat/verify; a counts record "
    "gone negative wedged deletes (so --repair could not repair), and one claiming more bytes "
    "than the file holds refused every write as full, forever; now recounted",
    "a data.mdb truncated before open or under an open store killed the process with SIGBUS; "
    "now refused (StoreDamagedError / StoreIOError)",
    "two namespace registrations claiming one ordinal would hand one model's chunks to another "
    "with valid checksums; now refused",
    "one registration emptied or deleted and another rewritten to its ordinal still handed one "
    "namespace's chunks to the other (CI fuzz); now a namespace reads only while every other "
    "registration names its own ordinal and no entry sits under an unclaimed one",
    "decode_batch raised RecursionError on deeply nested batches, and `kvstore watch` crashed on "
    "a NaN or huge timestamp; ChunkLayout.from_dict accepted negative shapes and misaligned "
    "offsets (torch RuntimeError in `kvstore show`); load_trace raised UnicodeDecodeError; "
    "from_extra_config raised TypeError/OverflowError and accepted an infinite timeout",
)


def _targets() -> list[FuzzTarget]:
    targets = [*STORE_TARGETS, *PARSER_TARGETS]
    options = lmdb_tier_options_target()
    if options is not None:
        targets.append(options)
    return targets


@scenario(
    "hostile-inputs",
    number=4,
    title="hostile inputs (fuzzed records, damaged files)",
    pass_rule="0 crashes, 0 hangs, 0 wrong bytes returned: every input is accepted or refused "
    "with kvstore's own error; damaged store files make verify/stat/ls exit 1 with one line",
    timeout_s=1500,
    smoke_timeout_s=240,
    history=_HISTORY,
)
def hostile_inputs(ctx: RunContext) -> Outcome:
    scale = ctx.trials(smoke=1, full=5)
    found: list[str] = []
    per_target: dict[str, int] = {}
    for index, target in enumerate(_targets()):
        examples = max(3, target.max_examples * scale // (10 if ctx.is_smoke else 1))
        result = run_target(target, max_examples=examples, seed=ctx.seed + index)
        per_target[target.name] = result.num_inputs
        if result.crash:
            found.append(result.crash)
    num_files = 0
    for damage in DAMAGES:
        try:
            check_damage(damage)
        except Crash as exc:
            found.append(f"damaged file: {exc}")
        num_files += 1
    num_inputs = sum(per_target.values())
    return Outcome(
        trials=num_inputs + num_files,
        faults_injected=num_inputs + num_files,
        passed=not found,
        found=found,
        details={
            "inputs_per_target": per_target,
            "num_damaged_files": num_files,
            "num_crashes": len(found),
        },
    )
