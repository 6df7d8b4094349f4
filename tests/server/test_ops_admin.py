"""Admin API, kill switch, canary auto-rollback, shadow mode and lossless canary on a live gateway."""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import pytest
from gateway_support import ADMIN_KEY, CLIENT_KEY, Gateway, assert_no_leaks, metric, serve_app, tiny_engine
from ops_support import ADMIN, PROMPT, GarbageDrafter, wait_until

from draftgate.engine import Chunk, DrafterKind
from draftgate.models.loader import LoadedModel
from draftgate.server import AuthConfig, Route, RouteTable, create_app
from draftgate.server.ops import CanaryConfig, Ops, OpsConfig

ROUTES = ("ops-ngram", "ops-bad", "ops-shadow", "ops-lossless")


@pytest.fixture(scope="module")
def gw(tiny_model: LoadedModel) -> Iterator[Gateway]:
    bad = tiny_engine(tiny_model, DrafterKind.NGRAM, k=8)
    bad.drafter = GarbageDrafter()  # K fixed at 8, acceptance ~0, a slow draft: speculation loses
    routes = RouteTable.of(
        [
            Route("ops-ngram", tiny_engine(tiny_model, DrafterKind.NGRAM, k=4), model="tiny"),
            Route("ops-bad", bad, model="tiny"),
            Route("ops-shadow", tiny_engine(tiny_model, DrafterKind.NGRAM, k=4), enabled=False, model="tiny"),
            Route("ops-lossless", tiny_engine(tiny_model, DrafterKind.NGRAM, k=4), model="tiny"),
        ]
    )
    auth = AuthConfig(api_keys=frozenset({CLIENT_KEY}), admin_keys=frozenset({ADMIN_KEY}))
    config = OpsConfig(canary=CanaryConfig(margin=0.05, min_samples=8, window=40), seed=0, background_cpu_share=1.0)
    app = create_app(routes, auth, config)
    try:
        with serve_app(app) as url:
            yield Gateway(url, routes, app)
    finally:
        routes.close()


@pytest.fixture
def admin(gw: Gateway) -> Iterator[httpx.Client]:
    with gw.http(ADMIN_KEY) as c:
        yield c


def ops(gw: Gateway) -> Ops:
    return gw.app.state.ops


def complete(gw: Gateway, route: str, n: int = 1, max_tokens: int = 8) -> list[dict]:
    body = {"model": route, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True}
    out = []
    with gw.http() as c:
        for _ in range(n):
            r = c.post("/v1/completions", json=body)
            assert r.status_code == 200, r.text
            out.append(r.json())
    return out


def row(admin: httpx.Client, name: str) -> dict:
    r = admin.get(ADMIN)
    assert r.status_code == 200, r.text
    return {x["name"]: x for x in r.json()["data"]}[name]


def test_admin_needs_the_admin_key(gw: Gateway) -> None:
    with gw.http(None) as c:
        assert c.get(ADMIN).status_code == 401
        assert c.post(ADMIN + "/ops-ngram", json={"enabled": False}).status_code == 401
    with gw.http(CLIENT_KEY) as c:
        r = c.get(ADMIN)
        assert r.status_code == 403 and r.json()["error"]["code"] == "not_admin"
        assert c.post(ADMIN + "/ops-ngram", json={"enabled": False}).status_code == 403
    assert gw.routes.get("ops-ngram").enabled  # type: ignore[union-attr]


def test_list_routes_with_live_stats(gw: Gateway, admin: httpx.Client) -> None:
    complete(gw, "ops-ngram", n=2)
    rows = {x["name"]: x for x in admin.get(ADMIN).json()["data"]}
    assert set(rows) == set(ROUTES)
    r = rows["ops-ngram"]
    assert r["enabled"] and r["drafter"] == "ngram" and r["k_policy"] == "fixed:4"
    assert r["canary_fraction"] == 1.0 and r["shadow_fraction"] == 0.0
    s = r["stats"]
    assert s["requests"] >= 2 and s["tokens_per_s"] > 0 and s["mean_accepted_length"] >= 1.0
    assert 0.0 <= s["acceptance_rate"] <= 1.0
    assert r["last_rollback_reason"] is None
    assert rows["ops-shadow"]["enabled"] is False


def test_kill_switch_at_runtime_logged_and_counted(gw: Gateway, admin: httpx.Client, caplog) -> None:
    before = metric(gw, "draftgate:admin_changes_total", model_name="ops-ngram", field="enabled")
    with caplog.at_level("INFO", logger="draftgate.server.ops"):
        r = admin.post(ADMIN + "/ops-ngram", json={"enabled": False})
    assert r.status_code == 200 and r.json()["enabled"] is False
    assert "ops-ngram speculation disabled" in caplog.text
    assert not gw.engine("ops-ngram").speculation_enabled
    (out,) = complete(gw, "ops-ngram")
    assert out["speculative"]["draft_tokens"] == 0  # plain from now on, no restart
    assert metric(gw, "draftgate:admin_changes_total", model_name="ops-ngram", field="enabled") == before + 1
    assert metric(gw, "draftgate:route_speculation_switch", model_name="ops-ngram") == 0.0
    assert admin.post(ADMIN + "/ops-ngram", json={"enabled": True}).json()["speculating"] is True
    assert metric(gw, "draftgate:route_speculation_switch", model_name="ops-ngram") == 1.0


def test_kill_switch_while_a_request_is_in_flight(gw: Gateway, admin: httpx.Client) -> None:
    engine = gw.engine("ops-ngram")
    result: dict = {}

    def run() -> None:
        result["out"] = complete(gw, "ops-ngram", max_tokens=60)[0]

    t = threading.Thread(target=run)
    t.start()
    wait_until(lambda: engine.num_running == 1 or "out" in result, "the request to run")
    assert admin.post(ADMIN + "/ops-ngram", json={"enabled": False}).status_code == 200
    t.join(60)
    assert result["out"]["usage"]["completion_tokens"] == 60  # it finished, plainly from the switch on
    admin.post(ADMIN + "/ops-ngram", json={"enabled": True})
    assert_no_leaks(engine)


@pytest.mark.parametrize(
    "body",
    [
        {"enabled": "yes"},
        {"canary_fraction": 1.5},
        {"shadow_fraction": -0.1},
        {"canary_fraction": True},
        {"bogus": 1},
        {},
        [1],
    ],
)
def test_bad_admin_bodies_are_400_and_change_nothing(gw: Gateway, admin: httpx.Client, body: object) -> None:
    r = admin.post(ADMIN + "/ops-ngram", json=body)
    assert r.status_code == 400, r.text
    assert set(r.json()["error"]) == {"message", "type", "param", "code"}
    assert row(admin, "ops-ngram")["canary_fraction"] == 1.0
    assert admin.post(ADMIN + "/ops-ngram", content=b"{nope").status_code == 400
    assert admin.post(ADMIN + "/no-such-route", json={"enabled": False}).status_code == 404


def test_canary_rolls_back_a_losing_drafter(gw: Gateway, admin: httpx.Client, caplog) -> None:
    route = gw.routes.get("ops-bad")
    assert route is not None and route.speculative
    r = admin.post(ADMIN + "/ops-bad", json={"canary_fraction": 0.5})
    assert r.status_code == 200 and r.json()["canary_fraction"] == 0.5
    with caplog.at_level("WARNING", logger="draftgate.server.ops"):
        for _ in range(200):
            complete(gw, "ops-bad", max_tokens=12)
            if not route.enabled:
                break
    assert not route.enabled and not route.speculative
    info = row(admin, "ops-bad")
    assert info["enabled"] is False and info["canary"]["rollbacks"] == 1
    assert "speculative" in info["last_rollback_reason"]
    assert "rolled back" in caplog.text
    assert metric(gw, "draftgate:canary_rollbacks_total", model_name="ops-bad") == 1.0
    (out,) = complete(gw, "ops-bad")
    assert out["speculative"]["draft_tokens"] == 0
    assert_no_leaks(gw.engine("ops-bad"))


def test_shadow_mode_predicts_without_speculating(gw: Gateway, admin: httpx.Client) -> None:
    assert admin.post(ADMIN + "/ops-shadow", json={"shadow_fraction": 1.0}).status_code == 200
    outs = complete(gw, "ops-shadow", n=3, max_tokens=16)
    assert all(o["speculative"]["draft_tokens"] == 0 for o in outs)  # live traffic stayed plain
    assert ops(gw).shadow_worker.wait_idle(30)
    sh = row(admin, "ops-shadow")["shadow"]
    assert sh["requests"] == 3
    assert 0.0 <= sh["predicted_acceptance_rate"] <= 1.0
    assert sh["predicted_mean_accepted_length"] >= 1.0 and sh["predicted_speedup"] > 0.0
    assert metric(gw, "draftgate:shadow_predicted_mean_accepted_length", model_name="ops-shadow") >= 1.0


class WrongReference:
    """A stand-in reference back end whose 'plain' output always differs at position 2."""

    num_waiting = 0

    def submit(self, prompt_ids, params, sink, speculate: bool = True):  # type: ignore[no-untyped-def]
        sink(Chunk([7, 7, 9], "", "length"))
        return lambda: None

    def start(self) -> None:
        pass


def test_lossless_canary_counts_checks_and_mismatches(gw: Gateway, admin: httpx.Client) -> None:
    name, ro = "ops-lossless", ops(gw)["ops-lossless"]
    assert admin.post(ADMIN + f"/{name}", json={"lossless_fraction": 1.0}).status_code == 200
    outs = complete(gw, name, n=3, max_tokens=40)
    drafted = sum(o["speculative"]["draft_tokens"] > 0 for o in outs)
    assert drafted >= 1  # the prompt repeats: the n-gram drafter drafts
    assert ops(gw).lossless_worker.wait_idle(60)
    assert ro.lossless_checks == drafted and ro.lossless_mismatches == 0
    assert metric(gw, "draftgate:lossless_canary_checks_total", model_name=name) == drafted
    assert metric(gw, "draftgate:lossless_canary_mismatches_total", model_name=name) == 0.0

    ro.lossless_reference = WrongReference()  # type: ignore[assignment]
    try:
        outs = complete(gw, name, n=2, max_tokens=40)
        assert ops(gw).lossless_worker.wait_idle(60)
    finally:
        ro.lossless_reference = None
    bad = sum(o["speculative"]["draft_tokens"] > 0 for o in outs)
    assert ro.lossless_mismatches == bad >= 1
    assert metric(gw, "draftgate:lossless_canary_mismatches_total", model_name=name) == bad
    recent = row(admin, name)["lossless"]["recent_mismatches"]
    assert recent[-1]["request_id"] == outs[-1]["id"] or recent[-1]["request_id"] in {o["id"] for o in outs}
    assert all(isinstance(m["first_differing_position"], int) for m in recent)
    assert_no_leaks(gw.engine(name))


def test_streamed_requests_feed_the_route_stats(gw: Gateway, admin: httpx.Client) -> None:
    before = row(admin, "ops-ngram")["stats"]["requests"]
    with gw.openai() as client:
        stream = client.chat.completions.create(
            model="ops-ngram", messages=[{"role": "user", "content": PROMPT}], max_tokens=6, stream=True
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices) is not None
    assert row(admin, "ops-ngram")["stats"]["requests"] == before + 1
