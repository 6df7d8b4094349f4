"""A GGUF file's tokenizer, rebuilt from its metadata as a ``tokenizers`` tokenizer that gives llama.cpp's ids.

A GGUF file has no ``tokenizer.json``: it stores the vocabulary (``tokenizer.ggml.tokens``), each token's
type (``tokenizer.ggml.token_type``: 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte),
the BPE merges or the SentencePiece scores, the special ids and flags, and *names* the pre-tokenizer
(``tokenizer.ggml.pre``), whose regular expressions live in llama.cpp's source (llama-vocab.cpp). The
file's own reader, llama.cpp, is the reference: the ids here are the ids llama.cpp gives for the file.

What was chosen, and why:

- The tokenizer itself is the ``tokenizers`` library (already a dependency; its BPE, byte-level and
  byte-fallback code is the one the HF tokenizer.json of these models runs). This module only describes
  the file to it: vocabulary, merges, pre-tokenizer, normalizer, decoder and added tokens.
- Not transformers' GGUF conversion (``transformers.integrations.ggml`` / ``gguf``): transformers is a
  dev-only dependency here and heavy to import, and its converter gives other ids than llama.cpp on some
  files: no ``ignore_merges`` for llama3/tekken vocabularies, no SentencePiece ``▁`` before a text's own
  leading space, tokenizer.json's tekken split, and GPT-2's split for a pre-tokenizer name it does not
  know. The tests use it, and llama.cpp's ``llama-tokenize``, as the references to compare ids with.
- Byte-level BPE (``tokenizer.ggml.model`` = ``gpt2``): the pre-tokenizer is chosen by name from
  :data:`PRE_TOKENIZERS`, a table of llama.cpp's names with the split expressions llama.cpp applies for
  them (in order, each splitting the pieces of the one before, matches and gaps both kept: ``tokenizers``'
  ``Split(..., "isolated")``), whether whole words found in the vocabulary skip the merges
  (``ignore_merges``, as llama.cpp's llama3 and tekken and their tokenizer.json do), and llama.cpp's
  ``add_bos`` default. The case-insensitive contractions are written ``'[sS]|'[tT]...`` as llama.cpp
  writes them, not ``(?i:'s|'t...)`` as tokenizer.json does: the two differ only on characters whose case
  folding is an ASCII letter (``'ſ``), where the ids follow llama.cpp; tekken's case classes are llama.cpp's
  too (see ``_TEKKEN``). A name not in the table is refused with the list: text is never tokenized with
  another family's expressions. A file with no name at all gets llama.cpp's ``default`` split, as
  llama.cpp does (with a warning).
- SentencePiece (``tokenizer.ggml.model`` = ``llama``: Llama 2, Mistral 7B v0.1, Gemma 1-3): llama.cpp
  merges adjacent pieces by the score of the piece they form, highest first, leftmost on ties, and
  spells characters outside the vocabulary as ``<0xNN>`` byte tokens. That is a BPE whose merges are
  every split of a vocabulary token into two vocabulary tokens, ranked by the token's score, with byte
  fallback. Spaces are written ``▁``; with ``tokenizer.ggml.add_space_prefix`` (llama.cpp's default for
  these files, off in Gemma's) a ``▁`` starts every run of text, after each special token too, as
  llama.cpp does (a ``Prepend`` normalizer: Llama 2's own tokenizer.json does the same).
- Special tokens: control and unknown tokens are split out of the text before the BPE as special added
  tokens (never merged, dropped by ``decode(skip_special=True)``); user-defined tokens (Gemma's runs of
  spaces and newlines, ``<think>``...) are split out too but are text. Tokens llama.cpp treats as
  end-of-generation by their text (``<|im_end|>``, ``<end_of_turn>``...) are control tokens whatever
  type the file gives them, as in llama.cpp.
- ``add_bos``/``add_eos`` come from ``tokenizer.ggml.add_bos_token``/``add_eos_token``, else llama.cpp's
  defaults (BOS for SentencePiece, llama3 and tekken files). The end-of-turn id is
  ``tokenizer.ggml.eot_token_id``, else the first of llama.cpp's end-of-turn texts found in the vocabulary
  (Gemma's GGUF files name none; ``<end_of_turn>`` ends its turns). ``eog_ids`` are all the ids llama.cpp
  stops generating at.

Not supported (refused): the other tokenizer models (``bert``, ``t5``, ``rwkv``, ``gemma4``...) and
pre-tokenizers not in the table. llama.cpp knows no ``mistral-bpe``; Mistral's byte-level files say
``tekken``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers

__all__ = ["GGUFTokenizer", "PRE_TOKENIZERS", "PreTokenizer", "SUPPORTED_MODELS", "build_gguf_tokenizer"]

# GGUF token types (llama.cpp's llama_token_type).
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6

SUPPORTED_MODELS = ("gpt2", "llama")

# --------------------------------------------------------------------------- pre-tokenizers

# GPT-2's split. llama.cpp writes it without the final `|\s+`; its splitter keeps the unmatched gaps as
# pieces, which is what the final alternative does here.
_GPT2 = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_CONTRACTIONS = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])"
# Llama 3: letters take one leading non-letter, digits go in threes, punctuation keeps its newlines.
_LLAMA3 = _CONTRACTIONS + (r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Qwen 2/2.5/3: Llama 3's, with one digit per piece.
_QWEN2 = _CONTRACTIONS + r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
# Qwen 3.5: Qwen 2's, with combining marks kept on their letters.
_QWEN35 = _CONTRACTIONS + (
    r"|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Mistral's tekken (Nemo, Small 3): case-aware words (upper-case letters, then lower-case ones), single digits.
# As llama.cpp writes it: a letter other than a-z is "upper case", one other than A-Z "lower case" (so
# non-ASCII letters are both), and combining marks are not letters. tokenizer.json's form
# ([\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+...) differs on marks and on a non-ASCII
# capital after lower case; the ids follow llama.cpp's.
_UPPER, _LOWER = r"(?:(?=\p{L})[^a-z])", r"(?:(?=\p{L})[^A-Z])"
_TEKKEN = (
    rf"[^\r\n\p{{L}}\p{{N}}]?{_UPPER}*{_LOWER}+|[^\r\n\p{{L}}\p{{N}}]?{_UPPER}+{_LOWER}*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)


@dataclass(frozen=True)
class PreTokenizer:
    """How llama.cpp pre-tokenizes a byte-level BPE file whose ``tokenizer.ggml.pre`` names this."""

    splits: tuple[str, ...]  # applied in order; each splits the pieces of the previous, gaps kept
    ignore_merges: bool = False  # a piece that is a vocabulary token is that token, merges or not
    add_bos: bool = False  # llama.cpp's default when the file has no tokenizer.ggml.add_bos_token


_DEFAULT = PreTokenizer((r"[\p{P}\$\+<=>\^~\|]+", _GPT2, r"\p{N}+", r"[0-9][0-9][0-9]"))
_GPT2_PRE = PreTokenizer((_GPT2,))
_DIGITS_GPT2 = PreTokenizer((r"\p{N}", _GPT2))  # StarCoder, SmolLM: one digit per piece, then GPT-2's
_LLAMA3_PRE = PreTokenizer((_LLAMA3,), ignore_merges=True, add_bos=True)
_QWEN2_PRE = PreTokenizer((_QWEN2,))

PRE_TOKENIZERS: Mapping[str, PreTokenizer] = {
    "default": _DEFAULT,
    "gpt-2": _GPT2_PRE,
    "phi-2": _GPT2_PRE,
    "mpt": _GPT2_PRE,
    "olmo": _GPT2_PRE,
    "smollm": _DIGITS_GPT2,
    "starcoder": _DIGITS_GPT2,
    "refact": _DIGITS_GPT2,
    "command-r": _DIGITS_GPT2,
    "llama-bpe": _LLAMA3_PRE,
    "llama3": _LLAMA3_PRE,
    "llama-v3": _LLAMA3_PRE,
    "falcon3": _LLAMA3_PRE,
    "pixtral": _LLAMA3_PRE,
    "smaug-bpe": PreTokenizer((_LLAMA3,)),
    "dbrx": PreTokenizer((_LLAMA3,)),
    "qwen2": _QWEN2_PRE,
    "deepseek-r1-qwen": _QWEN2_PRE,
    "megrez": _QWEN2_PRE,
    "stablelm2": _QWEN2_PRE,
    "qwen35": PreTokenizer((_QWEN35,)),
    "tekken": PreTokenizer((_TEKKEN,), ignore_merges=True, add_bos=True),
}

# --------------------------------------------------------------------------- special tokens by text

# llama.cpp's end-of-turn texts, in the order this module prefers them when the file names no eot id.
_EOT_TEXTS = (
    "<|eot_id|>",
    "<|im_end|>",
    "<end_of_turn>",
    "<|end|>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
)
_EOM_TEXTS = ("<|eom_id|>",)
# Every text llama.cpp stops generating at (and types as control, whatever the file says).
_EOG_TEXTS = frozenset({*_EOT_TEXTS, *_EOM_TEXTS, "<|return|>", "<|call|>", "<|flush|>", "<|calls|>", "</s>", "[EOS]"})
# Fill-in-the-middle pad / repository / file-separator texts: llama.cpp stops at these too.
_FIM_EOG_TEXTS = (
    ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    ("<|file_sep|>",),
)
_FIM_EOG_KEYS = ("fim_pad_token_id", "fim_rep_token_id", "fim_sep_token_id")


@dataclass(frozen=True)
class GGUFTokenizer:
    """What :func:`build_gguf_tokenizer` reads out of a GGUF file's metadata."""

    tokenizer: Tokenizer
    model: str  # tokenizer.ggml.model
    pre: str | None  # the pre-tokenizer name used (byte-level BPE only)
    tokens: list[str]
    token_types: list[int]  # after llama.cpp's by-text corrections
    add_bos: bool
    add_eos: bool
    bos_id: int | None
    eos_id: int | None
    eot_id: int | None
    eom_id: int | None
    eog_ids: tuple[int, ...]  # every id llama.cpp ends generation at
    chat_template: str | None

    def token(self, i: int | None) -> str | None:
        return self.tokens[i] if i is not None else None


def _unsupported_pre(pre: str) -> ValueError:
    return ValueError(
        f"unsupported GGUF pre-tokenizer tokenizer.ggml.pre={pre!r}: supported are {', '.join(sorted(PRE_TOKENIZERS))}"
    )


def build_gguf_tokenizer(fields: Mapping[str, Any]) -> GGUFTokenizer:
    """The tokenizer a GGUF file's metadata fields (``tokenizer.*`` keys, as the ``gguf`` package reads
    them or as JSON) describe; ValueError naming what is supported if it is not."""
    kind = fields.get("tokenizer.ggml.model")
    if kind not in SUPPORTED_MODELS:
        raise ValueError(
            f"unsupported GGUF tokenizer tokenizer.ggml.model={kind!r}: supported are "
            "'gpt2' (byte-level BPE) and 'llama' (SentencePiece BPE)"
        )
    tokens = [str(t) if t else f"[EMPTY_{i}]" for i, t in enumerate(fields["tokenizer.ggml.tokens"])]
    n = len(tokens)
    types = [int(t) for t in (fields.get("tokenizer.ggml.token_type") or [NORMAL] * n)][:n]
    if len(types) < n:
        raise ValueError(f"tokenizer.ggml.token_type has {len(types)} entries for {n} tokens")
    for i, t in enumerate(tokens):  # llama.cpp: end-of-generation texts are control tokens
        if t in _EOG_TEXTS and types[i] not in (CONTROL, UNKNOWN):
            types[i] = CONTROL
    vocab = {t: i for i, t in enumerate(tokens)}
    if len(vocab) != n:
        raise ValueError("the GGUF vocabulary lists a token twice")

    def _id(key: str, default: int | None = None) -> int | None:
        v = fields.get(f"tokenizer.ggml.{key}")
        v = default if v is None else int(v)
        return v if v is not None and 0 <= v < n else None

    pre_name: str | None = None
    if kind == "gpt2":
        pre_name = fields.get("tokenizer.ggml.pre") or None
        if pre_name is None:
            warnings.warn(
                "GGUF byte-level vocabulary with no tokenizer.ggml.pre: using llama.cpp's 'default' split", stacklevel=2
            )
            pre_name = "default"
        pre = PRE_TOKENIZERS.get(pre_name)
        if pre is None:
            raise _unsupported_pre(pre_name)
        tok = _byte_level_bpe(vocab, fields.get("tokenizer.ggml.merges") or [], pre)
        bos_id, eos_id = _id("bos_token_id"), _id("eos_token_id")
        add_bos_default = pre.add_bos
    else:
        prefix = bool(fields.get("tokenizer.ggml.add_space_prefix", True))
        scores = fields.get("tokenizer.ggml.scores")
        if scores is None or len(scores) < n:
            raise ValueError("a SentencePiece ('llama') GGUF vocabulary needs tokenizer.ggml.scores for every token")
        # llama.cpp's defaults for a SentencePiece file that names none: <unk> 0, <s> 1, </s> 2
        bos_id, eos_id, unk_id = _id("bos_token_id", 1), _id("eos_token_id", 2), _id("unknown_token_id", 0)
        tok = _sentencepiece_bpe(tokens, [float(s) for s in scores[:n]], types, vocab, unk_id, prefix)
        add_bos_default = True

    # Control and unknown tokens are special; user-defined ones are text that is never split.
    tok.add_special_tokens(
        [
            AddedToken(t, special=True, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty in (CONTROL, UNKNOWN)
        ]
    )
    tok.add_tokens(
        [
            AddedToken(t, special=False, normalized=False)
            for t, ty in zip(tokens, types, strict=True)
            if ty == USER_DEFINED
        ]
    )

    eot_id = _id("eot_token_id")
    if eot_id is None:
        eot_id = next((vocab[t] for t in _EOT_TEXTS if t in vocab), None)
    eom_id = _id("eom_token_id")
    if eom_id is None:
        eom_id = next((vocab[t] for t in _EOM_TEXTS if t in vocab), None)
    eog: set[int] = {i for t, i in vocab.items() if t in _EOG_TEXTS}
    for key, texts in zip(_FIM_EOG_KEYS, _FIM_EOG_TEXTS, strict=True):
        fim = _id(key)
        if fim is None:
            fim = next((vocab[t] for t in texts if t in vocab), None)
        if fim is not None:
            eog.add(fim)
    eog.update(i for i in (eos_id, eot_id, eom_id) if i is not None)
    return GGUFTokenizer(
        tokenizer=tok,
        model=str(kind),
        pre=pre_name,
        tokens=tokens,
        token_types=types,
        add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", add_bos_default)),
        add_eos=bool(fields.get("tokenizer.ggml.add_eos_token", False)),
        bos_id=bos_id,
        eos_id=eos_id,
        eot_id=eot_id,
        eom_id=eom_id,
        eog_ids=tuple(sorted(eog)),
        chat_template=fields.get("tokenizer.chat_template") or None,
    )


# --------------------------------------------------------------------------- the two models


def _byte_level_bpe(vocab: dict[str, int], merges_field: Sequence[str], pre: PreTokenizer) -> Tokenizer:
    merges: list[tuple[str, str]] = []
    for m in merges_field:
        at = m.find(" ", 1)  # llama.cpp splits at the first space after the first character
        if at < 0:
            raise ValueError(f"malformed GGUF merge {m!r}")
        merges.append((m[:at], m[at + 1 :]))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, ignore_merges=pre.ignore_merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            *(pre_tokenizers.Split(Regex(r), behavior="isolated") for r in pre.splits),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(
    tokens: list[str],
    scores: list[float],
    types: list[int],
    vocab: dict[str, int],
    unk_id: int | None,
    add_space_prefix: bool,
) -> Tokenizer:
    merges = sentencepiece_merges(tokens, scores, vocab)
    has_bytes = BYTE in types
    tok = Tokenizer(
        models.BPE(
            vocab=vocab,
            merges=merges,
            unk_token=tokens[unk_id] if unk_id is not None else None,
            fuse_unk=True,
            byte_fallback=has_bytes,
        )
    )
    space = [normalizers.Replace(" ", "▁")]
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), *space] if add_space_prefix else space)
    tok.pre_tokenizer = None
    steps = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if add_space_prefix:
        steps.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(steps)
    return tok


def sentencepiece_merges(
    tokens: Sequence[str], scores: Sequence[float], vocab: Mapping[str, int]
) -> list[tuple[str, str]]:
    """llama.cpp's SentencePiece merging as BPE merges: every way to write a token as two vocabulary
    tokens, best-scored token first (then lower id, then shorter left part)."""
    found: list[tuple[float, int, int]] = []
    for i, t in enumerate(tokens):
        for k in range(1, len(t)):
            if t[:k] in vocab and t[k:] in vocab:
                found.append((-scores[i], i, k))
    found.sort()
    return [(tokens[i][:k], tokens[i][k:]) for _, i, k in found]
