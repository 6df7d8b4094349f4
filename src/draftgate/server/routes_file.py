"""The routes file (YAML or TOML), validated once at start; and building the table from it.

    routes:                      # [[routes]] in TOML
      - name: smollm2            # exposed model name (required, unique)
        model: smollm2-135m      # known name, .gguf file or HF folder (default: --model)
        drafter: auto            # none | ngram | suffix | model | quant | auto | http://HOST:PORT
                                 # | llamacpp+http://HOST:PORT (default: --drafter)
        target: embedded         # embedded | grpc://HOST:PORT[,grpc://...] (or a list) | openai+http://HOST:PORT
        k: auto                  # draft tokens per round, or auto (default: --k)
        k_max: 8                 # upper bound for adaptive K (default: --k-max)
        enabled: true            # speculation on for this route (default: true)

Optional per route: ``draft_model``, ``kv_blocks``, ``max_batch``, ``max_queue``,
``draft_timeout_ms`` (remote drafters: a slower answer costs that round its drafts),
``allow_approximate`` (openai+http targets only: serve sampling requests with the
approximate verifier, flagged as ``approximate`` on the request's stats and counted
by the back end; default false = sampling requests are refused with a 400). See
``draftgate.server.targets``. Every error names the file, the line where possible, and the
reason. Routes that share a model path share one
loaded model (one copy of the weights in host memory); each gets its own engine.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import tomllib
import yaml

from draftgate.engine import DrafterKind, EngineConfig
from draftgate.errors import DraftGateError
from draftgate.models.loader import LoadedModel, load_model, resolve_model_path
from draftgate.server.routes import ROUTE_NAME_RE, Route, RouteTable
from draftgate.server.targets import DrafterSpec, TargetKind, TargetSpec, parse_drafter, parse_target
from draftgate.server.targets.build import build_backend

__all__ = ["RouteSpec", "RoutesFileError", "load_routes_file", "parse_routes", "build_route_table"]

_FIELDS = {
    "name",
    "model",
    "drafter",
    "k",
    "k_max",
    "enabled",
    "draft_model",
    "kv_blocks",
    "max_batch",
    "max_queue",
    "target",
    "draft_timeout_ms",
    "allow_approximate",
}


class RoutesFileError(DraftGateError, ValueError):
    """The routes file is unreadable or invalid; the message is one line: FILE[:LINE]: reason."""


@dataclass(frozen=True)
class RouteSpec:
    """One validated route, before any model is loaded."""

    name: str
    config: EngineConfig
    enabled: bool = True
    where: str = ""  # "FILE:LINE" for messages
    target: TargetSpec = TargetSpec(TargetKind.EMBEDDED)
    drafter: DrafterSpec | None = None  # None: config.drafter (a built-in kind)
    allow_approximate: bool = False

    @property
    def drafter_spec(self) -> DrafterSpec:
        return self.drafter if self.drafter is not None else DrafterSpec(self.config.drafter)

    def __post_init__(self) -> None:
        if not ROUTE_NAME_RE.match(self.name):
            raise ValueError(
                f"route name {self.name!r} must be 1-128 letters, digits and ._:/@+- (use --served-model-name)"
            )


Lines = dict[str, int]  # key -> 1-based line; "" -> the route's own line


def load_routes_file(
    path: Path, base: EngineConfig, default_drafter: str | None = None, default_target: str = "embedded"
) -> list[RouteSpec]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise RoutesFileError(f"{path}: cannot read the routes file: {e}") from None
    return parse_routes(text, path, base, default_drafter, default_target)


def parse_routes(
    text: str, path: Path, base: EngineConfig, default_drafter: str | None = None, default_target: str = "embedded"
) -> list[RouteSpec]:
    """``default_drafter``/``default_target``: the flags' values for routes that leave those keys out."""
    suffix = path.suffix.lower()
    if suffix in (".yaml", ".yml"):
        data, lines = _parse_yaml(text, path)
    elif suffix == ".toml":
        data, lines = _parse_toml(text, path)
    else:
        raise RoutesFileError(f"{path}: a routes file must end in .yaml, .yml or .toml")
    if not isinstance(data, dict) or set(data) != {"routes"}:
        extra = sorted(set(data) - {"routes"}) if isinstance(data, dict) else None
        why = f"unknown top-level keys {extra}" if extra else "expected one top-level key 'routes' (a list)"
        raise RoutesFileError(f"{path}: {why}")
    items = data["routes"]
    if not isinstance(items, list) or not items:
        raise RoutesFileError(f"{path}: 'routes' must be a non-empty list of routes")
    specs: list[RouteSpec] = []
    seen: dict[str, str] = {}
    for i, item in enumerate(items):
        ln = lines[i] if i < len(lines) else {}
        spec = _route(item, ln, path, base, i, default_drafter or base.drafter.value, default_target)
        if spec.name in seen:
            raise RoutesFileError(f"{spec.where}: route name {spec.name!r} is already used at {seen[spec.name]}")
        seen[spec.name] = spec.where
        specs.append(spec)
    return specs


def _at(path: Path, lines: Lines, key: str = "") -> str:
    line = lines.get(key) or lines.get("")
    return f"{path}:{line}" if line else str(path)


def _route(
    item: Any, lines: Lines, path: Path, base: EngineConfig, index: int, default_drafter: str, default_target: str
) -> RouteSpec:
    where = _at(path, lines)
    if not isinstance(item, dict):
        raise RoutesFileError(f"{where}: route #{index + 1} must be a mapping of keys to values")
    unknown = sorted(set(map(str, item)) - _FIELDS)
    if unknown:
        raise RoutesFileError(
            f"{_at(path, lines, unknown[0])}: unknown key {unknown[0]!r} (allowed: {', '.join(sorted(_FIELDS))})"
        )
    name = item.get("name")
    if not isinstance(name, str) or not ROUTE_NAME_RE.match(name):
        raise RoutesFileError(
            f"{_at(path, lines, 'name')}: route #{index + 1} needs a 'name' of 1-128 letters, digits and ._:/@+-"
        )

    def bad(key: str, why: str) -> RoutesFileError:
        return RoutesFileError(f"{_at(path, lines, key)}: route {name!r}: {why}")

    def get_int(key: str, default: int | None) -> int | None:
        v = item.get(key, default)
        if v is not None and (isinstance(v, bool) or not isinstance(v, int)):
            raise bad(key, f"'{key}' must be an integer, got {v!r}")
        return v

    try:
        target = parse_target(item.get("target", default_target))
    except ValueError as e:
        raise bad("target", str(e)) from None
    model = item.get("model", base.model)
    if not isinstance(model, str) or not model:
        raise bad("model", "'model' must be a non-empty string (a known name, a .gguf file or an HF folder)")
    timeout_ms = item.get("draft_timeout_ms")
    if timeout_ms is not None and (
        isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or timeout_ms <= 0
    ):
        raise bad("draft_timeout_ms", f"'draft_timeout_ms' must be a positive number, got {timeout_ms!r}")
    drafter = item.get("drafter", default_drafter)
    try:
        dspec = parse_drafter(drafter) if timeout_ms is None else parse_drafter(drafter, timeout_ms / 1000.0)
    except ValueError as e:
        raise bad("drafter", str(e)) from None
    if timeout_ms is not None and not dspec.remote:
        raise bad(
            "draft_timeout_ms", "'draft_timeout_ms' applies only to remote drafters (http:// or llamacpp+http://)"
        )
    approx = item.get("allow_approximate", False)
    if not isinstance(approx, bool):
        raise bad("allow_approximate", f"'allow_approximate' must be true or false, got {approx!r}")
    if approx and target.kind is not TargetKind.OPENAI:
        raise bad(
            "allow_approximate", "'allow_approximate' applies only to openai+http:// targets (the others are exact)"
        )
    k: Any = item.get("k", "auto" if base.k is None else base.k)
    if k != "auto" and (isinstance(k, bool) or not isinstance(k, int)):
        raise bad("k", f"'k' must be an integer or 'auto', got {k!r}")
    enabled = item.get("enabled", True)
    if not isinstance(enabled, bool):
        raise bad("enabled", f"'enabled' must be true or false, got {enabled!r}")
    draft_model = item.get("draft_model", base.draft_model)
    if draft_model is not None and not isinstance(draft_model, str):
        raise bad("draft_model", "'draft_model' must be a path")
    try:
        cfg = replace(
            base,
            model=model,
            drafter=dspec.kind if isinstance(dspec.kind, DrafterKind) else DrafterKind.NONE,
            k=None if k == "auto" else k,
            k_max=get_int("k_max", base.k_max),
            draft_model=draft_model,
            num_blocks=get_int("kv_blocks", base.num_blocks),
            max_batch=get_int("max_batch", base.max_batch),
            max_queue=get_int("max_queue", base.max_queue),
        ).validate()
    except ValueError as e:
        if isinstance(e, RoutesFileError):
            raise
        key = _key_for(str(e))
        raise bad(key, str(e)) from None
    return RouteSpec(
        name=name,
        config=cfg,
        enabled=enabled,
        where=where,
        target=target,
        drafter=dspec if dspec.remote else None,
        allow_approximate=approx,
    )


def _key_for(message: str) -> str:
    """Which key an EngineConfig.validate message is about (for its line); "" = the route's line."""
    for prefix, key in (("k_max", "k_max"), ("k ", "k"), ("drafter", "drafter"), ("num_blocks", "kv_blocks")):
        if message.startswith(prefix):
            return key
    return ""


# ------------------------------------------------------------------ formats


def _parse_yaml(text: str, path: Path) -> tuple[Any, list[Lines]]:
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f"{path}:{mark.line + 1}" if mark is not None else str(path)
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RoutesFileError(f"{at}: invalid YAML: {problem}") from None
    lines: list[Lines] = []
    if isinstance(root, yaml.MappingNode):
        for key, value in root.value:
            if key.value == "routes" and isinstance(value, yaml.SequenceNode):
                for node in value.value:
                    ln: Lines = {"": node.start_mark.line + 1}
                    if isinstance(node, yaml.MappingNode):
                        for k, _v in node.value:
                            if str(k.value) in ln:
                                raise RoutesFileError(f"{path}:{k.start_mark.line + 1}: key {k.value!r} is given twice")
                            ln[str(k.value)] = k.start_mark.line + 1
                    lines.append(ln)
    return data, lines


_TOML_HEADER = re.compile(r"^\s*\[\[\s*routes\s*\]\]\s*(#.*)?$")
_TOML_KEY = re.compile(r"^\s*([A-Za-z0-9_-]+)\s*=")


def _parse_toml(text: str, path: Path) -> tuple[Any, list[Lines]]:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise RoutesFileError(f"{path}: invalid TOML: {e}") from None
    lines: list[Lines] = []
    current: Lines | None = None  # the [[routes]] table the next keys belong to
    for i, line in enumerate(text.splitlines(), start=1):
        if _TOML_HEADER.match(line):
            current = {"": i}
            lines.append(current)
        elif line.lstrip().startswith("["):
            current = None  # another table: its keys are not a route's
        elif current is not None and (m := _TOML_KEY.match(line)):
            current.setdefault(m.group(1), i)
    return data, lines


# ------------------------------------------------------------------ building


def build_route_table(specs: list[RouteSpec], load: Callable[[EngineConfig], LoadedModel] | None = None) -> RouteTable:
    """Load each distinct model once, build one engine per route; errors name the route's line."""
    load = load or _load
    shared: dict[tuple[str, str], LoadedModel] = {}
    routes: list[Route] = []
    try:
        for s in specs:
            try:
                key = (_model_key(s.config.model), s.config.dtype)
                if key not in shared:
                    shared[key] = load(s.config)
                engine = build_backend(s.config, s.target, s.drafter_spec, shared[key], s.allow_approximate)
            except DraftGateError as e:
                if not s.where:  # a route from flags: the error speaks for itself
                    raise
                raise RoutesFileError(f"{s.where}: route {s.name!r}: {e}") from None
            routes.append(Route(s.name, engine, enabled=s.enabled, model=s.config.model))
        return RouteTable.of(routes)
    except BaseException:
        for r in routes:
            r.engine.shutdown()
        raise


def _model_key(model: str) -> str:
    return str(resolve_model_path(model).resolve())


def _load(cfg: EngineConfig) -> LoadedModel:
    return load_model(cfg.model, dtype=cfg.torch_dtype, cache_dir=cfg.cache_dir, quantized=cfg.quantized)
