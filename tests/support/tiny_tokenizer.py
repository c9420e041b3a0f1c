"""A byte-level tokenizer for the tiny Llama, built locally (no hub), so text prompts work.

Ids 0-2 are `<unk>`, `<s>`, `</s>` (the tiny model's bos 1 and eos 2), ids 3-258 the 256 bytes
in GPT-2's byte-to-character mapping, no merges: every byte is one token, and any text
round-trips. Saved as `tokenizer.json` + `tokenizer_config.json`, which `AutoTokenizer` (and so
vLLM) loads from the model directory.
"""

from __future__ import annotations

from pathlib import Path

__all__ = ["add_tiny_tokenizer"]

_SPECIALS = ("<unk>", "<s>", "</s>")


def _byte_symbols() -> list[str]:
    """GPT-2's printable stand-in for each byte value (the ByteLevel pre-tokenizer's alphabet)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1),
                 *range(ord("®"), ord("ÿ") + 1)]  # fmt: skip
    symbols, extra = {}, 0
    for value in range(256):
        if value in printable:
            symbols[value] = chr(value)
        else:
            symbols[value] = chr(256 + extra)
            extra += 1
    return [symbols[value] for value in range(256)]


def add_tiny_tokenizer(model_dir: Path) -> Path:
    """Write the tokenizer into `model_dir` (once) and return the directory."""
    if (model_dir / "tokenizer.json").exists():
        return model_dir
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(_SPECIALS)}
    vocab.update({symbol: len(_SPECIALS) + i for i, symbol in enumerate(_byte_symbols())})
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tokenizer.decoder = decoders.ByteLevel()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )
    fast.save_pretrained(str(model_dir))
    return model_dir
