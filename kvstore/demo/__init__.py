"""The demo workload: multi-turn conversations whose history outgrows the engine's KV cache."""

from kvstore.demo.workload import Conversation, DemoWorkload

__all__ = ["Conversation", "DemoWorkload"]
