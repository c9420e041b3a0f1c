"""Multi-turn chat traffic as token ids (the tiny demo model has no tokenizer).

Every conversation shares one system prompt, and each turn resends the whole history (system
prompt, earlier user turns and the model's replies) plus a new user message: exactly the prefix
reuse kvstore exists for. Conversations are served round-robin, so by the time a conversation
comes back its history has left the engine's KV cache.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

__all__ = ["Conversation", "DemoWorkload"]


@dataclass(slots=True)
class Conversation:
    history: list[int]
    num_turns_done: int = 0
    replies: list[list[int]] = field(default_factory=list)


@dataclass(slots=True)
class DemoWorkload:
    num_conversations: int = 6
    num_turns: int = 6
    system_tokens: int = 256
    user_tokens: int = 64
    reply_tokens: int = 32
    vocab_size: int = 512
    seed: int = 1234

    def start(self) -> list[Conversation]:
        rng = random.Random(self.seed)
        system = self._tokens(rng, self.system_tokens)
        return [Conversation(history=list(system)) for _ in range(self.num_conversations)]

    def next_prompts(self, conversations: list[Conversation], turn: int) -> list[list[int]]:
        """Append this turn's user message to every conversation; return the prompts."""
        prompts = []
        for index, conversation in enumerate(conversations):
            rng = random.Random(self.seed * 1_000_003 + turn * 1009 + index)
            conversation.history += self._tokens(rng, self.user_tokens)
            prompts.append(list(conversation.history))
        return prompts

    @staticmethod
    def record_replies(conversations: list[Conversation], replies: list[list[int]]) -> None:
        for conversation, reply in zip(conversations, replies, strict=True):
            conversation.history += reply
            conversation.replies.append(reply)
            conversation.num_turns_done += 1

    def _tokens(self, rng: random.Random, n: int) -> list[int]:
        return [rng.randrange(3, self.vocab_size) for _ in range(n)]
