"""Remote back ends by flag and routes file: target/drafter specs, gateway -> gRPC worker, refusals.

The live check: the gateway (official openai client) in front of a real gRPC
target worker on the tiny model, greedy, == the embedded engine decoding plainly.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
from gateway_support import CLIENT_KEY, serve_app

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.engine.session_host import SessionHost
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ModelRunner
from draftgate.server import AuthConfig, create_app
from draftgate.server.routes_file import RoutesFileError, RouteSpec, build_route_table, parse_routes
from draftgate.server.targets import DrafterSpec, RemoteDrafterKind, parse_drafter, parse_target
from draftgate.server.targets.grpc_engine import RemoteTargetEngine
from draftgate.server.workers.target_server import TargetWorkerServer

PROMPTS = ["hello world the", "a b c a b c a b"]


def test_target_and_drafter_specs() -> None:
    assert parse_target("embedded").kind == "embedded"
    t = parse_target("grpc://127.0.0.1:5001,grpc://10.0.0.2:5002")
    assert t.kind == "grpc" and t.addresses == ("grpc://127.0.0.1:5001", "grpc://10.0.0.2:5002")
    assert parse_target(["grpc://h:1", "grpc://h:2"]).addresses == ("grpc://h:1", "grpc://h:2")
    o = parse_target("openai+http://localhost:8080/")
    assert o.kind == "openai" and o.addresses == ("http://localhost:8080",)
    for bad in ("grpc://h", "grpc://h:1,http://h:2", "http://h:1", "grpc://h:1,grpc://h:1", "", 3):
        with pytest.raises(ValueError):
            parse_target(bad)
    assert parse_drafter("ngram").kind == DrafterKind.NGRAM
    assert parse_drafter("http://h:9").url == "http://h:9"
    d = parse_drafter("llamacpp+http://h:9", 0.3)
    assert (d.kind, d.url, d.timeout_s, d.text) == ("llamacpp", "http://h:9", 0.3, "llamacpp+http://h:9")
    for bad in ("medusa", "llamacpp+http://h", "https//x"):
        with pytest.raises(ValueError):
            parse_drafter(bad)


@pytest.mark.parametrize(
    "body,why",
    [
        ("    target: grpc://h\n", ":3: route 'a': gRPC target 'h' must be HOST:PORT"),
        ("    target: tcp://h:1\n", ":3: route 'a': unknown target"),
        ("    allow_approximate: true\n", ":3: route 'a': 'allow_approximate' applies only to openai+http://"),
        ("    draft_timeout_ms: 20\n", ":3: route 'a': 'draft_timeout_ms' applies only to remote drafters"),
        ("    drafter: llamacpp+http://h\n", ":3: route 'a': llama.cpp drafter"),
    ],
)
def test_routes_file_rejects_bad_remote_keys(body: str, why: str) -> None:
    with pytest.raises(RoutesFileError) as e:
        parse_routes("routes:\n  - name: a\n" + body, Path("r.yaml"), EngineConfig())
    assert why in str(e.value)


def test_routes_file_remote_keys() -> None:
    text = (
        "routes:\n"
        "  - name: a\n    target: [grpc://h:1, grpc://h:2]\n    drafter: http://d:7\n    draft_timeout_ms: 20\n"
        "  - name: b\n    target: openai+http://l:8\n    drafter: ngram\n    allow_approximate: true\n"
        "  - name: c\n"
    )
    a, b, c = parse_routes(text, Path("r.yaml"), EngineConfig(), default_drafter="llamacpp+http://x:1")
    assert a.target.addresses == ("grpc://h:1", "grpc://h:2") and a.drafter_spec == DrafterSpec(
        RemoteDrafterKind.HTTP, "http://d:7", 0.02
    )
    assert b.target.kind == "openai" and b.allow_approximate and b.drafter_spec.kind == DrafterKind.NGRAM
    assert c.target.kind == "embedded" and c.drafter_spec.kind == "llamacpp"


def test_serve_flags_build_remote_route() -> None:
    from draftgate.cli import serve as serve_cli

    p = argparse.ArgumentParser()
    serve_cli.register(p.add_subparsers())
    a = p.parse_args(
        ["serve", "--target", "grpc://127.0.0.1:1", "--drafter", "llamacpp+http://127.0.0.1:2", "--k", "3"]
    )
    spec = serve_cli.route_from_flags(a)
    assert spec.target.kind == "grpc" and spec.drafter_spec.kind == "llamacpp" and spec.config.k == 3
    with pytest.raises(SystemExit):
        p.parse_args(["serve", "--target", "udp://x:1"])
    a = p.parse_args(["serve", "--allow-approximate"])
    with pytest.raises(ValueError, match="allow-approximate"):
        serve_cli.route_from_flags(a)


def test_gateway_over_grpc_worker_is_lossless(tiny_model: LoadedModel, tiny_model_dir: Path) -> None:
    worker = TargetWorkerServer(SessionHost(ModelRunner(tiny_model, num_blocks=256, block_size=8), "tiny")).start()
    plain = build_engine(
        EngineConfig(model="tiny", drafter=DrafterKind.NONE, num_blocks=256, block_size=8), loaded=tiny_model
    )
    cfg = EngineConfig(model=str(tiny_model_dir), drafter=DrafterKind.NGRAM, k=4, num_blocks=256, block_size=8)
    specs = [RouteSpec("tiny-grpc", cfg, target=parse_target("grpc://" + worker.target))]
    routes = build_route_table(specs, load=lambda _cfg: tiny_model)
    try:
        engine = routes.get("tiny-grpc").engine  # type: ignore[union-attr]
        assert isinstance(engine, RemoteTargetEngine)
        app = create_app(routes, AuthConfig(api_keys=frozenset({CLIENT_KEY})))
        with serve_app(app) as url:
            import openai

            client = openai.OpenAI(base_url=url + "/v1", api_key=CLIENT_KEY, max_retries=0, timeout=30)
            drafted = 0
            for prompt in PROMPTS:
                from draftgate.types import SamplingParams

                want = plain.complete(
                    prompt, SamplingParams(temperature=0.0, max_new_tokens=24, ignore_eos=True), raw=True
                )
                got = client.completions.create(
                    model="tiny-grpc", prompt=prompt, max_tokens=24, temperature=0, extra_body={"ignore_eos": True}
                )
                assert got.choices[0].text == want.text
                assert got.usage is not None and got.usage.completion_tokens == 24
                drafted += got.model_extra["speculative"]["draft_tokens"] if got.model_extra else 0
            assert drafted > 0  # the n-gram drafter did propose through the gRPC path
            assert engine.wire.rounds > 0 and engine.wire.bytes_per_round < 1024
    finally:
        routes.close()
        plain.shutdown()
        worker.stop(grace=0)
