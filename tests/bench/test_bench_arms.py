"""Arm names, the OpenAI-compatible arm over a fake transport, peers' errors, sweep advice, doc splicing."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from draftgate.bench.arms import ArmError, ArmKind, parse_arm, parse_arms
from draftgate.bench.docs import markers, update_doc
from draftgate.bench.prompts import BenchPrompt
from draftgate.bench.runner import BenchConfig, run_bench
from draftgate.bench.sweep import format_recommendations, recommend, sweep_arms
from draftgate.engine import DrafterKind
from draftgate.types import SamplingParams


@pytest.mark.parametrize(
    ("text", "kind", "drafter", "k"),
    [
        ("plain", ArmKind.ENGINE, DrafterKind.NONE, 0),
        ("ngram", ArmKind.ENGINE, DrafterKind.NGRAM, None),
        ("suffix:k=4", ArmKind.ENGINE, DrafterKind.SUFFIX, 4),
        ("auto:k=auto", ArmKind.ENGINE, DrafterKind.AUTO, None),
        ("quant:k=2", ArmKind.ENGINE, DrafterKind.QUANT, 2),
        ("hf", ArmKind.HF, None, None),
        ("hf-lookup", ArmKind.HF_LOOKUP, None, 10),
        ("hf-lookup:k=3", ArmKind.HF_LOOKUP, None, 3),
        ("llamacpp", ArmKind.LLAMACPP, None, None),
    ],
)
def test_parse_arm(text, kind, drafter, k):
    s = parse_arm(text)
    assert (s.name, s.kind, s.drafter, s.k) == (text, kind, drafter, k)
    assert s.sequential == (kind in (ArmKind.HF, ArmKind.HF_LOOKUP, ArmKind.LLAMACPP))


def test_parse_openai_arm():
    s = parse_arm("openai+http://127.0.0.1:8000")
    assert (s.kind, s.url, s.served_model) == (ArmKind.OPENAI, "http://127.0.0.1:8000/v1", None)
    s = parse_arm("openai+http://h:1/v1/?model=smol")
    assert (s.url, s.served_model) == ("http://h:1/v1", "smol")


@pytest.mark.parametrize(
    ("text", "msg"),
    [
        ("warp", "unknown arm 'warp'"),
        ("plain:k=2", "takes no K"),
        ("ngram:k=x", "non-negative integer"),
        ("ngram:n=2", "unknown option"),
        ("hf:k=2", "unknown arm"),
        ("openai+ftp://x", r"expected openai\+http"),
        ("ngram:draft=/d", "only the model and auto"),
        ("model:draft=", "draft= needs"),
        ("ngram:branch=0.2", "only the eagle and auto"),
        ("eagle:branch=x", "branch= needs"),
        ("eagle:branch=1.5", "branch= needs"),
    ],
)
def test_bad_arms(text, msg):
    with pytest.raises(ArmError, match=msg):
        parse_arm(text)


def test_parse_arm_with_its_own_draft_model():
    s = parse_arm("model:k=3:draft=/tmp/drafts/chat")
    assert (s.drafter, s.k, s.draft_model) == (DrafterKind.MODEL, 3, "/tmp/drafts/chat")
    assert parse_arm("model:draft=/a").k is None and parse_arm("model").draft_model is None


def test_parse_arm_with_its_own_branch_setting():
    s = parse_arm("auto:branch=0:head=/h")
    assert (s.drafter, s.draft_branch, s.draft_head) == (DrafterKind.AUTO, 0.0, "/h")
    assert parse_arm("eagle:branch=0.3").draft_branch == 0.3 and parse_arm("eagle").draft_branch is None


def test_parse_arms_rejects_duplicates_and_empty():
    assert [s.name for s in parse_arms("plain, ngram:k=2")] == ["plain", "ngram:k=2"]
    with pytest.raises(ArmError, match="unique"):
        parse_arms("plain,plain")
    with pytest.raises(ArmError, match="at least one"):
        parse_arms(" , ")


def _sse_server(requests: list[dict]):
    httpx = pytest.importorskip("httpx")

    def handler(request):
        if request.url.path == "/v1/models":
            return httpx.Response(200, json={"data": [{"id": "served-model"}]})
        body = json.loads(request.content)
        requests.append(body)
        events = [
            {"choices": [{"text": "hello"}]},
            {"choices": [{"text": " big world", "logprobs": {"tokens": [" big", " world"]}}]},
            {"choices": [], "usage": {"completion_tokens": 3}},
        ]
        sse = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return httpx.Response(200, text=sse, headers={"content-type": "text/event-stream"})

    return httpx.MockTransport(handler)


def test_openai_arm_through_the_runner(tiny_model):
    from draftgate.bench.remote import OpenAIArm

    seen: list[dict] = []
    arm = OpenAIArm(parse_arm("openai+http://fake:1"), tiny_model.tokenizer, transport=_sse_server(seen))
    prompts = [BenchPrompt("1", "c", ("hello", "world"))]
    res = run_bench(
        {"openai+http://fake:1": arm}, prompts, BenchConfig(SamplingParams(max_new_tokens=3), "openai+http://fake:1")
    )
    assert [r.error for r in res.requests] == [None, None]
    r0, r1 = res.requests
    assert (r0.n_tokens, r0.text, r0.token_ids) == (3, "hello big world", None)
    assert r0.itl_s and len(r0.itl_s) == 2  # chunk 2 carried 2 tokens
    assert seen[0]["model"] == "served-model" and seen[0]["stream"] is True and seen[0]["max_tokens"] == 3
    # turn 2's prompt carries the arm's own first answer
    assert "hello big world" in seen[-1]["prompt"]


def _row(arm, cat, med, errors=0, acc=0.5):
    return {
        "arm": arm,
        "category": cat,
        "load": "c=1",
        "errors": errors,
        "acceptance_rate": acc,
        "mean_accepted_length": 2.0,
        "speedup": {"min": med - 0.1, "median": med, "max": med + 0.1},
    }


def test_recommend_picks_best_lossless_arm_and_disables_losers():
    report = {
        "meta": {"baseline": "plain"},
        "lossless": {"arms": {"suffix:k=8": {"mismatches": 2}}},
        "results": [
            _row("plain", "code", 1.0),
            _row("ngram:k=2", "code", 1.4),
            _row("ngram:k=4", "code", 1.8),
            _row("ngram:k=auto", "code", 1.5),
            _row("suffix:k=8", "code", 3.0),  # lossy: never chosen
            _row("plain", "chat", 1.0),
            _row("ngram:k=2", "chat", 0.97),
            _row("ngram:k=auto", "chat", 1.02),
            _row("plain", "rag", 1.0),
            _row("ngram:k=4", "rag", 1.50),
            _row("ngram:k=auto", "rag", 1.47),
            _row("plain", "bad", 1.0),
            _row("ngram:k=4", "bad", math.nan),
        ],
    }
    recs = {r["category"]: r for r in recommend(report, min_speedup=1.05, auto_tolerance=0.03)}
    assert (recs["code"]["enable"], recs["code"]["drafter"], recs["code"]["k"]) == (True, "ngram", 4)
    assert recs["code"]["expected_speedup"] == 1.8
    assert (recs["chat"]["enable"], recs["chat"]["drafter"], recs["chat"]["k"]) == (False, "none", 0)
    assert (recs["rag"]["k"], recs["rag"]["expected_speedup"]) == ("auto", 1.47)  # auto within 3%
    assert recs["bad"]["enable"] is False and recs["bad"]["expected_speedup"] is None
    assert "| c=1 | code | yes | ngram | 4 | 1.80x |" in format_recommendations(list(recs.values()))


def test_sweep_arms():
    names = [s.name for s in sweep_arms(["ngram", "suffix"], [1, 4])]
    assert names == ["plain", "ngram:k=1", "ngram:k=4", "ngram:k=auto", "suffix:k=1", "suffix:k=4", "suffix:k=auto"]
    with pytest.raises(ArmError):
        sweep_arms(["warp"], [1])


def test_update_doc_replaces_only_its_section(tmp_path: Path):
    doc = tmp_path / "docs" / "BENCHMARKS.md"
    doc.parent.mkdir()
    s, e = markers("engine")
    doc.write_text(f"# Benchmarks\n\nintro\n\n{s}\nold\n{e}\n\nfooter\n")
    png = tmp_path / "speedup_by_category.png"
    png.write_bytes(b"png")
    update_doc(doc, "engine", "# DraftGate benchmark\n\n## c=1\n\n![s](speedup_by_category.png)\n", [png])
    text = doc.read_text()
    assert text.startswith("# Benchmarks\n\nintro\n") and text.endswith(f"{e}\n\nfooter\n")
    assert "old" not in text and "## DraftGate benchmark" in text and "### c=1" in text
    assert "](benchmarks/engine/speedup_by_category.png)" in text
    assert (doc.parent / "benchmarks" / "engine" / "speedup_by_category.png").is_file()
    from draftgate.errors import DraftGateError

    with pytest.raises(DraftGateError, match="no section 'peers'"):
        update_doc(doc, "peers", "x", [])
