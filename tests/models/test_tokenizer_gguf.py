"""GGUF tokenizers (models/gguf_tokenizer.py) against llama.cpp's and transformers' ids.

Files: the bundled SmolLM2 (byte-level BPE, ``smollm``), Gemma 3 270M (SentencePiece, the named model
``gemma3-270m``, installed on first use), and small GGUFs written here with the ``gguf`` package: a
byte-level BPE trained on the corpus (so its merges cross every boundary a wrong split would make) saved
once per pre-tokenizer name (``llama-bpe``, ``qwen2``, ``qwen35``, ``tekken``, ``smollm``, ``gpt-2``,
``default``), and a Llama 2 style SentencePiece vocabulary (scores, ``<0xNN>`` byte tokens, a ``▁`` prefix).

References: transformers' GGUF tokenizer conversion (``AutoTokenizer.from_pretrained(folder, gguf_file=...)``)
for the pre-tokenizers it knows, and llama.cpp's ``llama-tokenize`` (built next to llama-server by
``make llamacpp``, which ``make test`` runs) for every file. llama-tokenize runs once per file: the
corpus is joined with a control token between texts, which llama.cpp tokenizes as separate fragments (the
same as one call per text: a SentencePiece prefix ``▁`` also follows every special token), and its ids
are cut back at that token. Without llama.cpp, the splits each pre-tokenizer must make are checked on
probe strings, and ``ignore_merges`` and the special tokens by their ids.

llama.cpp's own vocabulary test files and chat templates (its source tree's models/ folder): checked by
``benchmarks/llamacpp_vocabs.py FOLDER``, outside the suite since the folder is not on PyPI.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from tokenizers import Regex, Tokenizer, models, pre_tokenizers, trainers

from draftgate.models.gguf_file import gguf_fields, open_gguf
from draftgate.models.gguf_tokenizer import PRE_TOKENIZERS
from draftgate.models.known import known_model_path
from draftgate.models.tokenizer import TextTokenizer

# A varied corpus: code, Unicode (CJK, emoji, accents, RTL, combining marks), runs of spaces, newlines and
# tabs, digits and long numbers, punctuation, contractions, leading/trailing spaces.
CORPUS = [
    "Hello world",
    " Hello World!",
    "hello, world... isn't it? They'll say I'm RIGHT, you've DONE it; we'd go.",
    "def add(a, b):\n    return a + b  # 3.14159\n\n\tprint(add(1, 2))\n",
    "for (int i = 0; i < n; ++i) { x[i] += y[i] * 2; }  // C++\r\n",
    "    indented\n        more\n\t\ttabs\t \n",
    "1234567890 12 345 6789 3.14159 -42 1,000,000 2024-12-31T23:59:59Z",
    "naïve café résumé Ünïcödé — ÀÉÎÕÜ déjà vu",
    "日本語のテキストと中文字符，还有한국어 텍스트。",
    "emoji 🙂👍🏽🦙 and ✓ ✗ ★ ♥ 🇫🇷 👨‍👩‍👧",
    "مرحبا بالعالم שלום עולם",
    "Ελληνικά, русский текст, ქართული",
    "e\u0301 combining a\u0308 marks",
    "caféÀ laÉcole ÉCOLEs",
    "  leading and trailing spaces  ",
    "\n\n\nnewlines first",
    "trailing newlines\n\n",
    "multiple     spaces\u00a0and\u3000odd\u2009spaces",
    "!!!???...,,,;;;:::---___+++===|||~~~^^^$$$%%%&&&***",
    '<html><body class="x">a &amp; b</body></html>',
    "url: https://example.com/path?q=1&r=2#frag user@example.org",
    "CamelCaseWord snake_case_word SCREAMING_CASE mixedUPPERlower",
    "a quixotic plan",
    "x",
    " ",
    "\t",
    "",
]
# Texts with the synthetic files' special tokens in them (they must stay single ids).
SPECIAL_TEXTS = ["<|im_start|>user\nhi<|im_end|>\n", "a<|endoftext|>b", "<think>\nhmm\n</think>\n\nok"]
LLAMA3_SPECIAL_TEXTS = ["<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>", "x<|begin_of_text|>y"]
CHAT = [
    {"role": "system", "content": "You are terse."},
    {"role": "user", "content": "What is 12345 + 6789?"},
    {"role": "assistant", "content": "19134"},
    {"role": "user", "content": "  And  日本語 🙂?\n"},
]
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a < b & c", "parameters": {}}}]

# --------------------------------------------------------------------------- chat templates (written for
# these tests in the shape of the families' own)

CHATML_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n# Tools\n{%- for t in tools %}\n{{ t | tojson }}{%- endfor %}<|im_end|>\n"
    "{%- endif %}"
    "{%- set ns = namespace(n=0) %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'tool' %}{% continue %}{% endif %}"
    "{%- set ns.n = ns.n + 1 %}"
    "{%- if m.role not in ['system', 'user', 'assistant'] %}{{ raise_exception('bad role ' + m.role) }}{% endif %}"
    "<|im_start|>{{ m.role }}\n"
    "{% if m.role == 'assistant' %}{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}"
    "{%- endif %}<|im_end|>{{ '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n<think>\n\n</think>\n\n{%- endif %}"
)
LLAMA3_TEMPLATE = (
    "{{- bos_token }}"
    "{%- if messages[0]['role'] == 'system' %}{%- set system = messages[0]['content'] | trim %}"
    "{%- set messages = messages[1:] %}{%- else %}{%- set system = '' %}{%- endif %}"
    "<|start_header_id|>system<|end_header_id|>\n\n{{ system }}<|eot_id|>"
    "{%- for m in messages %}"
    "<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n{{ m['content'] | trim }}<|eot_id|>"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{%- endif %}"
)
MISTRAL_TEMPLATE = (
    "{{- bos_token }}{%- for m in messages %}"
    "{%- if m['role'] == 'user' %}[INST]{{ m['content'] }}[/INST]"
    "{%- elif m['role'] == 'assistant' %}{{ m['content'] }}{{ eos_token }}{%- endif %}"
    "{%- endfor %}"
)
GEMMA_TEMPLATE = (
    "{{ bos_token }}"
    "{%- if messages[0]['role'] == 'system' -%}{%- set first = messages[0]['content'] + '\n\n' -%}"
    "{%- set loop_messages = messages[1:] -%}{%- else -%}{%- set first = '' -%}"
    "{%- set loop_messages = messages -%}{%- endif -%}"
    "{%- for message in loop_messages -%}"
    "{%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{%- endif -%}"
    "{%- set role = 'model' if message['role'] == 'assistant' else message['role'] -%}"
    "{{ '<start_of_turn>' + role + '\n' + (first if loop.first else '') }}"
    "{{ message['content'] | trim }}<end_of_turn>\n"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\n' }}{%- endif -%}"
)
LLAMA2_TEMPLATE = (
    "{%- for m in messages %}{%- if m['role'] == 'user' %}{{ bos_token + '[INST] ' + m['content'] + ' [/INST]' }}"
    "{%- elif m['role'] == 'assistant' %}{{ ' ' + m['content'] + ' ' + eos_token }}{%- endif %}{%- endfor %}"
)

# --------------------------------------------------------------------------- writing GGUF files

_TRAIN = [
    *CORPUS,
    "The quick brown fox jumps over the lazy dog. " * 3,
    "import numpy as np\n\nclass Model:\n    def __init__(self):\n        self.x = 0\n",
    "Once upon a time, there was a little girl who lived in a village near the forest.\n\n",
    "0123456789 " * 4 + "100 200 300 1000 2000 12345678901234567890",
    "    " * 3 + "\n\n\n\n" + "\t\t\t" + "  \n  \n",
]
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6


def _train_byte_level() -> tuple[list[str], list[str]]:
    """A byte-level BPE trained without any split (its tokens cross words, digits and spaces)."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    trainer = trainers.BpeTrainer(
        vocab_size=1400, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator([t for t in _TRAIN if t], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    tokens = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    # A word in the vocabulary that no merge builds: llama.cpp's ignore_merges (llama3, tekken) finds it.
    tokens.append("Ġquixotic")
    return tokens, merges


def _write_gguf(path: Path, arch: str, n_vocab: int, kv: Callable[[Any], None]) -> Path:
    from gguf import GGUFWriter

    w = GGUFWriter(str(path), arch)
    w.add_name(path.stem)
    # llama.cpp reads these hyperparameters even for a vocabulary-only file.
    w.add_context_length(4096)
    w.add_embedding_length(64)
    w.add_block_count(1)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(4)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    kv(w)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


BPE_SPECIALS: dict[str, list[tuple[str, int]]] = {
    "chatml": [
        ("<|endoftext|>", CONTROL),
        ("<|im_start|>", CONTROL),
        ("<|im_end|>", CONTROL),
        ("<think>", USER_DEFINED),
        ("</think>", USER_DEFINED),
    ],
    "llama3": [
        ("<|begin_of_text|>", CONTROL),
        ("<|end_of_text|>", CONTROL),
        ("<|start_header_id|>", CONTROL),
        ("<|end_header_id|>", CONTROL),
        ("<|eot_id|>", CONTROL),
    ],
    "mistral": [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL), ("[INST]", CONTROL), ("[/INST]", CONTROL)],
}
# pre-tokenizer name -> (architecture, special tokens, bos, eos, chat template)
BPE_FILES = {
    "llama-bpe": ("llama", "llama3", "<|begin_of_text|>", "<|end_of_text|>", LLAMA3_TEMPLATE),
    "qwen2": ("qwen2", "chatml", None, "<|im_end|>", CHATML_TEMPLATE),
    "qwen35": ("qwen2", "chatml", None, "<|im_end|>", CHATML_TEMPLATE),
    "tekken": ("llama", "mistral", "<s>", "</s>", MISTRAL_TEMPLATE),
    "smollm": ("llama", "chatml", "<|im_start|>", "<|im_end|>", CHATML_TEMPLATE),
    "gpt-2": ("gpt2", "chatml", "<|endoftext|>", "<|endoftext|>", CHATML_TEMPLATE),
    "default": ("llama", "chatml", "<|endoftext|>", "<|im_end|>", CHATML_TEMPLATE),
}


def write_bpe_gguf(folder: Path, pre: str) -> Path:
    arch, specials, bos, eos, template = BPE_FILES[pre]
    tokens, merges = _train_byte_level()
    types = [NORMAL] * len(tokens)
    for text, ty in BPE_SPECIALS[specials]:
        tokens.append(text)
        types.append(ty)

    def kv(w: Any) -> None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre(pre)
        w.add_token_list(tokens)
        w.add_token_types(types)
        w.add_token_merges(merges)
        if bos is not None:
            w.add_bos_token_id(tokens.index(bos))
        w.add_eos_token_id(tokens.index(eos))
        w.add_chat_template(template)

    return _write_gguf(folder / f"bpe-{pre}.gguf", arch, len(tokens), kv)


def write_spm_gguf(folder: Path) -> Path:
    """A Llama 2 style SentencePiece file: <unk> <s> </s>, 256 byte tokens, pieces scored by merge order."""
    tok = Tokenizer(models.BPE())
    trainer = trainers.BpeTrainer(vocab_size=900, show_progress=False)
    tok.train_from_iterator([("▁" + t).replace(" ", "▁") for t in _TRAIN if t and "\n" not in t], trainer=trainer)
    model = json.loads(tok.to_str())["model"]
    learned = [t for t, _ in sorted(model["vocab"].items(), key=lambda kv: kv[1])]
    chars = [t for t in learned if len(t) == 1]
    pieces = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256))]
    types = [UNKNOWN, CONTROL, CONTROL, *([BYTE] * 256)]
    scores = [0.0] * len(tokens)
    for i, m in enumerate(pieces):  # merged pieces first (best score first), as SentencePiece lists them
        tokens.append(m.replace(" ", ""))
        types.append(NORMAL)
        scores.append(-float(i))
    for c in chars:
        tokens.append(c)
        types.append(NORMAL)
        scores.append(-float(len(pieces) + len(chars)))

    def kv(w: Any) -> None:
        w.add_tokenizer_model("llama")
        w.add_tokenizer_pre("default")
        w.add_token_list(tokens)
        w.add_token_scores(scores)
        w.add_token_types(types)
        w.add_bos_token_id(1)
        w.add_eos_token_id(2)
        w.add_unk_token_id(0)
        w.add_chat_template(LLAMA2_TEMPLATE)

    return _write_gguf(folder / "spm-llama2.gguf", "llama", len(tokens), kv)


def read_fields(path: Path) -> dict[str, Any]:
    return gguf_fields(open_gguf(path))


# --------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def gguf_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("gguf-tok")


@pytest.fixture(scope="module")
def bpe_files(gguf_dir: Path) -> dict[str, Path]:
    return {pre: write_bpe_gguf(gguf_dir, pre) for pre in BPE_FILES}


@pytest.fixture(scope="module")
def spm_file(gguf_dir: Path) -> Path:
    return write_spm_gguf(gguf_dir)


@pytest.fixture(scope="module")
def smollm_file() -> Path:
    return known_model_path("smollm2-135m")


@pytest.fixture(scope="module")
def gemma_file() -> Path:
    """Gemma 3 270M Q4_K_M (the named model gemma3-270m: installed from PyPI and joined on first use)."""
    return known_model_path("gemma3-270m")


@pytest.fixture(scope="module")
def gemma_fields(gemma_file: Path) -> dict[str, Any]:
    return read_fields(gemma_file)


def _tok(path: Path, **extra: Any) -> TextTokenizer:
    return TextTokenizer.from_gguf_fields({**read_fields(path), **extra})


# --------------------------------------------------------------------------- llama.cpp's llama-tokenize


def llama_tokenize_binary() -> Path:
    from draftgate.bench.arm_spec import ArmError
    from draftgate.bench.llama_server import find_llama_server

    try:
        server = find_llama_server()
    except ArmError as e:
        pytest.skip(f"llama.cpp is not built (run `make llamacpp`): {e}")
    exe = server.parent / "llama-tokenize"
    if not exe.is_file():
        pytest.skip(f"llama.cpp's llama-tokenize is not next to {server}")
    return exe


def llama_tokenize(exe: Path, model: Path, text: str, bos: bool = False) -> list[int]:
    """llama.cpp's ids for ``text`` (special tokens parsed, as the server does for a prompt)."""
    with tempfile.TemporaryDirectory() as tmp:
        src = Path(tmp) / "prompt.txt"  # read verbatim (-f, no escapes): every byte is the text's
        src.write_bytes(text.encode())
        cmd = [str(exe), "-m", str(model), "-f", str(src), "--ids", "--no-escape", "--log-disable"]
        done = subprocess.run([*cmd, *([] if bos else ["--no-bos"])], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def llama_tokenize_each(exe: Path, model: Path, texts: Sequence[str], sep: str, sep_id: int) -> list[list[int]]:
    """llama.cpp's ids for each text in one run: the texts joined by the control token ``sep`` (each raw
    fragment between special tokens is tokenized on its own), the ids cut back at ``sep_id``."""
    assert not any(sep in t for t in texts)
    ids = llama_tokenize(exe, model, sep.join(texts))
    out: list[list[int]] = [[]]
    for i in ids:
        if i == sep_id:
            out.append([])
        else:
            out[-1].append(i)
    assert len(out) == len(texts)
    return out


def _pieces(tok: TextTokenizer, ids: Sequence[int]) -> list[str | None]:
    return [tok.id_to_token(i) for i in ids]


def assert_same_ids(tok: TextTokenizer, texts: Sequence[str], ours: list[list[int]], ref: list[list[int]]) -> None:
    bad = [
        f"{t!r}:\n  ours {o}\n  ref  {r}\n  ours {_pieces(tok, o)}\n  ref  {_pieces(tok, r)}"
        for t, o, r in zip(texts, ours, ref, strict=True)
        if o != r
    ]
    assert not bad, f"{len(bad)} of {len(texts)} texts differ:\n" + "\n".join(bad[:6])


# --------------------------------------------------------------------------- transformers


def transformers_tokenizer(path: Path) -> Any:
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


# =========================================================================== tests: without llama.cpp

# Probe strings and the pieces llama.cpp's split expressions make of them (llama-vocab.cpp / unicode.cpp).
SPLITS = {
    "llama-bpe": [
        (
            "Hello, world! 1234567 don'T\n\n  x",
            ["Hello", ",", " world", "!", " ", "123", "456", "7", " don", "'T", "\n\n", " ", " x"],
        ),
        ("a...\n\nb", ["a", "...\n\n", "b"]),
    ],
    "qwen2": [
        (
            "Hello, world! 1234 don'T\n\n  x",
            ["Hello", ",", " world", "!", " ", "1", "2", "3", "4", " don", "'T", "\n\n", " ", " x"],
        )
    ],
    "qwen35": [("e\u0301te\u0301 12", ["e\u0301te\u0301", " ", "1", "2"])],
    # llama.cpp's tekken: a non-ASCII letter is upper and lower case, a combining mark no letter
    "tekken": [
        ("CamelCase HTTPServer 12", ["Camel", "Case", " HTTPServer", " ", "1", "2"]),
        ("laÉcole e\u0301", ["laÉcole", " e", "\u0301"]),
    ],
    "smollm": [("x 1234  y", ["x", " ", "1", "2", "3", "4", " ", " y"])],
    "gpt-2": [("x 1234  y's", ["x", " 1234", " ", " y", "'s"])],
    "default": [("a+b=1234567 x", ["a", "+", "b", "=", "123", "456", "7", " x"])],
}


@pytest.mark.parametrize(("pre", "text", "pieces"), [(p, t, s) for p, cases in SPLITS.items() for t, s in cases])
def test_pre_tokenizer_splits(pre: str, text: str, pieces: list[str]) -> None:
    splits = PRE_TOKENIZERS[pre].splits
    pt = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(r), behavior="isolated") for r in splits])
    assert [p for p, _ in pt.pre_tokenize_str(text)] == pieces


def test_unknown_pre_tokenizer_is_refused(bpe_files: dict[str, Path]) -> None:
    fields = read_fields(bpe_files["qwen2"])
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.pre='qwen9'.*llama-bpe.*qwen2.*smollm"):
        TextTokenizer.from_gguf_fields({**fields, "tokenizer.ggml.pre": "qwen9"})


@pytest.mark.parametrize("model", ["bert", "t5", "rwkv", "gemma4", None])
def test_unknown_tokenizer_model_is_refused(bpe_files: dict[str, Path], model: str | None) -> None:
    fields = read_fields(bpe_files["qwen2"])
    with pytest.raises(ValueError, match=rf"tokenizer\.ggml\.model={model!r}.*'gpt2'.*'llama'"):
        TextTokenizer.from_gguf_fields({**fields, "tokenizer.ggml.model": model})


def test_missing_pre_tokenizer_is_llama_cpps_default(bpe_files: dict[str, Path]) -> None:
    fields = {k: v for k, v in read_fields(bpe_files["default"]).items() if k != "tokenizer.ggml.pre"}
    with pytest.warns(UserWarning, match="default"):
        tok = TextTokenizer.from_gguf_fields(fields)
    ref = _tok(bpe_files["default"])
    assert [tok.encode(t) for t in CORPUS] == [ref.encode(t) for t in CORPUS]


@pytest.mark.parametrize("pre", list(BPE_FILES))
def test_byte_level_round_trip_and_specials(bpe_files: dict[str, Path], pre: str) -> None:
    tok = _tok(bpe_files[pre])
    specials = LLAMA3_SPECIAL_TEXTS if pre == "llama-bpe" else SPECIAL_TEXTS if pre != "tekken" else []
    for text in [*CORPUS, *specials]:
        assert tok.decode(tok.encode(text, add_special=False), skip_special=False) == text
    vocab = tok.vocab()
    for text, ty in BPE_SPECIALS[BPE_FILES[pre][1]]:
        ids = tok.encode(f"a{text}b", add_special=False)
        assert vocab[text] in ids, (text, ids)  # one id, never merged with the text around it
        assert (vocab[text] in tok.special_ids()) == (ty != USER_DEFINED)
        assert tok.decode(ids) == ("a" + text + "b" if ty == USER_DEFINED else "ab")


@pytest.mark.parametrize(("pre", "whole"), [("llama-bpe", True), ("tekken", True), ("qwen2", False), ("smollm", False)])
def test_ignore_merges(bpe_files: dict[str, Path], pre: str, whole: bool) -> None:
    """A word that is a vocabulary token but no merge builds: one id where llama.cpp ignores merges."""
    tok = _tok(bpe_files[pre])
    ids = tok.encode(" quixotic", add_special=False)
    assert (ids == [tok.vocab()["Ġquixotic"]]) == whole, [tok.id_to_token(i) for i in ids]


def test_bos_eos_and_end_of_turn_ids(bpe_files: dict[str, Path], spm_file: Path) -> None:
    llama3 = _tok(bpe_files["llama-bpe"])
    v = llama3.vocab()
    assert llama3.add_bos and not llama3.add_eos  # llama.cpp's default for llama-bpe files without the flag
    assert llama3.encode("hi")[0] == v["<|begin_of_text|>"] and llama3.encode("hi", add_special=False)[0] != 0
    assert llama3.eos_ids == (v["<|end_of_text|>"], v["<|eot_id|>"])  # eot found by its text
    qwen = _tok(bpe_files["qwen2"])
    assert not qwen.add_bos and qwen.eos_ids == (qwen.vocab()["<|im_end|>"],)
    assert qwen.eog_ids == tuple(sorted(qwen.vocab()[t] for t in ("<|endoftext|>", "<|im_end|>")))
    flagged = _tok(bpe_files["qwen2"], **{"tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": True})
    flagged_bos = _tok(bpe_files["qwen2"], **{"tokenizer.ggml.bos_token_id": 0, "tokenizer.ggml.add_eos_token": True})
    assert flagged.encode("hi")[-1] == qwen.vocab()["<|im_end|>"]
    assert flagged_bos.encode("hi")[-1] == qwen.vocab()["<|im_end|>"] and flagged_bos.encode("hi")[0] != 0
    spm = _tok(spm_file)
    assert spm.add_bos and spm.encode("hi")[0] == 1 and spm.eos_ids == (2,)
    assert spm.encode("hi", add_special=False)[0] != 1


def test_sentencepiece_round_trip_and_prefix(spm_file: Path) -> None:
    tok = _tok(spm_file)
    for text in CORPUS:
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids) == text
        if text:
            assert tok.id_to_token(ids[0]).startswith("▁")  # llama.cpp's add_space_prefix default
    # the prefix follows every special token too, and characters outside the vocabulary are bytes
    ids = tok.encode("a</s>b \u2603", add_special=False)  # a snowman: not in the vocabulary
    pieces = [str(p) for p in _pieces(tok, ids)]
    at = pieces.index("</s>")
    assert "".join(pieces[:at]) == "▁a" and "".join(pieces[at + 1 : -3]) == "▁b▁"
    assert pieces[-3:] == ["<0xE2>", "<0x98>", "<0x83>"]
    no_prefix = _tok(spm_file, **{"tokenizer.ggml.add_space_prefix": False})
    assert no_prefix.id_to_token(no_prefix.encode("a", add_special=False)[0]) == "a"


@pytest.mark.real_model
@pytest.mark.parametrize("name", ["llama-bpe", "qwen2", "spm"])
def test_saved_as_hf_folder_gives_the_same_ids(
    bpe_files: dict[str, Path], spm_file: Path, tmp_path: Path, name: str
) -> None:
    tok = _tok(spm_file if name == "spm" else bpe_files[name])
    tok.save_hf(tmp_path)
    back = TextTokenizer.from_hf_folder(tmp_path)
    assert [back.encode(t) for t in CORPUS] == [tok.encode(t) for t in CORPUS]
    assert back.encode_chat(CHAT[1:]) == tok.encode_chat(CHAT[1:]) and back.eos_ids == tok.eos_ids
    assert (back.add_bos, back.add_eos, back.special_ids()) == (tok.add_bos, tok.add_eos, tok.special_ids())


@pytest.mark.real_model
def test_gemma_specials_and_round_trip(gemma_fields: dict[str, Any]) -> None:
    tok = TextTokenizer.from_gguf_fields(gemma_fields)
    v = tok.vocab()
    assert tok.add_bos and tok.bos_token == "<bos>" and tok.eos_token == "<eos>"
    # the file names no end-of-turn id: <end_of_turn> is llama.cpp's by its text
    assert tok.eos_ids == (v["<eos>"], v["<end_of_turn>"])
    for text in CORPUS:
        ids = tok.encode(text, add_special=False)
        assert tok.decode(ids, skip_special=False) == text
    ids = tok.encode("<start_of_turn>user\nhi  there<end_of_turn>\n", add_special=False)
    assert [tok.id_to_token(i) for i in ids] == [
        "<start_of_turn>",
        "user",
        "\n",
        "hi",
        "  ",
        "there",
        "<end_of_turn>",
        "\n",
    ]
    assert {v["<start_of_turn>"], v["<end_of_turn>"]} <= tok.special_ids() and v["\n"] not in tok.special_ids()


def test_chat_templates_render_with_special_ids(bpe_files: dict[str, Path], spm_file: Path) -> None:
    for pre, (_, specials, _, _, _) in BPE_FILES.items():
        tok = _tok(bpe_files[pre])
        text = tok.apply_chat_template(CHAT[1:] if pre == "tekken" else CHAT)
        ids = tok.encode_chat(CHAT[1:] if pre == "tekken" else CHAT)
        vocab = tok.vocab()
        for sp, _ in BPE_SPECIALS[specials]:
            if sp in text:  # every special token in the prompt is its single id, as often as it is written
                assert ids.count(vocab[sp]) == text.count(sp), (pre, sp)
        assert tok.decode(ids, skip_special=False) == text
    llama3 = _tok(bpe_files["llama-bpe"])
    ids = llama3.encode_chat(CHAT)
    assert ids[0] == llama3.bos_id and ids[1] != llama3.bos_id  # the template's BOS, not a second one
    spm = _tok(spm_file)
    assert spm.apply_chat_template(CHAT[1:2]) == "<s>[INST] What is 12345 + 6789? [/INST]"
    assert spm.encode_chat(CHAT[1:2]).count(1) == 1


def test_template_features_as_transformers_has_them(bpe_files: dict[str, Path]) -> None:
    tok = _tok(bpe_files["qwen2"])
    text = tok.apply_chat_template(CHAT[1:], tools=TOOLS)
    assert '{"type": "function", "function": {"name": "add", "description": "a < b & c"' in text  # no escaping
    assert tok.apply_chat_template([*CHAT[1:], {"role": "tool", "content": "x"}]) == tok.apply_chat_template(CHAT[1:])
    assert tok.apply_chat_template(CHAT[1:2], add_generation_prompt=False) == (
        "<|im_start|>user\nWhat is 12345 + 6789?<|im_end|>\n"
    )
    import jinja2

    with pytest.raises(jinja2.exceptions.TemplateError, match="bad role"):
        tok.apply_chat_template([{"role": "robot", "content": "x"}])
    now = TextTokenizer.from_gguf_fields(
        {**read_fields(bpe_files["qwen2"]), "tokenizer.chat_template": "{{ strftime_now('%Y') }}"}
    )
    assert now.apply_chat_template([]) == str(datetime.now().year)


# --------------------------------------------------------------------------- against transformers

# transformers' GGUF converter knows these pre-tokenizer names (its GGUF_PRE_TOKENIZER_SPLITS; gpt-2 is its default).
TRANSFORMERS_PRES = ["llama-bpe", "qwen2", "qwen35", "tekken", "gpt-2"]


@pytest.mark.parametrize("pre", TRANSFORMERS_PRES)
def test_byte_level_matches_transformers(bpe_files: dict[str, Path], pre: str) -> None:
    ref = transformers_tokenizer(bpe_files[pre])
    tok = _tok(bpe_files[pre])
    # transformers' converter keeps merges for every word (its BPE has no ignore_merges): not the probe word
    texts = [t for t in CORPUS if "quixotic" not in t] + (SPECIAL_TEXTS if BPE_FILES[pre][1] == "chatml" else [])
    if pre == "tekken":  # llama.cpp's tekken split differs from tokenizer.json's on these (see gguf_tokenizer)
        texts = [t for t in texts if t not in ("e\u0301 combining a\u0308 marks", "caféÀ laÉcole ÉCOLEs")]
    ours = [tok.encode(t, add_special=False) for t in texts]
    assert_same_ids(tok, texts, ours, [ref.encode(t, add_special_tokens=False) for t in texts])
    if BPE_FILES[pre][4] != MISTRAL_TEMPLATE:
        chat = CHAT
        assert tok.apply_chat_template(chat) == ref.apply_chat_template(
            chat, tokenize=False, add_generation_prompt=True
        )


@pytest.mark.real_model
def test_smollm2_matches_transformers(smollm_file: Path) -> None:
    ref = transformers_tokenizer(smollm_file)
    tok = _tok(smollm_file)
    texts = [*CORPUS, *SPECIAL_TEXTS[:2]]
    ours = [tok.encode(t, add_special=False) for t in texts]
    assert_same_ids(tok, texts, ours, [ref.encode(t, add_special_tokens=False) for t in texts])
    assert tok.apply_chat_template(CHAT) == ref.apply_chat_template(CHAT, tokenize=False, add_generation_prompt=True)


def test_sentencepiece_matches_transformers(spm_file: Path) -> None:
    ref = transformers_tokenizer(spm_file)
    tok = _tok(spm_file)
    # transformers' converter (a Metaspace pre-tokenizer) adds no ▁ before a text's own leading space; llama.cpp
    # and Llama 2's tokenizer.json (a Prepend normalizer) do: " Hello" is ▁▁Hello there, ▁Hello in transformers.
    texts = [t for t in CORPUS if not t.startswith(" ")]
    assert_same_ids(
        tok,
        texts,
        [tok.encode(t, add_special=False) for t in texts],
        [ref.encode(t, add_special_tokens=False) for t in texts],
    )


@pytest.mark.real_model
@pytest.mark.slow  # transformers converts Gemma's 262k-token vocabulary in about 20 s
def test_gemma_matches_transformers(gemma_file: Path, gemma_fields: dict[str, Any]) -> None:
    ref = transformers_tokenizer(gemma_file)
    tok = TextTokenizer.from_gguf_fields({**gemma_fields, "tokenizer.chat_template": GEMMA_TEMPLATE})
    texts = [*CORPUS, "<start_of_turn>user\nhi  there<end_of_turn>\n"]
    ours = [tok.encode(t, add_special=False) for t in texts]
    assert_same_ids(tok, texts, ours, [ref.encode(t, add_special_tokens=False) for t in texts])
    chat = CHAT[1:]
    ref.chat_template = GEMMA_TEMPLATE
    assert tok.apply_chat_template(chat) == ref.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)


# =========================================================================== tests: against llama.cpp


def _check_llama_cpp(exe: Path, path: Path, tok: TextTokenizer, sep: str, texts: Sequence[str]) -> None:
    ours = [tok.encode(t, add_special=False) for t in texts]
    assert_same_ids(tok, texts, ours, llama_tokenize_each(exe, path, texts, sep, tok.vocab()[sep]))
    for text in ("Hello world", ""):  # the BOS llama.cpp adds (or not) for the file
        assert tok.encode(text) == llama_tokenize(exe, path, text, bos=True), text


@pytest.mark.parametrize("pre", list(BPE_FILES))
def test_byte_level_matches_llama_cpp(bpe_files: dict[str, Path], pre: str) -> None:
    exe = llama_tokenize_binary()
    path = bpe_files[pre]
    tok = _tok(path)
    specials = {"llama3": LLAMA3_SPECIAL_TEXTS, "chatml": SPECIAL_TEXTS, "mistral": ["[INST]hi[/INST]ok</s>"]}
    sep = {"llama3": "<|end_header_id|>", "chatml": "<|endoftext|>", "mistral": "<unk>"}[BPE_FILES[pre][1]]
    texts = [*CORPUS, *(t for t in specials[BPE_FILES[pre][1]] if sep not in t)]
    _check_llama_cpp(exe, path, tok, sep, texts)
    text = tok.apply_chat_template(CHAT[1:] if pre == "tekken" else CHAT)
    assert tok.encode(text, add_special=False) == llama_tokenize(exe, path, text)


def test_sentencepiece_matches_llama_cpp(spm_file: Path) -> None:
    exe = llama_tokenize_binary()
    tok = _tok(spm_file)
    _check_llama_cpp(exe, spm_file, tok, "</s>", CORPUS)
    text = tok.apply_chat_template(CHAT[1:])
    assert tok.encode(text, add_special=False) == llama_tokenize(exe, spm_file, text)


@pytest.mark.real_model
def test_smollm2_matches_llama_cpp(smollm_file: Path) -> None:
    exe = llama_tokenize_binary()
    tok = _tok(smollm_file)
    _check_llama_cpp(exe, smollm_file, tok, "<|endoftext|>", [*CORPUS, *SPECIAL_TEXTS[:1]])
    text = tok.apply_chat_template(CHAT)
    assert tok.encode_chat(CHAT) == llama_tokenize(exe, smollm_file, text, bos=True)


@pytest.mark.real_model
def test_gemma_matches_llama_cpp(gemma_file: Path, gemma_fields: dict[str, Any]) -> None:
    exe = llama_tokenize_binary()
    tok = TextTokenizer.from_gguf_fields({**gemma_fields, "tokenizer.chat_template": GEMMA_TEMPLATE})
    extra = ["<start_of_turn>user\nhi  there<end_of_turn>\n", "<table><tr><td>x</td></tr></table>", "a" * 300]
    _check_llama_cpp(exe, gemma_file, tok, "<unused7>", [*CORPUS, *extra])
    text = tok.apply_chat_template(CHAT)
    assert text.startswith("<bos><start_of_turn>user\nYou are terse.\n\nWhat is")
    assert tok.encode_chat(CHAT) == llama_tokenize(exe, gemma_file, text, bos=False)
