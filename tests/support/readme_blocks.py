"""Run every code block of the README as written (tests/test_readme.py).

A fenced block says what it is by its language, and an HTML comment right above it says how to
run it when that is not obvious:

    ```text       not a command: a diagram, a log excerpt (must hold no `$ ` line)
    ```console    a transcript: each `$ ` line is run (a trailing `\\` continues it); the lines
                  after it are what it printed, not compared, except that a command shown
                  printing `error: ...` must fail (exit 1 or 2)
    ```bash       a script, run whole
    ```python     a script, run with the venv's python
    ```json       parsed; a `kv_connector_extra_config` is validated by kvstore

    <!-- readme-test: background URL [needs=PROGRAM] -->  run the next block in the background
                  until URL answers; it runs until `<!-- readme-test: stop-background -->`
    <!-- readme-test: expect-exit N -->   the block's command exits N, and its last line starts
                  with the block's last line (up to `[...]`)
    <!-- readme-test: skip REASON -->     not run, with the reason (its JSON is still checked)

Every `--kv-transfer-config '...'` in any block is parsed and validated too, run or not.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["Block", "BlockRunner", "parse_blocks", "validate_transfer_configs"]

LANGUAGES = ("text", "console", "bash", "python", "json")
_MARKER = re.compile(r"^<!-- readme-test: (?P<kind>[a-z-]+)(?: (?P<arg>.*?))? -->$")
_TRANSFER_CONFIG = re.compile(r"--kv-transfer-config '(\{.*?\})'", re.DOTALL)
_ELLIPSIS = "[...]"


@dataclass(frozen=True, slots=True)
class Block:
    line: int  # 1-based line of the opening fence (of the comment, for a lone marker)
    lang: str  # one of LANGUAGES, or "marker" for a lone `stop-background`
    text: str
    kind: str | None = None  # the marker above it
    arg: str = ""

    def where(self) -> str:
        return f"README.md:{self.line} ({self.lang})"


def parse_blocks(readme: str) -> list[Block]:
    lines = readme.splitlines()
    blocks: list[Block] = []
    marker: tuple[str, str, int] | None = None
    i = 0
    while i < len(lines):
        line = lines[i]
        found = _MARKER.match(line.strip())
        if found:
            if found["kind"] == "stop-background":
                blocks.append(Block(i + 1, "marker", "", "stop-background"))
            else:
                marker = (found["kind"], found["arg"] or "", i + 1)
            i += 1
            continue
        if line.startswith("```"):
            lang = line[3:].strip()
            end = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            kind, arg = (marker[0], marker[1]) if marker and marker[2] == i else (None, "")
            blocks.append(Block(i + 1, lang, "\n".join(lines[i + 1 : end]), kind, arg))
            marker, i = None, end + 1
            continue
        i += 1
    return blocks


@contextmanager
def _password_variables(extra: Mapping[str, Any]) -> Iterator[None]:
    """Set the variables a config names (`remote_password_env`): kvstore checks that they are
    set, and the README's reader sets them; their content is never read here."""
    names = [v for k, v in extra.items() if k.endswith("_env") and isinstance(v, str)]
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update({name: "set-by-the-readme-test" for name in names})
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def validate_extra_config(extra: Mapping[str, Any]) -> None:
    from kvstore.config import KVStoreConfig

    with _password_variables(extra):
        KVStoreConfig.from_extra_config(extra)


def validate_transfer_configs(text: str) -> int:
    """Parse and validate every `--kv-transfer-config '...'` in `text`; how many there were."""
    from kvstore.vllm.lmdb_tier.options import LMDBTierOptions

    configs = [json.loads(raw) for raw in _TRANSFER_CONFIG.findall(text)]
    for config in configs:
        extra = config.get("kv_connector_extra_config", {})
        if config["kv_connector"] == "KVStoreConnector":
            assert config["kv_connector_module_path"] == "kvstore.vllm"
            if "cpu_byte" not in extra:  # the README's deliberate typo
                validate_extra_config(extra)
        for tier in extra.get("secondary_tiers", []):
            if tier.get("type") == "LMDBTier":
                assert tier["module_path"] == "kvstore.vllm"
                options = {k: v for k, v in tier.items() if k not in ("type", "module_path")}
                LMDBTierOptions.from_options(options)
    return len(configs)


def console_commands(text: str) -> Iterator[tuple[str, list[str]]]:
    """(command, the lines shown after it) for each `$ ` line of a transcript."""
    command: list[str] | None = None
    shown: list[str] = []
    for line in text.splitlines():
        continuing = command is not None and command[-1].endswith("\\") and not shown
        if line.startswith("$ ") and not continuing:
            if command is not None:
                yield "\n".join(command), shown
            command, shown = [line[2:]], []
        elif continuing:
            assert command is not None
            command.append(line)
        elif command is not None:
            shown.append(line)
    if command is not None:
        yield "\n".join(command), shown


@dataclass
class BlockRunner:
    """Runs blocks in `cwd` with `env` (a user's shell in the wheel's venv)."""

    cwd: Path
    env: Mapping[str, str]
    timeout_s: float = 600
    background: list[tuple[subprocess.Popen[bytes], Block]] = field(default_factory=list)
    not_run: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    logs: dict[int, str] = field(default_factory=dict)  # a background block's output, by line
    seconds: dict[str, float] = field(default_factory=dict)  # each block run, by where()

    def run(self, block: Block) -> None:
        validate_transfer_configs(block.text)
        if block.kind == "skip":
            assert block.arg, f"{block.where()}: a skip says why"
            self.not_run.append(f"{block.where()}: {block.arg}")
            return
        if block.kind == "stop-background":
            self.stop_background()
            return
        handler = getattr(self, f"_run_{block.lang}", None)
        assert handler is not None, f"{block.where()}: say what the block is ({LANGUAGES})"
        start = time.monotonic()
        handler(block)
        self.seconds[block.where()] = time.monotonic() - start

    # -- languages --------------------------------------------------------------------------

    def _run_text(self, block: Block) -> None:
        assert not any(line.startswith("$ ") for line in block.text.splitlines()), (
            f"{block.where()} holds commands: make it a console block"
        )

    def _run_json(self, block: Block) -> None:
        document = json.loads(block.text)
        if "cpu_bytes" in document or "disk_path" in document:
            validate_extra_config(document)
        self.ran.append(block.where())

    def _run_python(self, block: Block) -> None:
        script = self.cwd / f"readme_block_{block.line}.py"
        script.write_text(block.text + "\n")
        self._check(block, block.text, self._shell(f"python {script.name}"), expected={0})

    def _run_bash(self, block: Block) -> None:
        if block.kind == "background":
            self._start_background(block)
            return
        self._check(block, block.text, self._shell(block.text), expected={0})

    def _run_console(self, block: Block) -> None:
        for command, shown in console_commands(block.text):
            done = self._shell(command)
            if block.kind == "expect-exit":
                self._check(block, command, done, expected={int(block.arg)})
                self._check_last_line(block, done, shown)
            elif shown and shown[0].startswith("error:"):
                self._check(block, command, done, expected={1, 2})
                assert "error:" in done.stderr, (block.where(), command, done.stderr[-2000:])
            else:
                self._check(block, command, done, expected={0})

    # -- helpers ----------------------------------------------------------------------------

    def _shell(self, script: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            ["bash", "-o", "pipefail", "-ec", script],
            cwd=self.cwd,
            env=dict(self.env),
            capture_output=True,
            text=True,
            timeout=self.timeout_s,
            check=False,
        )

    def _check(
        self, block: Block, what: str, done: subprocess.CompletedProcess[str], expected: set[int]
    ) -> None:
        assert done.returncode in expected, (
            f"{block.where()}: `{what[:200]}` exited {done.returncode}, expected {expected}\n"
            f"--- stdout (end)\n{done.stdout[-3000:]}\n--- stderr (end)\n{done.stderr[-5000:]}"
        )
        self.ran.append(f"{block.where()}: {what.splitlines()[0][:100]}")

    def _check_last_line(
        self, block: Block, done: subprocess.CompletedProcess[str], shown: list[str]
    ) -> None:
        wanted = shown[-1].split(_ELLIPSIS)[0]
        lines = [line for line in (done.stdout + done.stderr).splitlines() if line.strip()]
        assert lines and lines[-1].startswith(wanted), (block.where(), wanted, lines[-5:])

    def _start_background(self, block: Block) -> None:
        url, _, needs = block.arg.partition(" needs=")
        if needs and shutil.which(needs, path=self.env.get("PATH")) is None:
            self.not_run.append(f"{block.where()}: `{needs}` is not installed here")
            return
        log = (self.cwd / f"background_{block.line}.log").open("wb")
        proc = subprocess.Popen(
            ["bash", "-ec", block.text], cwd=self.cwd, env=dict(self.env),
            stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip
        self.background.append((proc, block))
        deadline = time.monotonic() + self.timeout_s
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                message = f"{block.where()} exited {proc.returncode}: {self.log(block)}"
                raise AssertionError(message)
            with (
                suppress(urllib.error.URLError, ConnectionError, TimeoutError),
                urllib.request.urlopen(url, timeout=2) as answer,
            ):
                    if answer.status == 200:
                        self.ran.append(f"{block.where()}: {shlex.split(block.text)[0]} (up)")
                        return
            time.sleep(1)
        raise AssertionError(f"{block.where()}: {url} did not answer: {self.log(block)}")

    def log(self, block: Block) -> str:
        path = self.cwd / f"background_{block.line}.log"
        return path.read_text(errors="replace")[-5000:] if path.exists() else ""

    def stop_background(self) -> None:
        """Stop what runs in the background as a user's Ctrl-C would (SIGINT to its process
        group), then SIGKILL the group after a minute; keep each one's output in `logs`."""
        for proc, block in self.background:
            with suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGINT)
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                with suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            with suppress(ProcessLookupError):  # what the shell left, e.g. an engine process
                os.killpg(proc.pid, signal.SIGKILL)
            path = self.cwd / f"background_{block.line}.log"
            self.logs[block.line] = path.read_text(errors="replace")
        self.background.clear()
