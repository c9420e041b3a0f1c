"""Scenario 7, exposure: endpoints bind loopback unless told, files are private, ports in use
fail at start naming their key, and no format runs code on load."""

from __future__ import annotations

from reliability.exposure import CHECKS, Check, runtime_ports_in_use_name_keys
from reliability.registry import Outcome, RunContext, scenario


@scenario(
    "exposure",
    number=7,
    title="exposure",
    pass_rule="every check passes: loopback binds by default, store 0700/0600, region 0600, "
    "a port in use fails at start naming its key, no pickle/eval/torch.load on any load path",
    timeout_s=300,
    smoke_timeout_s=120,
    history=(
        "a ZMQ events or replay endpoint in use raised a bare ZMQError and leaked the context; "
        "now ConfigError naming events_endpoint / events_replay_endpoint",
        "an existing empty directory kept its mode (e.g. 0755) when it became a store; now 0700",
    ),
)
def exposure(ctx: RunContext) -> Outcome:
    checks: list[Check] = [check() for check in CHECKS]
    checks.extend(runtime_ports_in_use_name_keys())
    failed = [f"{c.name}: {c.detail}" for c in checks if not c.passed]
    return Outcome(
        trials=len(checks),
        faults_injected=sum("in use" in c.name for c in checks),
        passed=not failed,
        found=failed,
        details={"checks": {c.name: c.passed for c in checks}},
    )
