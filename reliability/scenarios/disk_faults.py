"""Scenario 3 at the store level (no engine yet): a full filesystem, a directory made
read-only mid-run, a data file truncated, replaced or overwritten under an open store."""

from __future__ import annotations

__all__ = ["disk_faults"]

from reliability.disk_faults import (
    SWAPS,
    TrialResult,
    fill_until_full,
    read_only_mid_run,
    swap_under_open_store,
)
from reliability.fs import MountUnavailable, small_filesystem
from reliability.registry import Outcome, RunContext, scenario

_FS_BYTES = 8 << 20


@scenario(
    "disk-faults",
    number=3,
    title="disk full and failing disk (store level, no engine)",
    pass_rule="no crash or signal; every write refused by the fault fails with a TierError; "
    "0 acknowledged chunks lost, 0 wrong bytes; verify exits 0 after a full disk; a file "
    "truncated or replaced under an open store is refused on the next read",
    timeout_s=900,
    smoke_timeout_s=180,
    needs=("root", "mount"),
    history=(
        "with LMDB's writemap (the old default) a full filesystem killed the writer with SIGBUS; "
        "writemap is now off by default and the commit fails with StoreIOError",
        "LMDB errors inside transactions (ENOSPC/EIO as 'Input/output error', MDB_BAD_TXN, "
        "MDB_CORRUPTED) escaped as lmdb.Error; now StoreIOError",
    ),
)
def disk_faults(ctx: RunContext) -> Outcome:
    trials: list[tuple[str, TrialResult]] = []
    notes: list[str] = []
    try:
        for trial in range(ctx.trials(smoke=1, full=20)):
            with small_filesystem(_FS_BYTES) as directory:
                result, _ = fill_until_full(directory, ctx.seed + trial)
                trials.append(("full filesystem", result))
    except MountUnavailable as exc:
        notes.append(f"full-filesystem trials skipped: {exc}")
    for trial in range(ctx.trials(smoke=1, full=5)):
        trials.append(("read-only directory", read_only_mid_run(ctx.seed + trial)))
    for trial in range(ctx.trials(smoke=1, full=10)):
        for how in SWAPS:
            directory = ctx.workdir / f"swap-{how}-{trial}"
            directory.mkdir(parents=True)
            trials.append((f"data file {how}", swap_under_open_store(directory, how, trial)))
    return _outcome(trials, notes)


def _outcome(trials: list[tuple[str, TrialResult]], notes: list[str]) -> Outcome:
    found = [f"{kind}: {r.how}" for kind, r in trials if r.how != "returned"]
    found += [f"{kind}: {r.num_lost} lost, {r.num_bad} bad" for kind, r in trials
              if r.num_lost or r.num_bad]  # fmt: skip
    found += [f"{kind}: verify failed: {r.notes}" for kind, r in trials if r.is_verify_ok is False]
    found += [
        f"{kind}: {r.num_detected}/{r.num_acked} reads refused after the swap"
        for kind, r in trials
        if kind.startswith("data file") and r.num_detected != r.num_acked
    ]
    errors = sorted({e for _, r in trials for e in r.errors})
    return Outcome(
        trials=len(trials),
        faults_injected=sum(r.num_refused + r.num_detected for _, r in trials),
        passed=not found,
        chunks_lost=sum(r.num_lost for _, r in trials),
        bad_tokens_served=None,
        found=found,
        details={
            "errors_seen": errors,
            "num_bad_values": sum(r.num_bad for _, r in trials),
            "num_acknowledged": sum(r.num_acked for _, r in trials),
            "notes": notes,
            "kinds": sorted({kind for kind, _ in trials}),
        },
    )
