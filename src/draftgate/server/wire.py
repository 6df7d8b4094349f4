"""OpenAI request bodies (pydantic), converted to internal types at the edge.

Parsing is strict (no "1" for 1, no NaN) and every field has a sane range; fields
that would change what the user gets and that we do not implement (n > 1,
logprobs, penalties, tools...) are refused with a 400 rather than ignored.
Extensions, as vLLM names them: ``top_k`` (-1 or 0 = off), ``ignore_eos`` and ``cache_salt`` (a
vLLM target keeps the request's KV apart from other tenants' in its prefix cache; other targets
share no KV across requests).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from draftgate.models.tokenizer import Message
from draftgate.server.api_errors import APIError, from_validation_errors
from draftgate.types import MAX_NEW_TOKENS_LIMIT, MAX_TOP_K, SamplingParams

__all__ = ["ChatRequest", "CompletionRequest", "parse_body", "MAX_BODY_BYTES"]

MAX_BODY_BYTES = 4 << 20  # a request body larger than this is refused (413)
MAX_STOP = 8
MAX_STOP_CHARS = 256
# Fields we do not implement, with the values that mean "not used" (anything else is a 400).
_NEUTRAL: dict[str, tuple[Any, ...]] = {
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "presence_penalty": (None, 0),
    "frequency_penalty": (None, 0),
    "repetition_penalty": (None, 1),
    "logit_bias": (None, {}),
    "tools": (None, []),
    "functions": (None, []),
    "tool_choice": (None, "none", "auto"),
    "function_call": (None, "none", "auto"),
    "response_format": (None, {"type": "text"}),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "audio": (None,),
    "modalities": (None, ["text"]),
}


def _is_neutral(v: Any, neutral: tuple[Any, ...]) -> bool:
    for x in neutral:
        if x is None or v is None:
            if v is x:
                return True
        elif isinstance(x, bool) or isinstance(v, bool):  # True must not pass for 1, nor 0 for False
            if isinstance(x, bool) and isinstance(v, bool) and v == x:
                return True
        elif type(v) in (int, float) and type(x) in (int, float) or type(v) is type(x):
            if v == x:
                return True
    return False


class _Wire(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore", allow_inf_nan=False)


class TextPart(_Wire):
    type: Literal["text"]
    text: str


class ChatMessage(_Wire):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def to_internal(self) -> Message:
        text = self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)
        return {"role": "system" if self.role == "developer" else self.role, "content": text}


class StreamOptions(_Wire):
    include_usage: bool = False


class _Generation(_Wire):
    """What chat and text completions share."""

    model: str = Field(min_length=1, max_length=512)
    max_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS_LIMIT)
    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1, le=MAX_TOP_K)
    seed: int | None = Field(None, ge=0, le=2**63 - 1)
    stop: str | list[str] | None = None
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    n: int | None = 1
    ignore_eos: bool | None = False
    cache_salt: str | None = Field(None, min_length=1, max_length=1024)
    user: str | None = None

    # not implemented: accepted only with their neutral values (see _NEUTRAL)
    logprobs: Any = None
    top_logprobs: Any = None
    presence_penalty: Any = None
    frequency_penalty: Any = None
    repetition_penalty: Any = None
    logit_bias: Any = None
    tools: Any = None
    functions: Any = None
    tool_choice: Any = None
    function_call: Any = None
    response_format: Any = None
    best_of: Any = None
    echo: Any = None
    suffix: Any = None
    audio: Any = None
    modalities: Any = None

    @field_validator(*_NEUTRAL, mode="before")
    @classmethod
    def _refuse_unimplemented(cls, v: Any, info: ValidationInfo) -> Any:
        name = str(info.field_name)
        if not _is_neutral(v, _NEUTRAL[name]):
            raise ValueError(f"'{name}' is not supported by this server; remove it or send its default")
        return v

    @field_validator("n")
    @classmethod
    def _only_one(cls, v: int | None) -> int | None:
        if v not in (None, 1):
            raise ValueError("only n=1 is supported")
        return v

    @field_validator("stop")
    @classmethod
    def _stops(cls, v: str | list[str] | None) -> str | list[str] | None:
        stops = [v] if isinstance(v, str) else (v or [])
        if len(stops) > MAX_STOP:
            raise ValueError(f"at most {MAX_STOP} stop sequences")
        if any(not s or len(s) > MAX_STOP_CHARS for s in stops):
            raise ValueError(f"stop sequences must be non-empty and at most {MAX_STOP_CHARS} characters")
        return v

    @property
    def streaming(self) -> bool:
        return bool(self.stream)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream and self.stream_options and self.stream_options.include_usage)

    def requested_max_tokens(self) -> int | None:
        return self.max_tokens

    def sampling_params(self, max_new_tokens: int) -> SamplingParams:
        stop = (self.stop,) if isinstance(self.stop, str) else tuple(self.stop or ())
        params = SamplingParams(
            temperature=1.0 if self.temperature is None else float(self.temperature),
            top_k=max(0, self.top_k or 0),
            top_p=1.0 if self.top_p is None else float(self.top_p),
            seed=self.seed,
            max_new_tokens=max_new_tokens,
            stop=stop,
            ignore_eos=bool(self.ignore_eos),
            cache_salt=self.cache_salt,
        )
        try:
            return params.validate()
        except ValueError as e:
            raise APIError(400, str(e), code="invalid_value") from None


class ChatRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1, max_length=4096)
    max_completion_tokens: int | None = Field(None, ge=1, le=MAX_NEW_TOKENS_LIMIT)

    def requested_max_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def to_messages(self) -> list[Message]:
        return [m.to_internal() for m in self.messages]


class CompletionRequest(_Generation):
    prompt: str | list[str] | list[int]

    @field_validator("prompt")
    @classmethod
    def _single(cls, v: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(v, list) and not v:
            raise ValueError("prompt must not be empty")
        if isinstance(v, list) and isinstance(v[0], str) and len(v) != 1:
            raise ValueError("only a single prompt per request is supported")
        return v

    def prompt_input(self) -> str | list[int]:
        """The text to tokenize as is (no chat template), or token ids given directly."""
        p = self.prompt
        if isinstance(p, str):
            return p
        if isinstance(p[0], str):
            return str(p[0])
        return [int(t) for t in p]


def parse_body(raw: bytes, model: type[_Generation]) -> Any:
    """Bytes -> a validated request model, or a 400 that says what is wrong (and where)."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise APIError(400, f"the request body is not valid UTF-8 (byte {e.start})", code="invalid_encoding") from None
    if not text.strip():
        raise APIError(400, "the request body is empty; send a JSON object", code="invalid_json")
    try:
        return model.model_validate_json(text)
    except ValidationError as e:
        raise from_validation_errors(e.errors(include_url=False, include_input=False)) from None
