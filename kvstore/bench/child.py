"""A benchmark engine in a child process, driven by one JSON line per request and answer.

vLLM logs on stdout too: answers are the lines that start with `{`. An answer with an `error`
key raises. Closing stdin ends the child.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Mapping
from typing import IO, Any

__all__ = ["JsonLineChild"]


class JsonLineChild:
    def __init__(self, argv: list[str], env: Mapping[str, str] | None = None) -> None:
        self.process = subprocess.Popen(
            argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
        )

    def answer(self) -> dict[str, Any]:
        stdout: IO[str] | None = self.process.stdout
        assert stdout is not None
        for line in stdout:
            if line.startswith("{"):
                answer = dict(json.loads(line))
                if "error" in answer:
                    raise RuntimeError(f"benchmark engine: {answer['error']}")
                return answer
        raise RuntimeError(f"benchmark engine exited with {self.process.wait()}")

    def ask(self, request: Mapping[str, Any]) -> dict[str, Any]:
        assert self.process.stdin is not None
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        return self.answer()

    def close(self, timeout_s: float = 120.0) -> None:
        if self.process.stdin is not None:
            self.process.stdin.close()
        try:
            self.process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
