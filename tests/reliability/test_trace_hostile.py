"""`load_trace` (`kvstore simulate TRACE`) on hostile JSONL: a TraceFormatError naming the line,
never a UnicodeDecodeError, RecursionError or a bare ValueError."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvstore.simulate import TraceFormatError, load_trace


@pytest.mark.parametrize(
    ("line", "why"),
    [
        (b"\x80\xff", "not UTF-8"),
        (b"[" * 100_000, "not"),
        (b'{"prompt_token_ids": [1' + b"0" * 5000 + b"]}", "not"),
    ],
    ids=["not-utf8", "deep", "huge-int"],
)
def test_a_hostile_line_is_a_trace_format_error(tmp_path: Path, line: bytes, why: str) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_bytes(b'{"prompt_token_ids": [1, 2]}\n' + line + b"\n")
    with pytest.raises(TraceFormatError, match=f"trace.jsonl:2: {why}"):
        load_trace(trace)


def test_a_good_trace_still_loads(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    trace.write_text('{"prompt_token_ids": [1, 2]}\n\n{"prompt_token_ids": [3]}\n')
    assert load_trace(trace) == [[1, 2], [3]]
