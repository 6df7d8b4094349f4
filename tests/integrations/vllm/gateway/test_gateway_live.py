"""The gateway in front of a real vLLM that runs DraftGate's proposer (``--target vllm+http://``).

vLLM drafts and verifies; the gateway renders, streams, and operates: the per-route switch
and the admin kill switch reach the proposer per request (``vllm_xargs``) with no restart of
vLLM, and shadow replays score the route's drafter while speculation is off. The servers are
the session's (conftest.py): ``plain`` is the reference, ``spec`` the server behind the gateway.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from gateway_support import ADMIN_KEY, CLIENT_KEY, serve_app
from openai import OpenAI
from vllm_support import Spec

from draftgate.engine import DrafterKind, EngineConfig
from draftgate.integrations.vllm.gateway.plugin_route import VllmPluginBackend, VllmTargetError
from draftgate.integrations.vllm.tools.launch import SERVED_NAME
from draftgate.models.loader import load_model_info
from draftgate.server import AuthConfig, create_app
from draftgate.server.ops.state import OpsConfig
from draftgate.server.routes_file import RouteSpec, build_route_table
from draftgate.server.targets import parse_target

pytestmark = pytest.mark.skipif(os.environ.get("DRAFTGATE_SKIP_VLLM") == "1", reason="DRAFTGATE_SKIP_VLLM=1")

ROUTE = "smol"
PROMPTS = [
    "Repeat the following sentence exactly, twice:\nThe quick brown fox jumps over the lazy dog near the river bank.",
    "Rewrite this list in the same order, one item per line: apples, pears, plums, cherries, grapes, lemons.",
    "What is the capital of France? Answer in one sentence.",
]


@dataclass
class Gateway:
    url: str
    spec: Spec

    def chat(self, prompt: str, **kw: Any) -> Any:
        client = OpenAI(base_url=f"{self.url}/v1", api_key=CLIENT_KEY, timeout=300, max_retries=0)
        kw.setdefault("temperature", 0.0)
        kw.setdefault("max_tokens", 48)
        return client.chat.completions.create(model=ROUTE, messages=[{"role": "user", "content": prompt}], **kw)

    def admin(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        headers = {"Authorization": f"Bearer {ADMIN_KEY}"}
        if changes is None:
            r = httpx.get(f"{self.url}/admin/routes/{ROUTE}", headers=headers, timeout=10)
        else:
            r = httpx.post(f"{self.url}/admin/routes/{ROUTE}", json=changes, headers=headers, timeout=10)
        r.raise_for_status()
        return r.json()  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def gateway(spec: Spec) -> Iterator[Gateway]:
    route = RouteSpec(ROUTE, EngineConfig(drafter=DrafterKind.AUTO), target=parse_target(f"vllm+{spec.url}"))
    table = build_route_table([route])
    auth = AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    try:
        with serve_app(create_app(table, auth, OpsConfig(seed=0))) as url:
            yield Gateway(url, spec)
    finally:
        table.close()


@pytest.fixture(scope="module")
def plain_text(plain: str) -> dict[str, str]:
    client = OpenAI(base_url=f"{plain}/v1", api_key="unused", timeout=300, max_retries=0)
    out = {}
    for p in PROMPTS:
        r = client.chat.completions.create(
            model=SERVED_NAME, messages=[{"role": "user", "content": p}], temperature=0.0, max_tokens=48
        )
        out[p] = r.choices[0].message.content or ""
    return out


def test_gateway_output_is_vllms_own_and_drafts_flow(gateway: Gateway, plain_text: dict[str, str]) -> None:
    before = gateway.spec.drafter("auto")
    for p in PROMPTS:
        r = gateway.chat(p)
        assert r.choices[0].message.content == plain_text[p], p
        assert r.model_extra["speculative"]["drafter"] == "auto"  # type: ignore[index]
    stream = gateway.chat(PROMPTS[0], stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) == plain_text[PROMPTS[0]]
    assert gateway.spec.drafter("auto")["accepted"] > before["accepted"]


def test_stop_strings_are_the_gateways(gateway: Gateway, plain_text: dict[str, str]) -> None:
    r = gateway.chat(PROMPTS[0], stop=["fox"])
    text = plain_text[PROMPTS[0]]
    assert r.choices[0].finish_reason == "stop"
    assert r.choices[0].message.content == text[: text.index("fox")]


def test_kill_switch_and_shadow_without_restarting_vllm(gateway: Gateway, plain_text: dict[str, str]) -> None:
    spec = gateway.spec
    # Off: vLLM decodes plainly (the proposer counts the requests as off and drafts nothing).
    route = gateway.admin({"enabled": False, "shadow_fraction": 1.0})
    assert route["speculating"] is False
    spec.wait_idle()  # the previous test's request, cut at a stop string, may still be aborting in vLLM
    before, off = spec.drafter("auto"), spec.stats()["requests_off"]
    for p in PROMPTS:
        assert gateway.chat(p).choices[0].message.content == plain_text[p]
    assert spec.drafter("auto")["drafted"] == before["drafted"]
    assert spec.stats()["requests_off"] - off == len(PROMPTS)
    # Shadow replays run in the background: they predict what the route's drafter would do.
    deadline = time.monotonic() + 60
    while gateway.admin()["shadow"]["requests"] < len(PROMPTS) and time.monotonic() < deadline:
        time.sleep(0.2)
    shadow = gateway.admin()["shadow"]
    assert shadow["requests"] >= len(PROMPTS) and shadow["predicted_mean_accepted_length"] > 1.0
    # On again: drafts resume at once.
    assert gateway.admin({"enabled": True, "shadow_fraction": 0.0})["speculating"] is True
    assert gateway.chat(PROMPTS[0]).choices[0].message.content == plain_text[PROMPTS[0]]
    assert spec.drafter("auto")["drafted"] > before["drafted"]


def test_bad_input_gets_a_clear_error_and_the_route_keeps_serving(gateway: Gateway, plain_text: dict[str, str]) -> None:
    from openai import BadRequestError

    with pytest.raises(BadRequestError, match="context"):
        gateway.chat(PROMPTS[0], max_tokens=4000)  # vLLM here: --max-model-len 2048
    assert gateway.chat(PROMPTS[0]).choices[0].message.content == plain_text[PROMPTS[0]]


def test_start_up_checks(plain: str, caplog: pytest.LogCaptureFixture) -> None:
    tok = load_model_info("smollm2-135m").tokenizer
    with pytest.raises(VllmTargetError, match="no vLLM answers at http://127.0.0.1:9"):
        VllmPluginBackend("http://127.0.0.1:9", tok, None, None)
    # A vLLM without a proposer serves, with a warning that names the missing flag.
    from draftgate.drafters.ngram import NgramDrafter

    with caplog.at_level(logging.WARNING, logger="draftgate.vllm_target"):
        backend = VllmPluginBackend(plain, tok, NgramDrafter(), "ngram")
    backend.shutdown()
    assert backend.model_name == SERVED_NAME and backend.max_context == 2048
    assert "--speculative-config" in caplog.text
