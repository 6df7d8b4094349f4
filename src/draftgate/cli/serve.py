"""`draftgate serve`: the OpenAI-compatible gateway on the embedded engine, or on routes from a file.

With no --routes: one route named by --model, with --drafter/--k. With --routes
FILE (YAML or TOML): the routes it declares; --model/--drafter/--k/--k-max are the
defaults for keys a route leaves out.

Remote back ends: --target grpc://HOST:PORT[,grpc://...] (`draftgate serve-target`
workers) or openai+http://HOST:PORT (an OpenAI-compatible server we do not own,
e.g. llama.cpp's; greedy requests only unless --allow-approximate) or
vllm+http://HOST:PORT (a vLLM running DraftGate's proposer: vLLM drafts and
verifies with the route's drafter, the gateway switches it per request; or a vLLM
started with --enable-scale-out: the gateway drafts and verifies, vLLM scores); --drafter
http://HOST:PORT (`draftgate serve-draft`) or llamacpp+http://HOST:PORT (a
llama.cpp server drafting greedily). Client keys come from --api-keys-file or
DRAFTGATE_API_KEYS (comma or space separated); none = open dev mode.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from draftgate.cli.common import add_engine_args, engine_config, port_arg

__all__ = ["register", "run", "KEYS_ENV", "add_route_args", "route_specs"]

KEYS_ENV = "DRAFTGATE_API_KEYS"


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the OpenAI-compatible gateway", description=__doc__)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=port_arg, default=8000, help="port (default: %(default)s)")
    g.add_argument("--routes", type=Path, default=None, metavar="FILE", help="routes file (.yaml/.yml/.toml)")
    g.add_argument("--api-keys-file", type=Path, default=None, metavar="FILE", help="client API keys, one a line")
    g.add_argument("--admin-key-file", type=Path, default=None, metavar="FILE", help="admin API keys, one a line")
    g.add_argument(
        "--served-model-name", default=None, metavar="NAME", help="model name clients send (default: --model)"
    )
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_route_args(p)
    o = p.add_argument_group("operating (admin API at /admin; needs --admin-key-file)")
    o.add_argument(
        "--canary-margin",
        type=float,
        default=0.05,
        help="roll speculation back when its canary arm is this much worse (default: %(default)s)",
    )
    o.add_argument(
        "--canary-min-samples",
        type=int,
        default=20,
        help="requests per canary arm before a verdict (default: %(default)s)",
    )
    o.add_argument(
        "--lossless-fraction",
        type=float,
        default=0.0,
        help="share of greedy speculative requests re-run plainly and compared token for token (default: %(default)s)",
    )
    p.set_defaults(func=run)


def add_route_args(p: argparse.ArgumentParser) -> None:
    """Model, drafter (built-in or remote) and target of the one route the flags describe."""
    add_engine_args(p)
    drafter = p._option_string_actions["--drafter"]
    drafter.choices = None  # also URLs: checked by _drafter_arg
    drafter.type = _drafter_arg
    drafter.help = (
        "draft source: none, ngram, suffix, model, quant, auto, http://HOST:PORT (draft worker) "
        "or llamacpp+http://HOST:PORT (a llama.cpp server) (default: %(default)s)"
    )
    r = p.add_argument_group("remote back ends")
    r.add_argument(
        "--target",
        type=_target_arg,
        default="embedded",
        help="embedded, grpc://HOST:PORT[,grpc://...], openai+http://HOST:PORT or vllm+http://HOST:PORT "
        "(default: %(default)s)",
    )
    r.add_argument(
        "--draft-timeout-ms",
        type=float,
        default=None,
        help="remote drafters: a slower answer costs that round its drafts (default: 50 ms http, 250 ms llamacpp)",
    )
    r.add_argument(
        "--allow-approximate",
        action="store_true",
        help="openai+http targets: serve sampling requests approximately (marked in responses and metrics)",
    )


def _drafter_arg(v: str) -> str:
    from draftgate.server.targets import parse_drafter

    try:
        parse_drafter(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def _target_arg(v: str) -> str:
    from draftgate.server.targets import parse_target

    try:
        parse_target(v)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return v


def route_specs(a: argparse.Namespace):  # -> list[RouteSpec]
    """The routes of --routes FILE (flags give the defaults), else the one route the flags describe."""
    from draftgate.server.routes_file import load_routes_file

    if a.routes is None:
        return [route_from_flags(a)]
    dspec = _drafter_spec(a)
    base = engine_config(_with_drafter(a, "none" if dspec.remote else a.drafter))
    return load_routes_file(a.routes, base, default_drafter=a.drafter, default_target=a.target)


def route_from_flags(a: argparse.Namespace):  # -> RouteSpec
    """The one route that flags describe (no --routes)."""
    from draftgate.engine.config import DrafterKind
    from draftgate.server.routes_file import RouteSpec
    from draftgate.server.targets import TargetKind, parse_target

    dspec = _drafter_spec(a)
    target = parse_target(a.target)
    if a.allow_approximate and target.kind is not TargetKind.OPENAI:
        raise ValueError("--allow-approximate applies only to --target openai+http://HOST:PORT")
    if a.draft_timeout_ms is not None and not dspec.remote:
        raise ValueError("--draft-timeout-ms applies only to remote drafters (http:// or llamacpp+http://)")
    kind = dspec.kind if isinstance(dspec.kind, DrafterKind) else DrafterKind.NONE
    base = engine_config(_with_drafter(a, kind.value))
    return RouteSpec(
        name=a.served_model_name or _default_name(base.model),
        config=base,
        target=target,
        drafter=dspec if dspec.remote else None,
        allow_approximate=a.allow_approximate,
    )


def _drafter_spec(a: argparse.Namespace):  # -> DrafterSpec
    from draftgate.server.targets import parse_drafter

    if a.draft_timeout_ms is not None:
        if a.draft_timeout_ms <= 0:
            raise ValueError("--draft-timeout-ms must be positive")
        return parse_drafter(a.drafter, a.draft_timeout_ms / 1000.0)
    if a.drafter.startswith("llamacpp+"):
        from draftgate.drafters.llamacpp_server import DEFAULT_LLAMACPP_TIMEOUT_S

        return parse_drafter(a.drafter, DEFAULT_LLAMACPP_TIMEOUT_S)
    return parse_drafter(a.drafter)


def _with_drafter(a: argparse.Namespace, drafter: str) -> argparse.Namespace:
    b = argparse.Namespace(**vars(a))
    b.drafter = drafter
    return b


def auth_config(a: argparse.Namespace, environ: dict[str, str] | None = None):  # -> AuthConfig
    """Keys from the flags' files, else from the environment (read here, at the boundary only)."""
    from draftgate.server.auth import AuthConfig, parse_keys, read_keys_file

    env = os.environ if environ is None else environ
    if a.api_keys_file is not None:
        api = read_keys_file(a.api_keys_file)
    else:
        api = parse_keys([env.get(KEYS_ENV, "")], KEYS_ENV)
    admin = read_keys_file(a.admin_key_file) if a.admin_key_file is not None else frozenset()
    return AuthConfig(api_keys=api, admin_keys=admin)


def _default_name(model: str) -> str:
    """--model as given when it is a valid route name (e.g. smollm2-135m), else its file or folder name."""
    from draftgate.server.routes import ROUTE_NAME_RE

    return model if ROUTE_NAME_RE.match(model) else Path(model).name


def run(a: argparse.Namespace) -> int:
    import logging

    import uvicorn

    from draftgate.server import create_app
    from draftgate.server.ops import CanaryConfig, OpsConfig
    from draftgate.server.routes_file import build_route_table

    auth = auth_config(a)
    ops = OpsConfig(
        canary=CanaryConfig(margin=a.canary_margin, min_samples=a.canary_min_samples),
        lossless_fraction=a.lossless_fraction,
    ).validate()
    specs = route_specs(a)
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    print(f"draftgate: loading {len(specs)} route(s): {', '.join(s.name for s in specs)}", file=sys.stderr)
    routes = build_route_table(specs)
    try:
        app = create_app(routes, auth, ops)
        uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
    finally:
        routes.close()
    return 0
