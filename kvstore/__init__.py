"""kvstore: a multi-tier KV-cache offload store for vLLM."""

__version__ = "0.1.0"
