"""`draftgate serve`: the OpenAI-compatible gateway on the embedded engine, or on routes from a file.

With no --routes: one route named by --model, with --drafter/--k. With --routes
FILE (YAML or TOML): the routes it declares; --model/--drafter/--k/--k-max are the
defaults for keys a route leaves out. Client keys come from --api-keys-file or
DRAFTGATE_API_KEYS (comma or space separated); none = open dev mode.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from draftgate.cli.common import add_engine_args, engine_config

__all__ = ["register", "run", "KEYS_ENV"]

KEYS_ENV = "DRAFTGATE_API_KEYS"


def _port(v: str) -> int:
    try:
        p = int(v)
    except ValueError:
        raise argparse.ArgumentTypeError(f"--port must be an integer, got {v!r}") from None
    if not 0 <= p <= 65535:
        raise argparse.ArgumentTypeError(f"--port must be in [0, 65535], got {p}")
    return p


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = sub.add_parser("serve", help="run the OpenAI-compatible gateway", description=__doc__)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to listen on (default: %(default)s)")
    g.add_argument("--port", type=_port, default=8000, help="port (default: %(default)s)")
    g.add_argument("--routes", type=Path, default=None, metavar="FILE", help="routes file (.yaml/.yml/.toml)")
    g.add_argument("--api-keys-file", type=Path, default=None, metavar="FILE", help="client API keys, one a line")
    g.add_argument("--admin-key-file", type=Path, default=None, metavar="FILE", help="admin API keys, one a line")
    g.add_argument(
        "--served-model-name", default=None, metavar="NAME", help="model name clients send (default: --model)"
    )
    g.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    add_engine_args(p)
    p.set_defaults(func=run)


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
    from draftgate.server.routes_file import RouteSpec, build_route_table, load_routes_file

    auth = auth_config(a)
    base = engine_config(a)
    if a.routes is not None:
        specs = load_routes_file(a.routes, base)
    else:
        specs = [RouteSpec(name=a.served_model_name or _default_name(base.model), config=base)]
    logging.basicConfig(level=a.log_level.upper(), format="%(levelname)s %(name)s: %(message)s")
    print(f"draftgate: loading {len(specs)} route(s): {', '.join(s.name for s in specs)}", file=sys.stderr)
    routes = build_route_table(specs)
    try:
        app = create_app(routes, auth)
        uvicorn.run(app, host=a.host, port=a.port, log_level=a.log_level)
    finally:
        routes.close()
    return 0
