"""The tiny test models' tokenizer: a WordLevel vocabulary of 96 ids with a ChatML-shaped chat template
(importable from any test folder, unlike conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

TINY_WORDS = ["user", "assistant", "system", "hello", "world", "the", "an", "is", "of", "and"]
# Role markers double as bos/eos so the tiny chat template stays ChatML-shaped.
TINY_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ bos_token }}{{ m['role'] }}\n{{ m['content'] }}{{ eos_token }}\n{% endfor %}"
    "{% if add_generation_prompt %}{{ bos_token }}assistant\n{% endif %}"
)


def write_tiny_tokenizer(folder: Path) -> None:
    """tokenizer.json (WordLevel over the 96 ids) + tokenizer_config.json with a chat template."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = ["<pad>", "<s>", "</s>", "<unk>", *TINY_WORDS]
    words += [chr(c) for c in range(ord("a"), ord("z") + 1)] + [str(d) for d in range(10)]
    words += list("?!.,:+-=()") + [f"w{i}" for i in range(96 - len(words) - 10)]
    assert len(words) == 96
    vocab = {w: i for i, w in enumerate(words)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    assert tok.get_vocab_size() == 96
    tok.save(str(folder / "tokenizer.json"))
    tcfg = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "chat_template": TINY_CHAT_TEMPLATE}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
