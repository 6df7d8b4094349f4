"""Bearer API keys: client keys for /v1, a separate admin key set for the admin API.

Keys are read at the CLI boundary (files, DRAFTGATE_API_KEYS) and handed in as an
``AuthConfig``; nothing here reads the environment. No client keys = open (dev
mode, warned about at start). No admin keys = the admin API is closed.
"""

from __future__ import annotations

import hmac
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from fastapi import Request

from draftgate.server.api_errors import APIError

__all__ = ["AuthConfig", "parse_keys", "read_keys_file", "require_client", "require_admin"]

MIN_KEY_CHARS = 8


@dataclass(frozen=True)
class AuthConfig:
    api_keys: frozenset[str] = frozenset()
    admin_keys: frozenset[str] = frozenset()

    @property
    def open(self) -> bool:
        """Dev mode: no client keys configured, every /v1 request is allowed."""
        return not self.api_keys


def parse_keys(lines: Iterable[str], source: str) -> frozenset[str]:
    """Keys one per line (or comma separated); blank lines and # comments are skipped."""
    keys: set[str] = set()
    for raw in lines:
        for key in raw.split("#", 1)[0].replace(",", " ").split():
            if len(key) < MIN_KEY_CHARS:
                raise ValueError(f"{source}: an API key must be at least {MIN_KEY_CHARS} characters")
            keys.add(key)
    return frozenset(keys)


def read_keys_file(path: Path) -> frozenset[str]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise ValueError(f"cannot read keys file {path}: {e}") from None
    keys = parse_keys(text.splitlines(), str(path))
    if not keys:
        raise ValueError(f"keys file {path} holds no keys (one per line)")
    return keys


def _bearer(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer":
        return None
    return token.strip() or None


def _matches(token: str, keys: frozenset[str]) -> bool:
    ok = False
    for k in keys:  # compare against every key in constant time; no early exit
        ok |= hmac.compare_digest(token.encode(), k.encode())
    return ok


_UNAUTHORIZED = {"WWW-Authenticate": "Bearer"}


def require_client(auth: AuthConfig) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency: 401 without a valid client (or admin) key, unless in dev mode."""

    async def check(request: Request) -> None:
        if auth.open:
            return
        token = _bearer(request)
        if token is None:
            raise APIError(
                401,
                "You didn't provide an API key. Send it as 'Authorization: Bearer KEY'.",
                code="missing_api_key",
                headers=_UNAUTHORIZED,
            )
        if not (_matches(token, auth.api_keys) or _matches(token, auth.admin_keys)):
            raise APIError(401, "Incorrect API key provided.", code="invalid_api_key", headers=_UNAUTHORIZED)

    return check


def require_admin(auth: AuthConfig) -> Callable[[Request], Awaitable[None]]:
    """A FastAPI dependency for the admin API: 401 without a known key, 403 with a client key."""

    async def check(request: Request) -> None:
        if not auth.admin_keys:
            raise APIError(
                403, "the admin API is disabled: start the server with --admin-key-file", code="admin_disabled"
            )
        token = _bearer(request)
        if token is None:
            raise APIError(
                401,
                "the admin API needs 'Authorization: Bearer ADMIN_KEY'",
                code="missing_api_key",
                headers=_UNAUTHORIZED,
            )
        if _matches(token, auth.admin_keys):
            return
        if _matches(token, auth.api_keys):
            raise APIError(403, "this key is a client key; the admin API needs an admin key", code="not_admin")
        raise APIError(401, "Incorrect API key provided.", code="invalid_api_key", headers=_UNAUTHORIZED)

    return check
