"""Build a tiny Llama (or a tiny Gemma-3-style hybrid) with random weights, locally (no hub
access needed).

Used by the demo, the benchmarks and the engine tests. The weights are seeded, so two builds of
the same config are byte-identical and a store written by one run is readable by the next.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

__all__ = [
    "GEMMA3_SLIDING_WINDOW",
    "TinyLlamaSpec",
    "add_word_tokenizer",
    "build_tiny_gemma3",
    "build_tiny_llama",
    "word_of",
]

GEMMA3_SLIDING_WINDOW = 64
"""Tokens of the tiny Gemma-3-style model's sliding window (its layers 0-2; layer 3 is full)."""


@dataclass(frozen=True, slots=True)
class TinyLlamaSpec:
    """Shape of the tiny model. `head_dim` >= 32 keeps vLLM's CPU attention kernels happy.

    float32 by default: a random model's top two logits are often within a few bf16 rounding
    steps of each other (the median top-2 gap of the demo's outputs is ~0.05 nats), so in
    bf16 a batch composed differently can flip a greedy token; in float32 such flips need gaps
    below ~1e-6, which the tie-aware comparison of `kvstore.oracle` handles. The benchmark's
    model is bf16, as served models are."""

    vocab_size: int = 512
    hidden_size: int = 128
    intermediate_size: int = 256
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    head_dim: int = 32
    max_position_embeddings: int = 4096
    dtype: str = "float32"
    seed: int = 0

    @property
    def kv_bytes_per_token(self) -> int:
        """KV cache bytes one token takes: every layer's K and V."""
        itemsize = {"float32": 4}.get(self.dtype, 2)
        return self.num_hidden_layers * 2 * self.num_key_value_heads * self.head_dim * itemsize


def build_tiny_llama(directory: Path, spec: TinyLlamaSpec | None = None) -> Path:
    """Write a random-weight Llama to `directory` (once) and return the directory.

    A marker file records the spec; a directory holding another spec is rebuilt.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    spec = spec or TinyLlamaSpec()
    directory = Path(directory)
    marker = directory / "kvstore-tiny-model.json"
    wanted = json.dumps(asdict(spec), sort_keys=True)
    if marker.exists() and marker.read_text() == wanted:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    config = LlamaConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_hidden_layers,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config).to(getattr(torch, spec.dtype))  # type: ignore[no-untyped-call]
    model.save_pretrained(directory)
    marker.write_text(wanted)
    return directory


def build_tiny_gemma3(
    directory: Path,
    seed: int = 0,
    *,
    spec: TinyLlamaSpec | None = None,
    num_sliding: int = 3,
    window: int = GEMMA3_SLIDING_WINDOW,
) -> Path:
    """Write a random-weight Gemma-3-style text model to `directory` (once): `num_sliding`
    sliding-window layers of `window` tokens, then one full-attention layer (Gemma 3 has five
    per full one), the vocabulary, widths and dtype of `spec` (default: the tiny `TinyLlamaSpec`,
    float32: 4 layers, three of them sliding-window, `GEMMA3_SLIDING_WINDOW` tokens)."""
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    spec = spec or TinyLlamaSpec()
    directory = Path(directory)
    marker = directory / "kvstore-tiny-model.json"
    wanted = json.dumps({"kind": "gemma3", "seed": seed, "window": window,
                         "num_sliding": num_sliding, **asdict(spec)}, sort_keys=True)  # fmt: skip
    if marker.exists() and marker.read_text() == wanted:
        return directory
    directory.mkdir(parents=True, exist_ok=True)
    config = Gemma3TextConfig(
        vocab_size=spec.vocab_size,
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=num_sliding + 1,
        num_attention_heads=spec.num_attention_heads,
        num_key_value_heads=spec.num_key_value_heads,
        head_dim=spec.head_dim,
        max_position_embeddings=spec.max_position_embeddings,
        sliding_window=window,
        layer_types=["sliding_attention"] * num_sliding + ["full_attention"],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    )
    torch.manual_seed(seed)
    dtype = getattr(torch, spec.dtype)
    model = Gemma3ForCausalLM(config).to(dtype)  # type: ignore[no-untyped-call,arg-type]
    model.save_pretrained(directory)
    marker.write_text(wanted)
    return directory


_SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")  # ids 0-2: the tiny models' unk, bos 1 and eos 2


def word_of(token_id: int) -> str:
    """The word `add_word_tokenizer` gives `token_id` (a special token's own spelling for 0-2)."""
    return _SPECIAL_TOKENS[token_id] if token_id < len(_SPECIAL_TOKENS) else f"w{token_id}"


def add_word_tokenizer(directory: Path, vocab_size: int) -> Path:
    """Write a word-level tokenizer for a tiny model into `directory` (once) and return it.

    One word per id (`word_of`: `<unk>`, `<s>`, `</s>`, then `w3`, `w4`, ...), split on
    whitespace, decoded by joining words with spaces, no special tokens added on encode: any
    id sequence decodes to text that encodes back to the same ids, so random prompts (vLLM's
    benchmark datasets) have exactly the lengths asked for. Saved as `tokenizer.json` +
    `tokenizer_config.json`, which `AutoTokenizer` (and so vLLM's OpenAI server) loads from
    the model directory. A tokenizer of another vocabulary size is rebuilt."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    directory = Path(directory)
    marker = directory / "kvstore-tiny-tokenizer.json"
    wanted = json.dumps({"kind": "word", "vocab_size": vocab_size})
    if marker.exists() and marker.read_text() == wanted:
        return directory
    if vocab_size <= len(_SPECIAL_TOKENS):
        raise ValueError(f"vocab_size {vocab_size} leaves no room beside the special tokens")
    vocab = {word_of(i): i for i in range(vocab_size)}
    tokenizer = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    fast = PreTrainedTokenizerFast(  # type: ignore[no-untyped-call]
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>",
        clean_up_tokenization_spaces=False,
    )  # fmt: skip
    directory.mkdir(parents=True, exist_ok=True)
    fast.save_pretrained(str(directory))
    marker.write_text(wanted)
    return directory
