"""DraftGate's GGUF tokenizers and chat templates against llama.cpp's own test files.

llama.cpp's source tree keeps, in models/, ``ggml-vocab-*.gguf`` tokenizer files with ``.inp`` / ``.out``
test texts and the ids llama.cpp gives them, and in models/templates/ the chat templates of many families.
This checks every vocabulary file whose tokenizer DraftGate builds (its ids must equal the listed ones)
and every template (it must render here as transformers renders it, or refuse the same chat).

    .venv/bin/python benchmarks/llamacpp_vocabs.py path/to/llama.cpp/models

Exit status 1 when any supported file or template differs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from draftgate.models.gguf_file import GGUFFile
from draftgate.models.gguf_tokenizer import build_gguf_tokenizer
from draftgate.models.tokenizer import TextTokenizer, render_chat_template

CHAT = [
    {"role": "user", "content": "What is 12345 + 6789?"},
    {"role": "assistant", "content": "19134"},
    {"role": "user", "content": "  And  日本語 🙂?\n"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a < b & c", "parameters": {}}}]


def check_vocab(path: Path) -> str:
    inp, out = Path(f"{path}.inp"), Path(f"{path}.out")
    if not inp.is_file():
        return "no test texts"
    try:
        g = build_gguf_tokenizer(GGUFFile(path).fields)
    except ValueError as e:
        return f"not supported: {e}"
    tok = TextTokenizer(g.tokenizer, None, None, None, [])
    texts = inp.read_text(encoding="utf-8").split("\n__ggml_vocab_test__\n")[:-1]
    expected = [[int(x) for x in line.split()] for line in out.read_text().split("\n")[: len(texts)]]
    bad = sum(tok.encode(t, add_special=False) != e for t, e in zip(texts, expected, strict=True))
    return f"ok, {len(texts)} texts" if bad == 0 else f"DIFFERS on {bad} of {len(texts)} texts"


def check_template(path: Path) -> str:
    from transformers.utils import chat_template_utils

    template = path.read_text(encoding="utf-8")
    for tools in (None, TOOLS):
        variables = {"bos_token": "<s>", "eos_token": "</s>", "tools": tools}
        try:
            ref: Any = chat_template_utils.render_jinja_template(
                [CHAT], chat_template=template, add_generation_prompt=True, **variables
            )[0][0]
        except Exception as e:  # the template refuses this chat: it must refuse it here too
            ref = type(e)
        try:
            ours: Any = render_chat_template(template, CHAT, True, **variables)
        except Exception as e:
            ours = type(e)
        if ours != ref:
            return "DIFFERS" + (" (with tools)" if tools else "")
    return "ok"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("folder", type=Path, help="llama.cpp's models/ folder")
    a = ap.parse_args()
    failed = 0
    for path in sorted(a.folder.glob("ggml-vocab-*.gguf")):
        result = check_vocab(path)
        failed += result.startswith("DIFFERS")
        print(f"{path.name}: {result}")
    for path in sorted((a.folder / "templates").glob("*.jinja")):
        result = check_template(path)
        failed += result.startswith("DIFFERS")
        print(f"templates/{path.name}: {result}")
    print(f"{failed} differ")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
