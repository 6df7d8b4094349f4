from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class SamplingParams(_message.Message):
    __slots__ = ("temperature", "top_k", "top_p", "seed", "max_new_tokens", "ignore_eos", "stop")
    TEMPERATURE_FIELD_NUMBER: _ClassVar[int]
    TOP_K_FIELD_NUMBER: _ClassVar[int]
    TOP_P_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    MAX_NEW_TOKENS_FIELD_NUMBER: _ClassVar[int]
    IGNORE_EOS_FIELD_NUMBER: _ClassVar[int]
    STOP_FIELD_NUMBER: _ClassVar[int]
    temperature: float
    top_k: int
    top_p: float
    seed: int
    max_new_tokens: int
    ignore_eos: bool
    stop: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, temperature: _Optional[float] = ..., top_k: _Optional[int] = ..., top_p: _Optional[float] = ..., seed: _Optional[int] = ..., max_new_tokens: _Optional[int] = ..., ignore_eos: _Optional[bool] = ..., stop: _Optional[_Iterable[str]] = ...) -> None: ...

class Open(_message.Message):
    __slots__ = ("prompt", "params", "max_draft_tokens")
    PROMPT_FIELD_NUMBER: _ClassVar[int]
    PARAMS_FIELD_NUMBER: _ClassVar[int]
    MAX_DRAFT_TOKENS_FIELD_NUMBER: _ClassVar[int]
    prompt: _containers.RepeatedScalarFieldContainer[int]
    params: SamplingParams
    max_draft_tokens: int
    def __init__(self, prompt: _Optional[_Iterable[int]] = ..., params: _Optional[_Union[SamplingParams, _Mapping]] = ..., max_draft_tokens: _Optional[int] = ...) -> None: ...

class SparseRow(_message.Message):
    __slots__ = ("ids", "probs")
    IDS_FIELD_NUMBER: _ClassVar[int]
    PROBS_FIELD_NUMBER: _ClassVar[int]
    ids: _containers.RepeatedScalarFieldContainer[int]
    probs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, ids: _Optional[_Iterable[int]] = ..., probs: _Optional[_Iterable[float]] = ...) -> None: ...

class Round(_message.Message):
    __slots__ = ("draft", "q")
    DRAFT_FIELD_NUMBER: _ClassVar[int]
    Q_FIELD_NUMBER: _ClassVar[int]
    draft: _containers.RepeatedScalarFieldContainer[int]
    q: _containers.RepeatedCompositeFieldContainer[SparseRow]
    def __init__(self, draft: _Optional[_Iterable[int]] = ..., q: _Optional[_Iterable[_Union[SparseRow, _Mapping]]] = ...) -> None: ...

class SessionRequest(_message.Message):
    __slots__ = ("open", "round")
    OPEN_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    open: Open
    round: Round
    def __init__(self, open: _Optional[_Union[Open, _Mapping]] = ..., round: _Optional[_Union[Round, _Mapping]] = ...) -> None: ...

class SessionResponse(_message.Message):
    __slots__ = ("tokens", "num_accepted", "finish_reason")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    NUM_ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    FINISH_REASON_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    num_accepted: int
    finish_reason: str
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., num_accepted: _Optional[int] = ..., finish_reason: _Optional[str] = ...) -> None: ...

class ScoreRequest(_message.Message):
    __slots__ = ("tokens", "validation_offset", "top_n")
    TOKENS_FIELD_NUMBER: _ClassVar[int]
    VALIDATION_OFFSET_FIELD_NUMBER: _ClassVar[int]
    TOP_N_FIELD_NUMBER: _ClassVar[int]
    tokens: _containers.RepeatedScalarFieldContainer[int]
    validation_offset: int
    top_n: int
    def __init__(self, tokens: _Optional[_Iterable[int]] = ..., validation_offset: _Optional[int] = ..., top_n: _Optional[int] = ...) -> None: ...

class PositionLogprobs(_message.Message):
    __slots__ = ("position", "has_token", "token", "logprob", "top_ids", "top_logprobs")
    POSITION_FIELD_NUMBER: _ClassVar[int]
    HAS_TOKEN_FIELD_NUMBER: _ClassVar[int]
    TOKEN_FIELD_NUMBER: _ClassVar[int]
    LOGPROB_FIELD_NUMBER: _ClassVar[int]
    TOP_IDS_FIELD_NUMBER: _ClassVar[int]
    TOP_LOGPROBS_FIELD_NUMBER: _ClassVar[int]
    position: int
    has_token: bool
    token: int
    logprob: float
    top_ids: _containers.RepeatedScalarFieldContainer[int]
    top_logprobs: _containers.RepeatedScalarFieldContainer[float]
    def __init__(self, position: _Optional[int] = ..., has_token: _Optional[bool] = ..., token: _Optional[int] = ..., logprob: _Optional[float] = ..., top_ids: _Optional[_Iterable[int]] = ..., top_logprobs: _Optional[_Iterable[float]] = ...) -> None: ...

class ScoreResponse(_message.Message):
    __slots__ = ("positions",)
    POSITIONS_FIELD_NUMBER: _ClassVar[int]
    positions: _containers.RepeatedCompositeFieldContainer[PositionLogprobs]
    def __init__(self, positions: _Optional[_Iterable[_Union[PositionLogprobs, _Mapping]]] = ...) -> None: ...

class HealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class HealthResponse(_message.Message):
    __slots__ = ("model", "vocab_size", "max_context", "open_sessions", "kv_blocks_total", "kv_blocks_free", "kv_blocks_used")
    MODEL_FIELD_NUMBER: _ClassVar[int]
    VOCAB_SIZE_FIELD_NUMBER: _ClassVar[int]
    MAX_CONTEXT_FIELD_NUMBER: _ClassVar[int]
    OPEN_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_TOTAL_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_FREE_FIELD_NUMBER: _ClassVar[int]
    KV_BLOCKS_USED_FIELD_NUMBER: _ClassVar[int]
    model: str
    vocab_size: int
    max_context: int
    open_sessions: int
    kv_blocks_total: int
    kv_blocks_free: int
    kv_blocks_used: int
    def __init__(self, model: _Optional[str] = ..., vocab_size: _Optional[int] = ..., max_context: _Optional[int] = ..., open_sessions: _Optional[int] = ..., kv_blocks_total: _Optional[int] = ..., kv_blocks_free: _Optional[int] = ..., kv_blocks_used: _Optional[int] = ...) -> None: ...
