"""The routes file: YAML and TOML, validated at start with FILE:LINE and the reason; shared models."""

from __future__ import annotations

from pathlib import Path

import pytest

from draftgate.engine import DrafterKind, EngineConfig
from draftgate.models.loader import LoadedModel
from draftgate.server.routes import Route, RouteTable
from draftgate.server.routes_file import RoutesFileError, RouteSpec, build_route_table, parse_routes

BASE = EngineConfig(model="smollm2-135m", drafter=DrafterKind.AUTO, num_blocks=64, block_size=8)

YAML_OK = """\
# two routes on one model, one plain
routes:
  - name: fast
    model: smollm2-135m
    drafter: ngram
    k: 4
    k_max: 6
  - name: plain
    drafter: none
    enabled: false
    kv_blocks: 32
"""

TOML_OK = """\
[[routes]]
name = "fast"
drafter = "suffix"
k = "auto"

[[routes]]
name = "other"
model = "smollm2-135m"
max_batch = 2
"""


def test_yaml_routes() -> None:
    specs = parse_routes(YAML_OK, Path("r.yaml"), BASE)
    assert [s.name for s in specs] == ["fast", "plain"]
    fast, plain = specs
    assert fast.config.drafter == DrafterKind.NGRAM and fast.config.k == 4 and fast.config.k_max == 6
    assert fast.where == "r.yaml:3" and fast.enabled
    assert plain.config.drafter == DrafterKind.NONE and not plain.enabled
    assert plain.config.model == BASE.model and plain.config.num_blocks == 32  # defaults from the flags


def test_toml_routes() -> None:
    specs = parse_routes(TOML_OK, Path("r.toml"), BASE)
    assert [(s.name, s.config.drafter, s.config.k) for s in specs] == [
        ("fast", DrafterKind.SUFFIX, None),
        ("other", DrafterKind.AUTO, None),
    ]
    assert specs[1].config.max_batch == 2 and specs[1].where == "r.toml:6"


BAD_YAML: list[tuple[str, str, str]] = [
    ("routes:\n  - name: a\n    drafter: medusa\n", "r.yaml:3", "unknown drafter 'medusa'"),
    ("routes:\n  - name: a\n    k: -1\n", "r.yaml:3", "k must be in"),
    ("routes:\n  - name: a\n    k: four\n", "r.yaml:3", "'k' must be an integer or 'auto'"),
    ("routes:\n  - name: a\n    k_max: 99\n", "r.yaml:3", "k_max must be in"),
    ("routes:\n  - name: a\n    enabled: maybe\n", "r.yaml:3", "'enabled' must be true or false"),
    ("routes:\n  - name: a\n    colour: red\n", "r.yaml:3", "unknown key 'colour'"),
    ("routes:\n  - model: x\n", "r.yaml:2", "needs a 'name'"),
    ("routes:\n  - name: 'bad name'\n", "r.yaml:2", "needs a 'name'"),
    ("routes:\n  - name: a\n  - name: a\n", "r.yaml:3", "already used at r.yaml:2"),
    ("routes:\n  - name: a\n    name: b\n", "r.yaml:3", "given twice"),
    ("routes:\n  - name: a\n    target: tcp://h:1\n", "r.yaml:3", "unknown target"),
    ("routes:\n  - name: a\n    drafter: model\n", "r.yaml:3", "needs --draft-model"),
    ("routes:\n  - name: a\n   drafter: none\n", "r.yaml:3", "invalid YAML"),
    ("routes: []\n", "r.yaml", "non-empty list"),
    ("routez:\n  - name: a\n", "r.yaml", "unknown top-level keys"),
    ("- name: a\n", "r.yaml", "top-level key 'routes'"),
    ("routes:\n  - just-a-string\n", "r.yaml:2", "must be a mapping"),
]


@pytest.mark.parametrize("text,where,why", BAD_YAML, ids=[w for _, _, w in BAD_YAML])
def test_bad_yaml_names_line_and_reason(text: str, where: str, why: str) -> None:
    with pytest.raises(RoutesFileError) as e:
        parse_routes(text, Path("r.yaml"), BASE)
    msg = str(e.value)
    assert msg.startswith(where + ":"), msg
    assert why in msg
    assert "\n" not in msg


BAD_TOML: list[tuple[str, str, str]] = [
    ('[[routes]]\nname = "a"\n\n[[routes]]\nname = "b"\ndrafter = "x"\n', "r.toml:6", "unknown drafter"),
    ('[[routes]]\nname = "a"\nk = 1.5\n', "r.toml:3", "'k' must be an integer"),
    ('[[routes]\nname = "a"\n', "r.toml", "invalid TOML"),
]


@pytest.mark.parametrize("text,where,why", BAD_TOML, ids=[w for _, _, w in BAD_TOML])
def test_bad_toml_names_line_and_reason(text: str, where: str, why: str) -> None:
    with pytest.raises(RoutesFileError) as e:
        parse_routes(text, Path("r.toml"), BASE)
    msg = str(e.value)
    assert msg.startswith(where + ":") and why in msg, msg


def test_unknown_extension() -> None:
    with pytest.raises(RoutesFileError, match="must end in"):
        parse_routes("routes: []", Path("r.json"), BASE)


def test_routes_sharing_a_model_share_one_load(tiny_model: LoadedModel, tiny_model_dir: Path) -> None:
    text = f"""\
routes:
  - name: a
    model: {tiny_model_dir}
    drafter: ngram
    k: 2
  - name: b
    model: {tiny_model_dir}/
    drafter: none
"""
    specs = parse_routes(text, Path("r.yaml"), BASE)
    loads: list[str] = []

    def load(cfg: EngineConfig) -> LoadedModel:
        loads.append(cfg.model)
        return tiny_model

    table = build_route_table(specs, load=load)
    try:
        assert loads == [str(tiny_model_dir)]  # one load for both routes
        a, b = table.get("a"), table.get("b")
        assert a is not None and b is not None
        assert a.engine is not b.engine  # each route has its own engine and KV cache
        assert a.speculative and not b.speculative and b.drafter_name == "none"
        assert a.context_length == tiny_model.config.max_position_embeddings
    finally:
        table.close()


def test_missing_model_names_the_route(tmp_path: Path) -> None:
    specs = parse_routes("routes:\n  - name: a\n  - name: b\n    model: /no/such/model.gguf\n", Path("r.yaml"), BASE)
    with pytest.raises(RoutesFileError, match=r"^r.yaml:3: route 'b': .*not found"):
        build_route_table(specs[1:])


def test_route_table_rules(tiny_model: LoadedModel) -> None:
    from gateway_support import tiny_engine

    e = tiny_engine(tiny_model, DrafterKind.NONE)
    try:
        with pytest.raises(ValueError, match="unique"):
            RouteTable.of([Route("x", e), Route("x", e)])
        with pytest.raises(ValueError, match="empty"):
            RouteTable.of([])
        with pytest.raises(ValueError, match="route name"):
            Route("no spaces", e)
        with pytest.raises(ValueError, match="route name"):
            RouteSpec(name="/abs/path.gguf", config=BASE)
    finally:
        e.shutdown()
