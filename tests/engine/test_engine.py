"""Engine end to end: lossless speculation (greedy and seeded sampling), stop rules, leaks, bad input, stats.

The strongest checks compare a speculative run with plain decoding token for
token: greedy must match exactly, and so must seeded sampling, because
deterministic drafts are verified by matching the target's own choice drawn
with a uniform keyed by output position (engine.step).
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest
from engine_support import (
    TINY_NEW,
    TINY_PROMPTS,
    TINY_SETTINGS,
    WAIT_S,
    FrozenCost,
    OracleDrafter,
    Result,
    assert_no_leaks,
    engine_with,
    gather_generate,
    run_batch,
    run_batch_allow_error,
    running,
    spec_engine,
    tiny_prompts,
)

from draftgate.drafters.base import Draft, DraftRequest
from draftgate.drafters.eagle import shipped_head
from draftgate.engine import Chunk, DrafterKind, Engine, EngineConfig, build_engine
from draftgate.engine.factory import build_drafter
from draftgate.errors import BadRequestError, CapacityError, ModelLoadError
from draftgate.models.gguf_blocks import load_blocks
from draftgate.models.loader import LoadedModel
from draftgate.types import SamplingParams

GROUNDED = "Repeat this list exactly, separated by commas: apples, pears, plums, cherries, grapes, lemons, limes, figs."
CODE = "Rewrite this code with the variable x renamed to count:\ndef f(x):\n    x = x + 1\n    return x * x\n"
CHAT = "Write a short poem about the sea."
SHORT = "What is the capital of France? Answer briefly."
REAL_PROMPTS = [GROUNDED, CODE, CHAT, SHORT]
REAL_NEW = 24
MODEL_CACHE = Path(__file__).resolve().parents[2] / ".cache" / "models"  # as the real_model fixture
BATCH_NEW = 16  # the 12-config batch matrix: greedy, so plain's first 16 tokens
SPEC = [DrafterKind.NGRAM, DrafterKind.SUFFIX, DrafterKind.AUTO, DrafterKind.EAGLE]  # eagle: the shipped head
KS: list[int | None] = [1, 4, 8, None]


def _kid(k: int | None) -> str:
    return "Kauto" if k is None else f"K{k}"


# =================================================================== real model


@pytest.fixture(scope="module")
def real_ids(real_engine: Engine) -> dict[str, list[int]]:
    return {p: real_engine.encode(p) for p in REAL_PROMPTS}


@pytest.fixture(scope="module")
def real_plain(real_engine: Engine, real_ids: dict[str, list[int]]) -> dict[str, list[int]]:
    """Plain greedy decoding, one request at a time."""
    params = SamplingParams(max_new_tokens=REAL_NEW)
    out = {p: real_engine.complete(ids, params).token_ids for p, ids in real_ids.items()}
    assert_no_leaks(real_engine)
    return out


@pytest.mark.real_model
@pytest.mark.parametrize("k", KS, ids=_kid)
@pytest.mark.parametrize("kind", SPEC, ids=lambda d: d.value)
def test_real_greedy_batch_of_4_equals_plain(
    real_engine: Engine,
    real_model: LoadedModel,
    real_ids: dict[str, list[int]],
    real_plain: dict[str, list[int]],
    kind: DrafterKind,
    k: int | None,
) -> None:
    """Mixed prompts submitted at once share rounds (jagged acceptance); each equals its plain output.

    eagle at K = auto prices forwards with FrozenCost (as in the batch-1 test below): its drafts
    cost milliseconds, so on a loaded machine whether these short requests draft would follow the
    load; lookups cost microseconds and keep the measured costs.
    """
    params = SamplingParams(max_new_tokens=BATCH_NEW)
    prompts = [real_ids[p] for p in REAL_PROMPTS]
    spec = spec_engine(real_engine, real_model, kind, k)
    if k is None and kind == DrafterKind.EAGLE:
        spec.policy.cost = FrozenCost()
    with running(spec) as eng:
        if k is None:  # the async API: asyncio.gather over generate()
            outs = gather_generate(eng, prompts, params)
        else:
            res = run_batch(eng, prompts, params)
            outs = [r.token_ids for r in res]
            grounded = res[REAL_PROMPTS.index(GROUNDED)].stats
            assert grounded.acceptance_rate > 0, grounded  # the copying prompt really speculated
    for p, got in zip(REAL_PROMPTS, outs, strict=True):
        assert got == real_plain[p][:BATCH_NEW], f"prompt {p[:30]!r} diverged from plain decoding"
    assert eng.stats.accepted_tokens > 0


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("kind", "k"),
    [(DrafterKind.NGRAM, 4), (DrafterKind.SUFFIX, 8), (DrafterKind.AUTO, None)],
    ids=["ngram-K4", "suffix-K8", "auto-Kauto"],
)
def test_real_greedy_alone_equals_plain(
    real_engine: Engine,
    real_model: LoadedModel,
    real_ids: dict[str, list[int]],
    real_plain: dict[str, list[int]],
    kind: DrafterKind,
    k: int | None,
) -> None:
    params = SamplingParams(max_new_tokens=REAL_NEW)
    with running(spec_engine(real_engine, real_model, kind, k)) as eng:
        grounded = eng.complete(real_ids[GROUNDED], params)
    assert grounded.token_ids == real_plain[GROUNDED]
    assert grounded.stats.acceptance_rate > 0 and grounded.stats.mean_accepted_length > 1.0


@pytest.mark.real_model
@pytest.mark.parametrize("k", KS, ids=_kid)
@pytest.mark.parametrize("kind", [DrafterKind.EAGLE, DrafterKind.AUTO], ids=lambda d: d.value)
def test_real_head_alone_equals_plain_on_every_prompt(
    real_engine: Engine,
    real_model: LoadedModel,
    real_ids: dict[str, list[int]],
    real_plain: dict[str, list[int]],
    kind: DrafterKind,
    k: int | None,
) -> None:
    """Batch 1 with the draft head shipped for SmolLM2: greedy, token for token, and it drafts.

    K = auto prices forwards with FrozenCost: whether it drafts then follows acceptance, not this
    machine's load (a loaded CI run timed K > 0 out of all but one round of these short requests).
    """
    params = SamplingParams(max_new_tokens=REAL_NEW)
    head = str(shipped_head(real_model))
    spec = spec_engine(real_engine, real_model, kind, k, draft_head=head)
    if k is None:
        spec.policy.cost = FrozenCost()
    with running(spec) as eng:
        for p in REAL_PROMPTS:
            got = eng.complete(real_ids[p], params)
            assert got.token_ids == real_plain[p], f"prompt {p[:30]!r} diverged from plain decoding"
        chat = eng.complete(real_ids[CHAT], params).stats
    assert eng.stats.accepted_tokens > 0
    if kind == DrafterKind.EAGLE and k != 0:
        assert chat.draft_tokens > 0 and chat.accepted_tokens > 0, chat  # the head drafts open chat too


@pytest.mark.real_model
def test_real_auto_picks_its_model_source(real_model: LoadedModel) -> None:
    """auto's model source on an embedded target: the target's own quantized copy for a float target on the
    native kernels, the shipped head for a target already quantized or on PyTorch's kernels; 'none' and a
    remote target: lookups only."""
    from draftgate.drafters.auto import AutoDrafter
    from draftgate.drafters.eagle import EagleDrafter
    from draftgate.drafters.model import ModelDrafter
    from draftgate.models.runner import Kernels

    auto = EngineConfig(drafter=DrafterKind.AUTO, num_blocks=32, cache_dir=MODEL_CACHE)
    default = build_drafter(auto, real_model)
    assert isinstance(default, AutoDrafter) and isinstance(default._model, ModelDrafter)  # noqa: SLF001
    assert default._model.name == "quant" and default.feature_layers == ()  # noqa: SLF001
    for d in (
        build_drafter(replace(auto, dtype="auto"), _real_blocks(real_model)),
        build_drafter(replace(auto, kernels=Kernels.TORCH), real_model),
    ):
        assert isinstance(d, AutoDrafter) and isinstance(d._model, EagleDrafter)  # noqa: SLF001
        assert d.feature_layers == (2, 15, 30)
    off = build_drafter(replace(auto, draft_head="none"), real_model)
    remote = build_drafter(auto, real_model, features=False)
    for d in (off, remote):  # a remote target has no hidden states: lookups, no error
        assert isinstance(d, AutoDrafter) and d._model is None and d.feature_layers == ()  # noqa: SLF001
    with pytest.raises(ModelLoadError, match="needs a draft head"):
        build_drafter(EngineConfig(drafter=DrafterKind.EAGLE, draft_head="none"), real_model)


@pytest.fixture(scope="module")
def real_bf16_engine(real_model: LoadedModel) -> Iterator[Engine]:
    """Plain decoding on SmolLM2 with bfloat16 weights (the native kernels compute in float32)."""
    cfg = EngineConfig(drafter=DrafterKind.NONE, dtype="bfloat16", num_blocks=160, max_batch=8)
    bf16 = LoadedModel(
        real_model.config,
        {k: v.to(cfg.torch_dtype) if v.is_floating_point() else v for k, v in real_model.weights.items()},
        real_model.tokenizer,
        real_model.source,
    )
    engine = build_engine(cfg, loaded=bf16)
    yield engine
    engine.shutdown()


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("kind", "k"),
    [(DrafterKind.NGRAM, 8), (DrafterKind.SUFFIX, 4), (DrafterKind.AUTO, None)],
    ids=["ngram-K8", "suffix-K4", "auto-Kauto"],
)
def test_real_bfloat16_speculation_equals_bfloat16_plain(
    real_bf16_engine: Engine, real_model: LoadedModel, real_ids: dict[str, list[int]], kind: DrafterKind, k: int | None
) -> None:
    """Reduced-precision weights stay exact: the native forward is batch invariant in any weight dtype
    (PyTorch's bf16 CPU kernels changed 16 of 20 greedy answers, docs/BENCHMARKS.md)."""
    _assert_speculation_equals_plain(real_bf16_engine, real_model, real_ids, kind, k)


def _assert_speculation_equals_plain(
    base: Engine, loaded: LoadedModel, real_ids: dict[str, list[int]], kind: DrafterKind, k: int | None
) -> None:
    """Drafter ``kind`` over base's runner gives base's own greedy tokens on REAL_PROMPTS, and drafts."""
    params = SamplingParams(max_new_tokens=REAL_NEW)
    prompts = [real_ids[p] for p in REAL_PROMPTS]
    plain = [base.complete(ids, params).token_ids for ids in prompts]
    with running(spec_engine(base, loaded, kind, k)) as eng:
        res = run_batch(eng, prompts, params)
    assert [r.token_ids for r in res] == plain
    assert sum(r.stats.accepted_tokens for r in res) > 0, "speculation was not exercised"


def _real_blocks(real_model: LoadedModel) -> LoadedModel:
    """SmolLM2 with its GGUF's own Q4_1/Q8_0 blocks (what --dtype auto loads)."""
    c = real_model.config
    assert real_model.gguf_path is not None
    return replace(real_model, blocks=load_blocks(real_model.gguf_path, c))


@pytest.fixture(scope="module")
def real_q4_engine(real_model: LoadedModel) -> Iterator[Engine]:
    """Plain decoding on SmolLM2's own quantization (Q4_1 products, Q8_0 embedding and head)."""
    cfg = EngineConfig(drafter=DrafterKind.NONE, dtype="auto", num_blocks=160, max_batch=8, cache_dir=MODEL_CACHE)
    engine = build_engine(cfg, loaded=_real_blocks(real_model))
    yield engine
    engine.shutdown()


@pytest.mark.real_model
@pytest.mark.parametrize(
    ("kind", "k"), [(DrafterKind.SUFFIX, 4), (DrafterKind.AUTO, None)], ids=["suffix-K4", "auto-Kauto"]
)
def test_real_quantized_speculation_equals_quantized_plain(
    real_q4_engine: Engine, real_model: LoadedModel, real_ids: dict[str, list[int]], kind: DrafterKind, k: int | None
) -> None:
    """GGUF's own quantization stays exact: the quantized products are batch invariant too. The drafter
    is built for the quantized model, as --dtype auto builds it (auto: lookups and the draft head)."""
    _assert_speculation_equals_plain(real_q4_engine, _real_blocks(real_model), real_ids, kind, k)


@pytest.mark.real_model
def test_real_quant_self_draft_equals_plain(
    real_engine: Engine, real_model: LoadedModel, real_ids: dict[str, list[int]], real_plain: dict[str, list[int]]
) -> None:
    """The float32 target drafted by its own Q4 copy (no llama.cpp): exact, and mostly accepted."""
    cfg = EngineConfig(drafter=DrafterKind.QUANT, k=4, cache_dir=MODEL_CACHE).validate()
    drafter = build_drafter(cfg, real_model)
    assert drafter is not None and drafter.name == "quant"
    params = SamplingParams(max_new_tokens=REAL_NEW)
    with running(engine_with(real_engine, drafter, k=4)) as eng:
        res = run_batch(eng, [real_ids[p] for p in REAL_PROMPTS], params)
    assert [r.token_ids for r in res] == [real_plain[p] for p in REAL_PROMPTS]
    accepted = sum(r.stats.accepted_tokens for r in res)
    drafted = sum(r.stats.draft_tokens for r in res)
    assert drafted > 0 and accepted / drafted > 0.5, (accepted, drafted)


def test_quant_self_draft_refuses_an_already_quantized_target(real_model: LoadedModel) -> None:
    with pytest.raises(ModelLoadError, match="--dtype auto already runs"):
        build_drafter(EngineConfig(drafter=DrafterKind.QUANT, dtype="auto"), _real_blocks(real_model))


@pytest.mark.real_model
def test_real_seeded_sampling_speculative_equals_plain(
    real_engine: Engine, real_model: LoadedModel, real_ids: dict[str, list[int]]
) -> None:
    """Temperature, top-k and top-p at once; the tiny-model tests cover each alone, and seed effects."""
    params = SamplingParams(temperature=0.8, top_k=20, top_p=0.9, seed=11, max_new_tokens=REAL_NEW)
    prompts = [real_ids[GROUNDED], real_ids[CODE]]
    plain = [real_engine.complete(ids, params).token_ids for ids in prompts]
    head = str(shipped_head(real_model))  # auto with the draft head too (eagle takes it by default)
    for kind, k in [
        (DrafterKind.NGRAM, 4),
        (DrafterKind.AUTO, None),
        (DrafterKind.EAGLE, 4),
        (DrafterKind.EAGLE, None),
    ]:
        with running(spec_engine(real_engine, real_model, kind, k, draft_head=head)) as eng:
            res = run_batch(eng, prompts, params)
        assert [r.token_ids for r in res] == plain, f"{kind.value} K={k} changed the seeded sample"
        assert sum(r.stats.accepted_tokens for r in res) > 0, "speculation was not exercised"


@pytest.mark.real_model
def test_real_eos_inside_accepted_block(real_engine: Engine, real_model: LoadedModel) -> None:
    # The prompt ends with the answer followed by <|im_end|>: once the model has
    # written the answer, prompt lookup drafts EOS and the template tokens after it.
    ids = real_engine.encode("Reply with exactly this sentence and nothing else: The capital of France is Paris.")
    params = SamplingParams(max_new_tokens=40)
    plain = real_engine.complete(ids, params)
    assert plain.finish_reason == "stop" and plain.token_ids[-1] in real_engine.tokenizer.eos_ids
    with running(spec_engine(real_engine, real_model, DrafterKind.NGRAM, 8)) as eng:
        res = run_batch(eng, [ids], params)[0]
    assert res.token_ids == plain.token_ids
    assert res.finish_reason == "stop" and res.text == plain.text
    last = res.chunks[-1]
    assert len(last.token_ids) > 1, "EOS did not arrive inside an accepted block"
    # Drafts after EOS were accepted too and then cut: the round accepted more than was kept,
    # and emitted counts what was kept (every token but the prefill's).
    st = res.stats
    assert st.accepted_tokens + st.rounds > len(res.token_ids) - 1
    assert st.emitted_tokens == len(res.token_ids) - 1


@pytest.mark.real_model
def test_real_stop_string_cut_like_plain(real_engine: Engine, real_model: LoadedModel) -> None:
    ids = real_engine.encode(GROUNDED)
    full = real_engine.complete(ids, SamplingParams(max_new_tokens=24)).text
    assert "plums" in full
    params = SamplingParams(max_new_tokens=24, stop=("plums",))
    plain = real_engine.complete(ids, params)
    with running(spec_engine(real_engine, real_model, DrafterKind.NGRAM, 8)) as eng:
        spec = eng.complete(ids, params)
    assert plain.text == full[: full.index("plums")] == spec.text
    assert spec.token_ids == plain.token_ids and spec.finish_reason == plain.finish_reason == "stop"


@pytest.mark.real_model
def test_real_incremental_text_never_splits_a_character(real_engine: Engine) -> None:
    """Byte-level BPE splits emoji and accents over tokens: chunks hold bytes back until whole."""
    from draftgate.engine.sequence import IncrementalText, StopChecker

    tok = real_engine.tokenizer
    text = "Café 😀 naïve 日本語 ok"
    ids = tok.encode(text, add_special=False)
    assert len(ids) > len(text.split())  # some characters do span several tokens
    params = SamplingParams(stop=("ok",))
    det = IncrementalText(StopChecker(tok, params))
    parts = [det.delta(tok.decode, [t], final=False) for t in ids] + [det.delta(tok.decode, [], True)]
    assert all("\ufffd" not in p for p in parts)
    assert "".join(parts) == text[: text.index("ok")]


# =================================================================== tiny model


@pytest.mark.parametrize("k", [*range(1, 9), None], ids=_kid)
@pytest.mark.parametrize("kind", [DrafterKind.NGRAM, DrafterKind.SUFFIX], ids=lambda d: d.value)
def test_tiny_greedy_speculative_equals_plain(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], kind: DrafterKind, k: int | None
) -> None:
    eng = make_tiny(kind, k, max_batch=len(TINY_PROMPTS))
    res = run_batch(eng, TINY_PROMPTS, TINY_SETTINGS["greedy"])
    for i, r in enumerate(res):
        assert r.token_ids == tiny_plain["greedy"][i], f"prompt {i} diverged"
        assert r.finish_reason == "length"
    assert sum(r.stats.accepted_tokens for r in res) > 0


@pytest.mark.parametrize("setting", ["t0.8", "topk20", "topp0.9"])
@pytest.mark.parametrize(
    ("kind", "k"),
    [(DrafterKind.NGRAM, 3), (DrafterKind.SUFFIX, 8), (DrafterKind.AUTO, None)],
    ids=["ngram", "suffix", "auto"],
)
def test_tiny_seeded_sampling_speculative_equals_plain(
    make_tiny: Callable[..., Engine],
    tiny_plain: dict[str, list[list[int]]],
    kind: DrafterKind,
    k: int | None,
    setting: str,
) -> None:
    eng = make_tiny(kind, k, max_batch=4)  # fewer slots than requests: some wait and join later
    res = run_batch(eng, TINY_PROMPTS, TINY_SETTINGS[setting])
    assert [r.token_ids for r in res] == tiny_plain[setting]
    assert sum(r.stats.accepted_tokens for r in res) > 0


def test_tiny_seeds_reproducible_and_distinct(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.NONE)
    prompt = TINY_PROMPTS[0]
    outs = []
    for seed in range(6):
        params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=20, ignore_eos=True)
        a, b = eng.complete(prompt, params).token_ids, eng.complete(prompt, params).token_ids
        assert a == b
        outs.append(tuple(a))
    assert len(set(outs)) >= 5, "different seeds should (almost surely) give different samples"
    unseeded = {
        tuple(eng.complete(prompt, SamplingParams(temperature=1.0, max_new_tokens=20)).token_ids) for _ in range(3)
    }
    assert len(unseeded) >= 2


@pytest.mark.parametrize("k", [4, None])
def test_a_sampled_model_draft_gives_a_seed_the_same_tokens_alone_or_in_a_batch(
    make_tiny: Callable[..., Engine], tiny_draft_dir: object, k: int | None
) -> None:
    """With a sampled q, which positions get drafted changes the tokens; adaptive K must not
    follow the clock or the batch for a seeded request (it did: 2 of 24 seeded runs differed)."""
    eng = make_tiny(DrafterKind.MODEL, k, draft_model=str(tiny_draft_dir), max_batch=8)
    prompts = tiny_prompts(6, seed=5)
    params = [
        SamplingParams(temperature=0.9, top_p=0.95, seed=40 + i, max_new_tokens=40, ignore_eos=True) for i in range(6)
    ]
    alone = [eng.complete(ids, p).token_ids for ids, p in zip(prompts, params, strict=True)]
    assert [eng.complete(prompts[0], params[0]).token_ids] == alone[:1]  # twice: the same
    results = [Result() for _ in prompts]
    for ids, p, r in zip(prompts, params, results, strict=True):
        eng.submit(ids, p, r)
    for r in results:
        assert r.done.wait(WAIT_S)
    assert [r.token_ids for r in results] == alone
    assert eng.stats.draft_tokens > 0


def test_plain_engine_matches_a_naive_decode_loop(make_tiny: Callable[..., Engine], tiny_model: LoadedModel) -> None:
    from draftgate.models.runner import ForwardItem, ModelRunner

    runner = ModelRunner(tiny_model, num_blocks=64, block_size=8, enable_prefix_cache=False)
    eng = make_tiny(DrafterKind.NONE)
    for i, prompt in enumerate(TINY_PROMPTS[:3]):
        logits = runner.prefill(i, prompt)
        want = [int(logits.argmax())]
        while len(want) < 25:
            (lg,) = runner.forward([ForwardItem(i, [want[-1]])])
            want.append(int(lg[-1].argmax()))
        runner.free(i)
        assert eng.complete(prompt, SamplingParams(max_new_tokens=25, ignore_eos=True)).token_ids == want


# ------------------------------------------------------------------ drafts that follow plain decoding


@pytest.mark.parametrize("k", [2, 5, 8])
def test_tiny_jagged_acceptance_rollback_equals_plain(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], k: int
) -> None:
    base = make_tiny(DrafterKind.NONE, max_batch=len(TINY_PROMPTS))
    refs = [p + o for p, o in zip(TINY_PROMPTS, tiny_plain["greedy"], strict=True)]
    oracle = OracleDrafter(refs, noise=0.25, seed=k)
    with running(engine_with(base, oracle, k=k)) as eng:
        res = run_batch(eng, TINY_PROMPTS, TINY_SETTINGS["greedy"])
    assert [r.token_ids for r in res] == tiny_plain["greedy"]
    accepted = {a for d, a in oracle.rounds if d == k}
    assert accepted >= {0, 1, k}, f"rollback offsets not all exercised: {sorted(accepted)}"


# ------------------------------------------------------------------ stop rules


def _find_eos_prompt(eng: Engine) -> tuple[list[int], list[int]]:
    """A prompt whose greedy output hits EOS after a few tokens, with its plain output."""
    prompts = [p for seed in range(64) for p in tiny_prompts(1, seed=seed)]
    for prompt, r in zip(prompts, run_batch(eng, prompts, SamplingParams(max_new_tokens=40)), strict=True):
        if r.finish_reason == "stop" and len(r.token_ids) >= 6:
            return prompt, r.token_ids
    raise AssertionError("no tiny prompt stops by EOS")


def test_tiny_eos_inside_accepted_block(make_tiny: Callable[..., Engine]) -> None:
    base = make_tiny(DrafterKind.NONE, max_batch=64)
    prompt, plain = _find_eos_prompt(base)
    # The oracle drafts the continuation *past* EOS (ignore_eos plain run): every
    # draft is accepted, so with rounds of k + 1 tokens EOS lands inside a block
    # (not at its end) and the block must be cut right after it.
    params = SamplingParams(max_new_tokens=len(plain) + 10, ignore_eos=True)
    beyond = base.complete(prompt, params).token_ids
    assert beyond[: len(plain)] == plain
    k = next(k for k in range(8, 1, -1) if (len(plain) - 1) % (k + 1))
    oracle = OracleDrafter([prompt + beyond])
    with running(engine_with(base, oracle, k=k)) as eng:
        res = run_batch(eng, [prompt], SamplingParams(max_new_tokens=40))[0]
    assert res.token_ids == plain and res.finish_reason == "stop"
    assert len(res.chunks[-1].token_ids) > 1  # the last block carried EOS ...
    st = res.stats
    assert st.accepted_tokens + st.rounds > len(plain) - 1  # ... and accepted drafts after it, cut
    assert st.emitted_tokens == len(res.token_ids) - 1  # emitted counts what was kept (not the prefill's)


@pytest.mark.parametrize("n", [1, 2, 5])
def test_tiny_max_new_tokens_inside_block(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], n: int
) -> None:
    base = make_tiny(DrafterKind.NONE)
    refs = [p + o for p, o in zip(TINY_PROMPTS, tiny_plain["greedy"], strict=True)]
    oracle = OracleDrafter(refs)
    with running(engine_with(base, oracle, k=8)) as eng:
        res = run_batch(eng, TINY_PROMPTS[:3], SamplingParams(max_new_tokens=n, ignore_eos=True))
    for r, want in zip(res, tiny_plain["greedy"][:3], strict=True):
        assert r.token_ids == want[:n] and r.finish_reason == "length"
    assert all(d <= n - 1 for d, _ in oracle.rounds), "K was not capped by the tokens left"


def test_tiny_stop_string_equals_plain(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]]
) -> None:
    base = make_tiny(DrafterKind.NONE)
    out = tiny_plain["greedy"][3]
    full = base.tokenizer.decode(out)
    stop = base.tokenizer.decode(out[8:10])  # two words from the middle of the output
    assert full.index(stop) > 0
    params = SamplingParams(max_new_tokens=TINY_NEW, ignore_eos=True, stop=(stop,))
    plain = base.complete(TINY_PROMPTS[3], params)
    assert plain.text == full[: full.index(stop)] and plain.finish_reason == "stop"
    spec = make_tiny(DrafterKind.NGRAM, 8).complete(TINY_PROMPTS[3], params)
    with running(engine_with(base, OracleDrafter([TINY_PROMPTS[3] + out]), k=8)) as eng:
        oracle = eng.complete(TINY_PROMPTS[3], params)  # every draft accepted: the block runs past the stop
    for c in (spec, oracle):
        assert (c.text, c.token_ids, c.finish_reason) == (plain.text, plain.token_ids, "stop")
        assert c.stats.emitted_tokens == len(c.token_ids) - 1  # the stop cut is not counted as emitted


def test_streamed_text_is_the_final_text(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]]
) -> None:
    """Chunks never split a stop string: what was streamed is what a blocking call returns."""
    tok = make_tiny(DrafterKind.NONE).tokenizer
    out = tiny_plain["greedy"][1]
    stop = tok.decode(out[12:14])
    params = SamplingParams(max_new_tokens=TINY_NEW, ignore_eos=True, stop=(stop,))
    eng = make_tiny(DrafterKind.SUFFIX, 4)
    (r,) = run_batch(eng, [TINY_PROMPTS[1]], params)
    assert stop not in r.text and r.text == eng.complete(TINY_PROMPTS[1], params).text
    assert all(stop not in c.text for c in r.chunks)


# ------------------------------------------------------------------ leaks, cancel, errors


def test_cancel_mid_stream_frees_everything(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.NGRAM, 4)
    first = threading.Event()
    res = Result()

    def sink(c):  # noqa: ANN001
        res(c)
        first.set()

    cancel = eng.submit(TINY_PROMPTS[0], SamplingParams(max_new_tokens=200, ignore_eos=True), sink)
    assert first.wait(WAIT_S)
    cancel()
    assert res.done.wait(WAIT_S)
    assert res.finish_reason == "abort" and len(res.token_ids) < 200
    assert_no_leaks(eng)
    # The engine keeps serving.
    assert eng.complete(TINY_PROMPTS[1], SamplingParams(max_new_tokens=5)).finish_reason in ("length", "stop")


def test_cancel_before_admission_and_via_generate(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.SUFFIX, None, max_batch=1)
    held = Result()
    release = eng.submit(TINY_PROMPTS[1], SamplingParams(max_new_tokens=5), held, ready=lambda: False)  # holds the slot
    deadline = time.monotonic() + WAIT_S
    while not held.chunks:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    waiting = Result()
    cancel = eng.submit(TINY_PROMPTS[2], SamplingParams(max_new_tokens=50), waiting)
    cancel()  # still waiting: the batch is full
    assert waiting.done.wait(WAIT_S) and waiting.finish_reason == "abort" and waiting.token_ids == []
    release()
    assert held.done.wait(WAIT_S) and held.finish_reason == "abort"

    async def stream_then_drop() -> int:
        agen = eng.generate(TINY_PROMPTS[3], SamplingParams(max_new_tokens=200, ignore_eos=True))
        n = 0
        async for c in agen:
            n += len(c.token_ids)
            if n >= 3:
                break
        await agen.aclose()  # what a disconnecting client's server does
        return n

    assert asyncio.run(stream_then_drop()) >= 3
    assert_no_leaks(eng)


def test_shutdown_ends_requests_in_flight(make_tiny: Callable[..., Engine]) -> None:
    """Nothing hangs: shutdown aborts running and waiting requests and frees their KV."""
    eng = make_tiny(DrafterKind.NGRAM, 4, max_batch=1)
    first = threading.Event()
    running_req, waiting_req = Result(), Result()

    def sink(c: Chunk) -> None:
        running_req(c)
        first.set()

    eng.submit(TINY_PROMPTS[0], SamplingParams(max_new_tokens=200, ignore_eos=True), sink)
    eng.submit(TINY_PROMPTS[1], SamplingParams(max_new_tokens=200, ignore_eos=True), waiting_req)
    assert first.wait(WAIT_S)
    eng.shutdown()
    assert running_req.done.wait(5) and running_req.finish_reason == "abort"
    assert waiting_req.done.wait(5) and waiting_req.finish_reason == "abort"
    eng.runner.kv.check_no_leaks()
    # A request after shutdown is served (the loop restarts) rather than left hanging.
    late = Result()
    eng.submit(TINY_PROMPTS[2], SamplingParams(max_new_tokens=5), late)
    assert late.done.wait(WAIT_S) and late.finish_reason in ("length", "stop")


def test_a_client_gone_with_its_event_loop_harms_no_one(make_tiny: Callable[..., Engine]) -> None:
    """A stream whose asyncio loop has closed (client gone) must not fail the other requests."""
    eng = make_tiny(DrafterKind.NGRAM, 4)
    other = Result()
    eng.submit(TINY_PROMPTS[0], SamplingParams(max_new_tokens=120, ignore_eos=True), other)

    async def leave_early() -> None:
        params = SamplingParams(max_new_tokens=200, ignore_eos=True)

        async def read_one() -> None:
            async for _ in eng.generate(TINY_PROMPTS[1], params):
                break  # the loop closes right after; the engine may still be mid-step for this stream

        # A dead engine loop would leave this waiting forever.
        await asyncio.wait_for(read_one(), 60)

    for _ in range(3):
        asyncio.run(leave_early())
    assert other.done.wait(WAIT_S)
    assert other.finish_reason == "length", other.chunks[-1].error
    assert_no_leaks(eng)


def test_many_concurrent_requests_then_no_leaks(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.AUTO, None, num_blocks=96, max_batch=8)  # blocks for fewer than 30 at once
    rng = random.Random(3)
    prompts = tiny_prompts(30, seed=99)
    params = [
        SamplingParams(temperature=rng.choice([0.0, 0.7, 1.0]), seed=i, max_new_tokens=rng.randint(1, 30))
        for i in range(30)
    ]
    cancels = []
    results = [Result() for _ in prompts]
    for ids, p, r in zip(prompts, params, results, strict=True):
        cancels.append(eng.submit(ids, p, r))
    for c in cancels[::7]:
        c()
    for r in results:
        assert r.done.wait(WAIT_S)
    reasons = {r.finish_reason for r in results}
    assert reasons <= {"stop", "length", "abort"}, reasons
    assert_no_leaks(eng)


def test_target_failure_is_an_error_and_frees_kv(
    make_tiny: Callable[..., Engine], monkeypatch: pytest.MonkeyPatch
) -> None:
    eng = make_tiny(DrafterKind.NGRAM, 4)
    real_forward = eng.runner.forward_flat
    calls = {"n": 0}

    def flaky(items):  # noqa: ANN001, ANN202
        calls["n"] += 1
        if calls["n"] == 4:  # a decode step, after the prefills
            raise RuntimeError("device lost")
        return real_forward(items)

    monkeypatch.setattr(eng.runner, "forward_flat", flaky)
    res = run_batch_allow_error(eng, TINY_PROMPTS[:2], SamplingParams(max_new_tokens=30, ignore_eos=True))
    assert {r.finish_reason for r in res} == {"error"}
    assert all("device lost" in (r.chunks[-1].error or "") for r in res)
    assert_no_leaks(eng)
    with pytest.raises(RuntimeError, match="device lost"):
        calls["n"] = 3
        eng.complete(TINY_PROMPTS[0], SamplingParams(max_new_tokens=10, ignore_eos=True))
    assert eng.complete(TINY_PROMPTS[0], SamplingParams(max_new_tokens=10)).finish_reason in ("length", "stop")
    assert_no_leaks(eng)


class BrokenDrafter(OracleDrafter):
    """The oracle, except on one prompt's sequence where, after a few tokens, it fails in `mode`."""

    name = "broken"

    def __init__(self, refs: Sequence[list[int]], culprit: list[int], mode: str) -> None:
        super().__init__(refs)
        self.culprit, self.mode, self.failures = culprit, mode, 0

    def _hit(self, r: DraftRequest) -> bool:
        return list(r.tokens[: len(self.culprit)]) == self.culprit and len(r.tokens) > len(self.culprit) + 3

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        drafts = super().propose(requests)
        for i, r in enumerate(requests):
            if not self._hit(r):
                continue
            self.failures += 1
            if self.mode == "raise":
                raise RuntimeError("drafter crashed")
            drafts[i] = Draft(token_ids=[96, 5] if self.mode == "bad-id" else [5] * (r.k + 1))
        return drafts

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        if self.mode == "observe" and list(tokens[: len(self.culprit)]) == self.culprit:
            self.failures += 1
            raise RuntimeError("drafter crashed in observe")

    def release(self, seq_id: int) -> None:
        if self.mode == "observe":
            raise RuntimeError("drafter crashed in release")


@pytest.mark.parametrize("mode", ["raise", "bad-id", "too-long", "observe"])
def test_failed_drafter_degrades_to_plain_decoding(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], mode: str
) -> None:
    """A failed drafter degrades that request to plain decoding; the others keep speculating."""
    base = make_tiny(DrafterKind.NONE, max_batch=4)
    refs = [p + o for p, o in zip(TINY_PROMPTS, tiny_plain["greedy"], strict=True)]
    drafter = BrokenDrafter(refs, culprit=TINY_PROMPTS[0], mode=mode)
    with running(engine_with(base, drafter, k=3)) as eng:
        res = run_batch(eng, TINY_PROMPTS[:4], TINY_SETTINGS["greedy"])
    assert drafter.failures >= 1
    assert [r.token_ids for r in res] == tiny_plain["greedy"][:4]
    assert all(r.finish_reason == "length" for r in res)
    # The culprit stopped drafting after its failure; the others kept every (oracle) draft.
    assert res[0].stats.draft_tokens <= 3 * 3
    for r in res[1:]:
        assert r.stats.accepted_tokens == r.stats.draft_tokens > 0


# ------------------------------------------------------------------ bad input


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=-0.1),
        SamplingParams(temperature=float("nan")),
        SamplingParams(top_p=0.0),
        SamplingParams(top_p=1.5),
        SamplingParams(top_k=-1),
        SamplingParams(max_new_tokens=0),
        SamplingParams(seed=-3),
        SamplingParams(stop=("",)),
    ],
)
def test_out_of_range_params_rejected_at_submit(make_tiny: Callable[..., Engine], params: SamplingParams) -> None:
    eng = make_tiny(DrafterKind.NGRAM, 2)
    with pytest.raises(ValueError):
        eng.submit(TINY_PROMPTS[0], params, Result())
    assert eng.num_waiting == 0


def test_bad_prompts_rejected_with_clear_messages(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.NGRAM, 2)  # context: 256 tokens
    with pytest.raises(BadRequestError, match="exceeds the model's context of 256"):
        eng.submit(list(range(3, 96)) * 3, SamplingParams(max_new_tokens=10), Result())
    with pytest.raises(BadRequestError, match="context"):
        eng.complete([5] * 200, SamplingParams(max_new_tokens=100))
    with pytest.raises(BadRequestError, match="messages must not be empty"):
        eng.complete([], SamplingParams())
    with pytest.raises(BadRequestError, match="role"):
        eng.complete([{"role": "robot", "content": "hi"}], SamplingParams())
    with pytest.raises(BadRequestError, match=r"token ids must be in \[0, 96\)"):
        eng.submit([5, 96], SamplingParams(), Result())
    small = make_tiny(DrafterKind.NONE, num_blocks=4, block_size=8)
    with pytest.raises(BadRequestError, match="KV blocks"):
        small.submit([5] * 20, SamplingParams(max_new_tokens=30), Result())
    # Nothing was queued, and the engine still serves.
    assert eng.num_waiting == 0
    assert eng.complete(TINY_PROMPTS[0], SamplingParams(max_new_tokens=4)).completion_tokens >= 1


def test_full_queue_refuses_with_capacity_error(make_tiny: Callable[..., Engine]) -> None:
    """The queue counts requests not yet running: with the one batch slot held, two wait and a third is refused."""
    eng = make_tiny(DrafterKind.NONE, max_queue=2, max_batch=1)
    held = Result()
    cancel = eng.submit(
        TINY_PROMPTS[1], SamplingParams(max_new_tokens=3), held, ready=lambda: False
    )  # never takes a round
    deadline = time.monotonic() + WAIT_S
    while not held.chunks:  # admitted: its first token came, it holds the only slot
        assert time.monotonic() < deadline
        time.sleep(0.001)
    queued = [Result(), Result()]
    for r in queued:
        eng.submit(TINY_PROMPTS[0], SamplingParams(max_new_tokens=3), r)
    with pytest.raises(CapacityError, match="queue is full"):
        eng.submit(TINY_PROMPTS[0], SamplingParams(max_new_tokens=3), Result())
    assert eng.num_waiting == 2 and eng.num_running == 1
    cancel()
    assert held.done.wait(WAIT_S) and held.finish_reason == "abort"
    for r in queued:
        assert r.done.wait(WAIT_S) and r.finish_reason == "length"


# ------------------------------------------------------------------ stats


def test_plain_stats(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.NONE)
    c = eng.complete(TINY_PROMPTS[0], SamplingParams(max_new_tokens=20, ignore_eos=True))
    s = c.stats
    assert s.mean_accepted_length == 1.0 and s.draft_tokens == 0 and s.accepted_tokens == 0
    assert s.acceptance_rate == 0.0 and s.rounds == c.completion_tokens - 1 == s.emitted_tokens


def test_speculative_stats_consistent(make_tiny: Callable[..., Engine]) -> None:
    eng = make_tiny(DrafterKind.NGRAM, 6)
    res = run_batch(eng, TINY_PROMPTS, SamplingParams(max_new_tokens=30, ignore_eos=True))
    total = 0
    for r in res:
        s = r.stats
        assert s.emitted_tokens == s.accepted_tokens + s.rounds
        assert s.accepted_tokens <= s.draft_tokens <= 6 * s.rounds
        assert s.emitted_tokens == len(r.token_ids) - 1  # length-limited: nothing was cut
        assert sum(s.accepted_per_pos) == s.accepted_tokens
        assert all(a >= b for a, b in zip(s.accepted_per_pos, s.accepted_per_pos[1:], strict=False))
        assert s.mean_accepted_length == pytest.approx(s.emitted_tokens / s.rounds)
        total += s.accepted_tokens
    assert total > 0
    # The engine's aggregate is the sum of the requests'.
    assert eng.stats.accepted_tokens == total
    assert eng.stats.rounds == sum(r.stats.rounds for r in res)


@pytest.mark.parametrize("when", ["prefill", "decode"])
def test_nan_logits_end_that_request_with_a_clear_error(
    make_tiny: Callable[..., Engine], tiny_plain: dict[str, list[list[int]]], monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """A NaN in one request's logits (a poisoned prompt, a broken weight) is an error for it alone:
    never token V-1, never the NaN's index under greedy; the batch's other requests go on."""
    from draftgate.models.batch import ForwardOutput

    eng = make_tiny(DrafterKind.NGRAM, 4)
    real = eng.runner.forward_flat
    bad_prompt = list(TINY_PROMPTS[1])
    poisoned: set[int] = set()

    def forward_flat(items):  # noqa: ANN001, ANN202
        out = real(items)
        rows, logits, argmax = 0, out.logits.clone(), out.argmax.clone()
        for it in items:
            is_prefill = list(it.tokens) == bad_prompt
            if is_prefill:
                poisoned.add(it.seq_id)
            if it.seq_id in poisoned and (is_prefill == (when == "prefill")):
                logits[rows + it.num_logits - 1, 3] = float("nan")
                argmax[rows + it.num_logits - 1] = -1  # what the runner reports for a non-finite row
            rows += it.num_logits
        return ForwardOutput(logits, argmax)

    monkeypatch.setattr(eng.runner, "forward_flat", forward_flat)
    params = SamplingParams(max_new_tokens=TINY_NEW, ignore_eos=True)
    res = run_batch_allow_error(eng, [TINY_PROMPTS[0], TINY_PROMPTS[1]], params)
    good, bad = res
    assert bad.finish_reason == "error" and "NaN or infinite logits" in (bad.chunks[-1].error or "")
    assert good.finish_reason == "length" and good.token_ids == tiny_plain["greedy"][0]
    assert_no_leaks(eng)
