"""Sample traces for `kvstore simulate`: multi-turn chat, as JSONL of prompt token ids."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass
from pathlib import Path

__all__ = ["ChatTraceSpec", "make_chat_trace", "write_trace"]


@dataclass(frozen=True, slots=True)
class ChatTraceSpec:
    """Conversations served round-robin, each turn resending the whole history (a shared system
    prompt, earlier user turns and replies) plus a new user message: the reuse kvstore serves."""

    num_conversations: int = 8
    num_turns: int = 6
    system_tokens: int = 512
    user_tokens: int = 96
    reply_tokens: int = 64
    vocab_size: int = 32_000
    seed: int = 0


def make_chat_trace(spec: ChatTraceSpec) -> list[list[int]]:
    """The prompts, in the order an engine would see them."""
    rng = random.Random(spec.seed)

    def tokens(count: int) -> list[int]:
        return [rng.randrange(spec.vocab_size) for _ in range(count)]

    system = tokens(spec.system_tokens)
    histories = [list(system) for _ in range(spec.num_conversations)]
    prompts: list[list[int]] = []
    for _ in range(spec.num_turns):
        for history in histories:
            history.extend(tokens(spec.user_tokens))
            prompts.append(list(history))
            history.extend(tokens(spec.reply_tokens))
    return prompts


def write_trace(path: Path, prompts: list[list[int]]) -> None:
    """One `{"prompt_token_ids": [...]}` per line (the format `load_trace` reads)."""
    with path.open("w", encoding="utf-8") as out:
        for prompt in prompts:
            out.write(json.dumps({"prompt_token_ids": prompt}, separators=(",", ":")) + "\n")
