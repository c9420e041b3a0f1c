"""Prompt traces for the simulator: JSONL, one `{"prompt_token_ids": [int, ...]}` a line."""

from __future__ import annotations

import json
from pathlib import Path

from kvstore.errors import KVStoreError

__all__ = ["TraceFormatError", "load_trace"]


class TraceFormatError(KVStoreError, ValueError):
    """A trace file line is not `{"prompt_token_ids": [int, ...]}`."""


def load_trace(path: str | Path) -> list[list[int]]:
    """Prompts from JSONL, one `{"prompt_token_ids": [...]}` per line (blank lines skipped)."""
    prompts: list[list[int]] = []
    with Path(path).open("rb") as lines:
        for line_number, raw in enumerate(lines, start=1):
            where = f"{path}:{line_number}"
            try:
                line = raw.decode()
            except UnicodeDecodeError as exc:
                raise TraceFormatError(f"{where}: not UTF-8 ({exc.reason})") from exc
            if line.strip():
                prompts.append(_parse_line(line, where))
    return prompts


def _parse_line(line: str, where: str) -> list[int]:
    try:
        record = json.loads(line)
    except json.JSONDecodeError as exc:
        raise TraceFormatError(f"{where}: not JSON ({exc.msg})") from exc
    except (ValueError, RecursionError) as exc:  # an int of > 4300 digits, too deep nesting
        raise TraceFormatError(f"{where}: not a trace record ({str(exc)[:80]})") from exc
    token_ids = record.get("prompt_token_ids") if isinstance(record, dict) else None
    if not isinstance(token_ids, list):
        raise TraceFormatError(
            f'{where}: expected an object with "prompt_token_ids": [int, ...], '
            f"got {line.strip()[:80]!r}"
        )
    if not all(isinstance(token, int) and not isinstance(token, bool) for token in token_ids):
        raise TraceFormatError(f"{where}: prompt_token_ids must all be integers")
    return token_ids
