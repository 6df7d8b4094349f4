"""Tokenizer and chat template, built from the model's own files (GGUF metadata or tokenizer.json)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

__all__ = ["TextTokenizer", "Message"]

Message = dict[str, str]

# GGUF token types (llama.cpp): 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte.
_SPECIAL_TYPES = (3, 4)
# Pre-tokenizer split patterns by GGUF `tokenizer.ggml.pre` (the ones llama.cpp names).
_GPT2_PATTERN = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_PATTERN = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)


class TextTokenizer:
    """Text <-> token ids, plus the chat template and the model's end-of-sequence ids."""

    def __init__(
        self,
        tok: Tokenizer,
        chat_template: str | None,
        bos_token: str | None,
        eos_token: str | None,
        eos_ids: Sequence[int],
        add_bos: bool = False,
    ) -> None:
        self._tok = tok
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        self.add_bos = add_bos
        self.bos_id = tok.token_to_id(bos_token) if bos_token else None
        self._template = (
            ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True).from_string(chat_template)
            if chat_template
            else None
        )

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        return ids

    def decode(self, ids: Sequence[int], skip_special: bool = True) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=skip_special)

    def id_to_token(self, i: int) -> str | None:
        return self._tok.id_to_token(i)

    def special_ids(self) -> set[int]:
        """Ids of the special (added) tokens: they print as nothing in decoded text."""
        return {int(i) for i, t in self._tok.get_added_tokens_decoder().items() if t.special}

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def apply_chat_template(self, messages: Sequence[Message]) -> str:
        """The prompt text for a chat, ending with the assistant turn's opening."""
        if self._template is None:
            # No template in the model files: a plain transcript keeps instruct-less models usable.
            return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"
        return self._template.render(
            messages=list(messages),
            add_generation_prompt=True,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )

    def encode_chat(self, messages: Sequence[Message]) -> list[int]:
        return self.encode(self.apply_chat_template(messages), add_special=not self._template_has_bos())

    def _template_has_bos(self) -> bool:
        return bool(self.chat_template and "bos_token" in self.chat_template)

    def save_hf(self, folder: Path) -> None:
        """Write tokenizer.json + tokenizer_config.json so ``from_hf_folder`` rebuilds this tokenizer."""
        folder.mkdir(parents=True, exist_ok=True)
        self._tok.save(str(folder / "tokenizer.json"))
        tcfg = {
            "chat_template": self.chat_template,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos_token": self.add_bos,
            "eos_token_ids": list(self.eos_ids),
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))

    # ----------------------------------------------------------------- builders

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], eos_ids_extra: Sequence[int] = ()) -> TextTokenizer:
        kind = fields.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise ValueError(
                f"unsupported GGUF tokenizer {kind!r}: only byte-level BPE ('gpt2') vocabularies are supported"
            )
        tokens: list[str] = fields["tokenizer.ggml.tokens"]
        types: list[int] = fields.get("tokenizer.ggml.token_type") or [1] * len(tokens)
        merges = [tuple(m.split(" ", 1)) for m in fields["tokenizer.ggml.merges"]]
        vocab = {t: i for i, t in enumerate(tokens)}
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False, byte_fallback=False))
        pre = fields.get("tokenizer.ggml.pre", "gpt2")
        byte_level = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
        if pre in ("llama-bpe", "llama3", "smaug-bpe"):
            splits = [pre_tokenizers.Split(Regex(_LLAMA3_PATTERN), behavior="isolated")]
        else:
            splits = [pre_tokenizers.Split(Regex(_GPT2_PATTERN), behavior="isolated")]
            if pre in ("smollm", "starcoder", "refact", "qwen2"):
                splits.insert(0, pre_tokenizers.Digits(individual_digits=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([*splits, byte_level])
        tok.decoder = decoders.ByteLevel()
        specials = [t for t, ty in zip(tokens, types, strict=True) if ty in _SPECIAL_TYPES]
        from tokenizers import AddedToken

        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in specials])
        bos_id = fields.get("tokenizer.ggml.bos_token_id")
        eos_id = fields.get("tokenizer.ggml.eos_token_id")
        eos_ids = [i for i in (eos_id, fields.get("tokenizer.ggml.eot_token_id"), *eos_ids_extra) if i is not None]
        return cls(
            tok,
            chat_template=fields.get("tokenizer.chat_template"),
            bos_token=tokens[bos_id] if bos_id is not None else None,
            eos_token=tokens[eos_id] if eos_id is not None else None,
            eos_ids=eos_ids,
            add_bos=bool(fields.get("tokenizer.ggml.add_bos_token", False)),
        )

    @classmethod
    def from_hf_folder(cls, folder: Path, eos_ids: Sequence[int] = ()) -> TextTokenizer:
        tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
        cfg_path = folder / "tokenizer_config.json"
        tcfg: dict[str, Any] = json.loads(cfg_path.read_text()) if cfg_path.exists() else {}
        template = tcfg.get("chat_template")
        tmpl_file = folder / "chat_template.jinja"
        if template is None and tmpl_file.exists():
            template = tmpl_file.read_text()
        if isinstance(template, list):  # [{"name": "default", "template": ...}, ...]
            template = next((t["template"] for t in template if t.get("name") == "default"), None)

        def _tok_str(v: Any) -> str | None:
            return v.get("content") if isinstance(v, dict) else v

        bos = _tok_str(tcfg.get("bos_token"))
        eos = _tok_str(tcfg.get("eos_token"))
        ids = [*eos_ids, *tcfg.get("eos_token_ids", [])]
        if eos and tok.token_to_id(eos) is not None:
            ids.append(tok.token_to_id(eos))
        return cls(tok, template, bos, eos, ids, add_bos=bool(tcfg.get("add_bos_token", False)))
