"""The gateway's own rounds against a real vLLM (``--target vllm+http://`` on a server with ``--enable-scale-out``).

The gateway drafts and verifies; vLLM scores drafts through its token route and decodes plain
stretches on a stream. The session's ``plain`` server (conftest.py) is both the reference (its
own decoding) and the target, so "identical" means the same server's own output. Faults come
from a proxy in front of it (vllm_proxy.py): scoring answered 400, with garbage rows or late, and
vLLM gone mid-stream.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import openai
import pytest
from gateway_support import ADMIN_KEY, CLIENT_KEY, serve_app
from openai import OpenAI
from vllm_proxy import Faults, proxy_app
from vllm_support import Spec, Worker

from draftgate.drafters.suffix import SuffixDrafter
from draftgate.engine import DrafterKind, EngineConfig
from draftgate.integrations.vllm.gateway.checks import VllmTargetError, connect
from draftgate.integrations.vllm.gateway.engine import VllmTargetEngine
from draftgate.integrations.vllm.gateway.plugin_route import VllmPluginBackend
from draftgate.integrations.vllm.gateway.pricing import MAX_BUCKET, PROBE_REQUESTS, WINDOW
from draftgate.integrations.vllm.tools.launch import SERVED_NAME
from draftgate.models.loader import load_model_info
from draftgate.server import AuthConfig, create_app
from draftgate.server.ops.state import OpsConfig
from draftgate.server.routes_file import RouteSpec, build_route_table
from draftgate.server.targets import parse_drafter, parse_target
from draftgate.types import SamplingParams

pytestmark = pytest.mark.skipif(os.environ.get("DRAFTGATE_SKIP_VLLM") == "1", reason="DRAFTGATE_SKIP_VLLM=1")

PROMPTS = [
    "Repeat the following sentence exactly, twice:\nThe quick brown fox jumps over the lazy dog near the river bank.",
    "Rewrite this list in the same order, one item per line: apples, pears, plums, cherries, grapes, lemons.",
    "Copy this code and add a docstring:\ndef area(width, height):\n    return width * height\n",
    "What is the capital of France? Answer in one sentence.",
]
DRAFTERS = ["ngram", "suffix", "auto", "worker"]  # "worker": an http:// draft worker (the session's n-gram one)
MAX_TOKENS = 64
FIXED_K = 6


@dataclass
class Gateway:
    url: str
    table: Any
    faults: Faults
    app: Any

    def chat(self, route: str, prompt: str, **kw: Any) -> Any:
        client = OpenAI(base_url=f"{self.url}/v1", api_key=CLIENT_KEY, timeout=300, max_retries=0)
        kw.setdefault("temperature", 0.0)
        kw.setdefault("max_tokens", MAX_TOKENS)
        return client.chat.completions.create(model=route, messages=[{"role": "user", "content": prompt}], **kw)

    def admin(self, route: str, changes: dict[str, Any]) -> dict[str, Any]:
        r = httpx.post(
            f"{self.url}/admin/routes/{route}",
            json=changes,
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=10,
        )
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]

    def metric(self, name: str, route: str) -> float:
        for line in httpx.get(self.url + "/metrics", timeout=10).text.splitlines():
            if line.startswith(name + "{") and f'model_name="{route}"' in line:
                return float(line.rsplit(" ", 1)[1])
        return 0.0

    def backend(self, route: str) -> VllmTargetEngine:
        b = self.table.get(route).engine
        assert isinstance(b, VllmTargetEngine)
        return b


@pytest.fixture(scope="module")
def proxy(plain: str) -> Iterator[tuple[str, Faults]]:
    faults = Faults()
    with serve_app(proxy_app(plain, faults)) as url:
        yield url, faults


@pytest.fixture(scope="module")
def gateway(plain: str, worker: Worker, proxy: tuple[str, Faults]) -> Iterator[Gateway]:
    target = parse_target(f"vllm+{plain}")
    # "suffix" and "faulty" draft a fixed K: their rounds run whatever they cost (the operations and fault
    # tests need rounds); the others are adaptive, and their gate may pass requests through.
    routes = [
        RouteSpec(
            d,
            EngineConfig(drafter=DrafterKind.NGRAM, k=FIXED_K if d == "suffix" else None),
            target=target,
            drafter=parse_drafter(worker.url, 0.2) if d == "worker" else parse_drafter(d),
        )
        for d in DRAFTERS
    ]
    routes.append(
        RouteSpec(
            "faulty", EngineConfig(drafter=DrafterKind.SUFFIX, k=FIXED_K), target=parse_target(f"vllm+{proxy[0]}")
        )
    )
    table = build_route_table(routes)
    auth = AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    try:
        app = create_app(table, auth, OpsConfig(seed=0))
        with serve_app(app) as url:
            yield Gateway(url, table, proxy[1], app)
    finally:
        table.close()


@pytest.fixture(scope="module")
def reference(plain: str) -> dict[str, str]:
    """vLLM's own greedy text for each prompt (its chat route, no gateway)."""
    client = OpenAI(base_url=f"{plain}/v1", api_key="unused", timeout=300, max_retries=0)
    return {
        p: client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": p}], temperature=0.0, max_tokens=MAX_TOKENS
        )
        .choices[0]
        .message.content
        or ""
        for p in PROMPTS
    }


def _vllm_metric(url: str, name: str) -> float:
    for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
        if line.startswith(name + "{"):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"vLLM reports no {name}")


def _wait_vllm_idle(url: str) -> None:
    deadline = time.monotonic() + 60
    while _vllm_metric(url, "vllm:num_requests_running") > 0:
        assert time.monotonic() < deadline, "vLLM still runs requests the gateway ended"
        time.sleep(0.2)


def _assert_released(b: VllmTargetEngine) -> None:
    deadline = time.monotonic() + 30
    while b.num_running or b.rounds_target._seqs:  # noqa: SLF001 -- nothing held after a request ends
        assert time.monotonic() < deadline, "the route still holds a sequence"
        time.sleep(0.1)


@pytest.mark.parametrize("route", DRAFTERS)
def test_greedy_is_vllms_own_output_with_every_drafter(gateway: Gateway, reference: dict[str, str], route: str) -> None:
    drafted = 0
    for p in PROMPTS:
        r = gateway.chat(route, p)
        assert r.choices[0].message.content == reference[p], (route, p)
        drafted += r.model_extra["speculative"]["draft_tokens"]
    assert drafted > 0  # drafts were scored on vLLM, not only decoded plainly
    assert gateway.backend(route).rounds_target.scored > 0
    _assert_released(gateway.backend(route))


def test_where_rounds_do_not_pay_requests_pass_through(gateway: Gateway, reference: dict[str, str]) -> None:
    """An adaptive route whose measured rounds all lose to plain decoding relays greedy requests to
    vLLM's own decoding (counted), probing rounds in one request of PROBE_REQUESTS; it runs rounds
    again once they pay."""
    b = gateway.backend("ngram")
    pricer = b.rounds_target.pricer
    step = pricer.step()
    assert step is not None  # measured by the earlier requests' streams
    for bucket in range(MAX_BUCKET + 1):  # every bucket: rounds at a third of the plain rate
        for _ in range(WINDOW):
            pricer.observe_round(bucket, 1, 3 * step, False)
    assert pricer.verdict() is False
    before = gateway.metric("draftgate:vllm_rounds_passed_through_requests_total", "ngram")
    passed = 0
    for p in PROMPTS:
        r = gateway.chat("ngram", p)
        spec = r.model_extra["speculative"]
        assert r.choices[0].message.content == reference[p]
        if spec["target_decoded"]:  # relayed (else the gate's probe: rounds)
            passed += 1
            assert spec["draft_tokens"] == 0
    assert len(PROMPTS) < PROBE_REQUESTS and passed >= len(PROMPTS) - 1  # at most one probe among them
    assert gateway.metric("draftgate:vllm_rounds_passed_through_requests_total", "ngram") - before == passed
    assert b.passthrough.num_running == 0 and b.num_running == 0
    for bucket in range(MAX_BUCKET + 1):  # rounds pay again: the route runs them
        for _ in range(WINDOW):
            pricer.observe_round(bucket, 8, step, False)
    assert gateway.chat("ngram", PROMPTS[0]).model_extra["speculative"]["draft_tokens"] > 0
    _assert_released(b)


def test_rounds_read_vllms_prefix_cache(gateway: Gateway, plain: str) -> None:
    """The scoring requests re-send the whole history; vLLM's prefix cache serves most of it.

    Short prompts here: a new prompt's own prefill and the rows since each request's last full
    32-token KV block are misses (the benchmark measures the held-out prompts' ratio). A round
    that re-prefilled its history (a cache salt on every request) would fall far below this.
    """
    _wait_vllm_idle(plain)
    q0, h0 = _vllm_metric(plain, "vllm:prefix_cache_queries_total"), _vllm_metric(plain, "vllm:prefix_cache_hits_total")
    for p in PROMPTS[:3]:
        gateway.chat("suffix", p + " Then say it once more.", max_tokens=96)
    q = _vllm_metric(plain, "vllm:prefix_cache_queries_total") - q0
    h = _vllm_metric(plain, "vllm:prefix_cache_hits_total") - h0
    assert q > 0 and h / q >= 0.6, f"prefix-cache hits {h:.0f} of {q:.0f} prompt tokens"


def test_sampled_requests_run_on_vllms_own_sampling(gateway: Gateway, plain: str) -> None:
    r = gateway.chat("suffix", PROMPTS[0], temperature=0.8, seed=11)
    spec = r.model_extra["speculative"]
    assert spec["target_decoded"] is True and spec["draft_tokens"] == 0 and not spec["approximate"]
    # vLLM's own sampling with the same seed, on its completions route from the same token ids.
    tok = load_model_info("smollm2-135m").tokenizer
    ids = tok.encode_chat([{"role": "user", "content": PROMPTS[0]}])
    ref = httpx.post(
        f"{plain}/v1/completions",
        timeout=300,
        json={
            "model": SERVED_NAME,
            "prompt": ids,
            "max_tokens": MAX_TOKENS,
            "temperature": 0.8,
            "top_p": 1.0,
            "seed": 11,
            "ignore_eos": True,
            "return_token_ids": True,
            "skip_special_tokens": False,
        },
    ).json()["choices"][0]
    out = tok.encode(r.choices[0].message.content or "")
    n = len(out) - 2  # the gateway stops at EOS and re-encoding the text can merge its last tokens
    assert n > 8 and ref["token_ids"][:n] == out[:n]
    assert gateway.metric("draftgate:spec_decode_target_decoded_requests_total", "suffix") >= 1


def test_operations_switch_shadow_canaries_on_the_rounds_route(gateway: Gateway, reference: dict[str, str]) -> None:
    before = gateway.metric("draftgate:spec_decode_num_draft_tokens_total", "suffix")
    assert gateway.admin("suffix", {"enabled": False, "shadow_fraction": 1.0})["speculating"] is False
    for p in PROMPTS[:2]:
        r = gateway.chat("suffix", p)
        assert r.choices[0].message.content == reference[p] and r.model_extra["speculative"]["draft_tokens"] == 0
    assert gateway.metric("draftgate:spec_decode_num_draft_tokens_total", "suffix") == before
    deadline = time.monotonic() + 60
    while (
        httpx.get(
            f"{gateway.url}/admin/routes/suffix", headers={"Authorization": f"Bearer {ADMIN_KEY}"}, timeout=10
        ).json()["shadow"]["requests"]
        < 2
    ):
        assert time.monotonic() < deadline, "no shadow replay"
        time.sleep(0.2)
    assert gateway.admin("suffix", {"enabled": True, "shadow_fraction": 0.0})["speculating"] is True
    assert gateway.chat("suffix", PROMPTS[0]).choices[0].message.content == reference[PROMPTS[0]]
    # The lossless canary re-runs speculative requests plainly on the same vLLM and compares.
    checks = gateway.metric("draftgate:lossless_canary_checks_total", "suffix")
    gateway.admin("suffix", {"lossless_fraction": 1.0})
    try:
        drafted = sum(gateway.chat("suffix", p).model_extra["speculative"]["draft_tokens"] > 0 for p in PROMPTS[:3])
        assert gateway.app.state.ops.lossless_worker.wait_idle(120)
    finally:
        gateway.admin("suffix", {"lossless_fraction": 0.0})
    assert drafted >= 1
    assert gateway.metric("draftgate:lossless_canary_checks_total", "suffix") - checks == drafted
    assert gateway.metric("draftgate:lossless_canary_mismatches_total", "suffix") == 0.0
    # A canary: half the requests speculate, the rest are the plain control arm; outputs all vLLM's own.
    gateway.admin("suffix", {"canary_fraction": 0.5})
    try:
        for p in PROMPTS[:3]:
            assert gateway.chat("suffix", p).choices[0].message.content == reference[p]
    finally:
        gateway.admin("suffix", {"canary_fraction": 1.0})


@pytest.mark.parametrize("fault", ["400", "garbage"])
def test_a_failed_scoring_round_costs_no_token(gateway: Gateway, reference: dict[str, str], fault: str) -> None:
    f = gateway.faults
    f.clear()
    f.scoring = fault
    try:
        out = gateway.chat("faulty", PROMPTS[0])
    finally:
        f.scoring = None
    assert out.choices[0].message.content == reference[PROMPTS[0]]
    assert f.hits >= 1 and out.model_extra["speculative"]["fallback_rounds"] >= 1
    assert gateway.metric("draftgate:spec_decode_fallback_rounds_total", "faulty") >= 1
    _assert_released(gateway.backend("faulty"))


def test_a_lying_server_gets_wrong_tokens_out_only_counted(gateway: Gateway, reference: dict[str, str]) -> None:
    """Scoring answers that vouch for every draft (the proxy lies): the drafts go out as verified, vLLM's own
    stream then contradicts them or never reaches them, and every such token is counted (the route's metrics),
    a contradiction logged. With the lie gone the route gives vLLM's own output again."""
    f = gateway.faults
    f.clear()
    before = gateway.backend("faulty").verification_counts()
    f.scoring = "lie"
    try:
        out = gateway.chat("faulty", PROMPTS[0])
    finally:
        f.scoring = None
    after = gateway.backend("faulty").verification_counts()
    counted = sum(after[k] - before[k] for k in ("contradicted", "unconfirmed"))
    assert f.hits >= 1 and out.model_extra["speculative"]["accepted_tokens"] >= 1
    if out.choices[0].message.content != reference[PROMPTS[0]]:
        assert counted >= 1  # a lie that changed the output was counted
    total = sum(
        gateway.metric(f"draftgate:vllm_rounds_{m}_total", "faulty")
        for m in ("contradicted_tokens", "unconfirmed_tokens")
    )
    assert total >= counted
    _assert_released(gateway.backend("faulty"))
    assert gateway.chat("faulty", PROMPTS[0]).choices[0].message.content == reference[PROMPTS[0]]


def test_a_late_scoring_round_times_out_and_decodes_plainly(
    proxy: tuple[str, Faults], reference: dict[str, str]
) -> None:
    url, f = proxy
    tok = load_model_info("smollm2-135m").tokenizer
    client = httpx.Client(timeout=httpx.Timeout(60.0, connect=10.0))
    engine = VllmTargetEngine(url, connect(url, client, tok), client, tok, SuffixDrafter(), timeout_s=1.0)
    f.clear()
    f.scoring, f.delay_s = "slow", 3.0
    try:
        ids = tok.encode_chat([{"role": "user", "content": PROMPTS[0]}])
        out = engine.complete(ids, SamplingParams(max_new_tokens=MAX_TOKENS, temperature=0.0), raw=True)
    finally:
        f.scoring = None
        engine.shutdown()
    assert out.text == reference[PROMPTS[0]]
    assert f.hits >= 1 and out.stats is not None and out.stats.fallback_rounds >= 1


def test_vllm_gone_mid_stream_is_an_openai_error_and_nothing_leaks(
    gateway: Gateway, plain: str, reference: dict[str, str]
) -> None:
    f = gateway.faults
    f.clear()
    client = OpenAI(base_url=f"{gateway.url}/v1", api_key=CLIENT_KEY, timeout=300, max_retries=0)
    stream = client.chat.completions.create(
        model="faulty",
        messages=[{"role": "user", "content": PROMPTS[1]}],
        stream=True,
        max_tokens=400,
        temperature=0.0,
        extra_body={"ignore_eos": True},
    )
    got = 0
    with pytest.raises(openai.APIError, match="vLLM"):
        for chunk in stream:
            got += bool(chunk.choices and chunk.choices[0].delta.content)
            if got == 3:
                f.dead = True  # vLLM "killed": its streams cut, new requests refused
    assert got >= 3
    _assert_released(gateway.backend("faulty"))
    f.clear()
    _wait_vllm_idle(plain)  # the cut stream's request was aborted in vLLM too
    assert gateway.chat("faulty", PROMPTS[0]).choices[0].message.content == reference[PROMPTS[0]]


def test_start_up_checks_pick_the_mode_or_name_the_flag(plain: str, spec: Spec) -> None:
    tok = load_model_info("smollm2-135m").tokenizer
    client = httpx.Client(timeout=30)
    # Without the token route: the gateway's rounds are refused, naming the flag...
    facts = connect(spec.url, client, tok)
    assert not facts.token_route and facts.proposer
    with pytest.raises(VllmTargetError, match="--enable-scale-out"):
        VllmTargetEngine(spec.url, facts, client, tok, SuffixDrafter())
    # ... and a route picks the mode from what the server offers.
    from draftgate.server.targets.build import build_backend

    loaded = load_model_info("smollm2-135m")
    cfg = EngineConfig(drafter=DrafterKind.SUFFIX)
    plugin = build_backend(cfg, parse_target(f"vllm+{spec.url}"), parse_drafter("suffix"), loaded)
    rounds = build_backend(cfg, parse_target(f"vllm+{plain}"), parse_drafter("suffix"), loaded)
    try:
        assert isinstance(plugin, VllmPluginBackend) and isinstance(rounds, VllmTargetEngine)
    finally:
        plugin.shutdown()
        rounds.shutdown()
