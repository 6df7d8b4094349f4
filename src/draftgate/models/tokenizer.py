"""Tokenizer and chat template, built from the model's own files (GGUF metadata or tokenizer.json).

GGUF files: :meth:`TextTokenizer.from_gguf_fields` (the tokenizer is rebuilt by
:mod:`draftgate.models.gguf_tokenizer`, which says how and against what it is checked). Chat templates
render in a sandboxed jinja2 environment set up as transformers' ``apply_chat_template`` sets up its own
(``trim_blocks``, ``lstrip_blocks``, loop controls, the ``{% generation %}`` tag, ``tojson`` without HTML
escaping, ``raise_exception``, ``strftime_now``), with the special tokens' texts as variables.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from jinja2.ext import Extension, loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from draftgate.models.gguf_tokenizer import build_gguf_tokenizer

__all__ = ["TextTokenizer", "Message", "render_chat_template"]

Message = dict[str, Any]


class _GenerationTag(Extension):
    """``{% generation %}...{% endgeneration %}`` (transformers marks assistant text with it): renders its body."""

    tags = {"generation"}

    def parse(self, parser: Any) -> Any:
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return jinja2.nodes.CallBlock(self.call_method("_render"), [], [], body).set_lineno(lineno)

    def _render(self, caller: Any) -> str:
        return str(caller())


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
) -> str:
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@lru_cache(maxsize=32)
def _compile(template: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env.from_string(template)


def render_chat_template(
    template: str, messages: Sequence[Message], add_generation_prompt: bool = True, **variables: Any
) -> str:
    """A chat template rendered as transformers renders it: ``messages``, ``add_generation_prompt`` and
    ``variables`` (``bos_token``, ``eos_token``, ``tools``...; ``tools`` and ``documents`` are None unless given)."""
    variables.setdefault("tools", None)
    variables.setdefault("documents", None)
    return _compile(template).render(
        messages=[dict(m) for m in messages], add_generation_prompt=add_generation_prompt, **variables
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
        add_eos: bool = False,
        eog_ids: Sequence[int] = (),
        special_tokens: dict[str, str | None] | None = None,
    ) -> None:
        self._tok = tok
        self.chat_template = chat_template
        self.bos_token = bos_token
        self.eos_token = eos_token
        self.eos_ids: tuple[int, ...] = tuple(dict.fromkeys(eos_ids))
        # Every id llama.cpp ends generation at (GGUF files); the eos ids elsewhere.
        self.eog_ids: tuple[int, ...] = tuple(sorted({*eog_ids, *self.eos_ids}))
        self.add_bos = add_bos
        self.add_eos = add_eos
        self.bos_id = tok.token_to_id(bos_token) if bos_token else None
        self.eos_id = tok.token_to_id(eos_token) if eos_token else None
        # The template variables naming special tokens (unk_token, pad_token...), besides bos and eos.
        self._template_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        if chat_template:
            _compile(chat_template)  # a template that does not parse fails here, not at the first chat

    @property
    def vocab_size(self) -> int:
        return self._tok.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special: bool = True) -> list[int]:
        """Ids of ``text``; special tokens written in it are their single ids. ``add_special``: the BOS
        and EOS the model asks for (a text that already starts with the BOS gets no second one)."""
        ids = self._tok.encode(text, add_special_tokens=False).ids
        if add_special and self.add_bos and self.bos_id is not None and ids[:1] != [self.bos_id]:
            ids = [self.bos_id, *ids]
        if add_special and self.add_eos and self.eos_id is not None:
            ids = [*ids, self.eos_id]
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

    def apply_chat_template(
        self, messages: Sequence[Message], add_generation_prompt: bool = True, **variables: Any
    ) -> str:
        """The prompt text for a chat, ending with the assistant turn's opening (``add_generation_prompt``)."""
        if not self.chat_template:
            # No template in the model files: a plain transcript keeps instruct-less models usable.
            text = "".join(f"{m['role']}: {m['content']}\n" for m in messages)
            return text + "assistant:" if add_generation_prompt else text
        tokens = {**self._template_tokens, "bos_token": self.bos_token or "", "eos_token": self.eos_token or ""}
        return render_chat_template(self.chat_template, messages, add_generation_prompt, **{**tokens, **variables})

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
            **self._template_tokens,
            "bos_token": self.bos_token,
            "eos_token": self.eos_token,
            "add_bos_token": self.add_bos,
            "add_eos_token": self.add_eos,
            "eos_token_ids": list(self.eos_ids),
        }
        (folder / "tokenizer_config.json").write_text(json.dumps(tcfg, indent=2))

    # ----------------------------------------------------------------- builders

    @classmethod
    def from_gguf_fields(cls, fields: dict[str, Any], eos_ids_extra: Sequence[int] = ()) -> TextTokenizer:
        """The tokenizer of a GGUF file from its metadata fields (the ``tokenizer.*`` keys are enough).

        ValueError naming the supported ones for a tokenizer model or pre-tokenizer this cannot rebuild."""
        g = build_gguf_tokenizer(fields)
        eos_ids = [i for i in (g.eos_id, g.eot_id, *eos_ids_extra) if i is not None]
        unk = fields.get("tokenizer.ggml.unknown_token_id")
        pad = fields.get("tokenizer.ggml.padding_token_id")
        ok = range(len(g.tokens))
        return cls(
            g.tokenizer,
            chat_template=g.chat_template,
            bos_token=g.token(g.bos_id),
            eos_token=g.token(g.eos_id),
            eos_ids=eos_ids,
            add_bos=g.add_bos,
            add_eos=g.add_eos,
            eog_ids=g.eog_ids,
            special_tokens={
                "unk_token": g.tokens[unk] if unk in ok else None,
                "pad_token": g.tokens[pad] if pad in ok else None,
            },
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
        specials = {k: _tok_str(tcfg.get(k)) for k in ("unk_token", "pad_token")}
        return cls(
            tok,
            template,
            bos,
            eos,
            ids,
            add_bos=bool(tcfg.get("add_bos_token", False)),
            add_eos=bool(tcfg.get("add_eos_token", False)),
            special_tokens=specials,
        )
