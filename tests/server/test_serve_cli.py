"""`draftgate serve`: flags and files to a running gateway; bad files/flags are one-line errors, exit 2."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
from gateway_support import CLIENT_KEY, serve_app

from draftgate.cli import serve as serve_cli
from draftgate.cli.main import main


@pytest.fixture
def captured_app(monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """Replace uvicorn.run: keep the app the CLI built and serve it from the test instead."""
    import uvicorn

    got: dict[str, Any] = {}

    def fake_run(app: Any, **kw: Any) -> None:
        got["app"], got["kw"] = app, kw
        with serve_app(app) as url:
            got["models"] = httpx.get(url + "/v1/models", headers={"Authorization": f"Bearer {CLIENT_KEY}"}).json()
            got["noauth"] = httpx.get(url + "/v1/models").status_code
            body = {"model": got["models"]["data"][0]["id"], "prompt": "hello world", "max_tokens": 3}
            r = httpx.post(url + "/v1/completions", json=body, headers={"Authorization": f"Bearer {CLIENT_KEY}"})
            got["completion"] = r.json()

    monkeypatch.setattr(uvicorn, "run", fake_run)
    return got


def test_serve_one_route_from_flags(
    captured_app: dict[str, Any], tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(serve_cli.KEYS_ENV, CLIENT_KEY)
    rc = main(
        ["serve", "--model", str(tiny_model_dir), "--drafter", "ngram", "--k", "3", "--port", "9", "--kv-blocks", "64"]
    )
    assert rc == 0
    assert captured_app["kw"]["port"] == 9 and captured_app["kw"]["host"] == "127.0.0.1"
    assert [m["id"] for m in captured_app["models"]["data"]] == [tiny_model_dir.name]  # a path: its folder name
    assert captured_app["noauth"] == 401  # keys from DRAFTGATE_API_KEYS
    assert captured_app["completion"]["speculative"]["drafter"] == "ngram"
    routes = captured_app["app"].state.routes
    assert all(r.engine._thread is None for r in routes)  # the CLI shut its engines down


def test_serve_routes_file(captured_app: dict[str, Any], tiny_model_dir: Path, tmp_path: Path) -> None:
    keys = tmp_path / "keys.txt"
    keys.write_text(CLIENT_KEY + "\n")
    routes = tmp_path / "routes.toml"
    routes.write_text(
        f'[[routes]]\nname = "spec"\nmodel = "{tiny_model_dir}"\ndrafter = "suffix"\nkv_blocks = 64\n\n'
        f'[[routes]]\nname = "plain"\nmodel = "{tiny_model_dir}"\ndrafter = "none"\nkv_blocks = 64\n'
    )
    assert main(["serve", "--routes", str(routes), "--api-keys-file", str(keys)]) == 0
    assert [m["id"] for m in captured_app["models"]["data"]] == ["spec", "plain"]
    assert captured_app["completion"]["speculative"]["drafter"] == "suffix"


@pytest.mark.parametrize(
    "files,args,why",
    [
        (
            {"r.yaml": "routes:\n  - name: a\n    drafter: medusa\n"},
            ["--routes", "r.yaml"],
            "r.yaml:3: route 'a': unknown drafter",
        ),
        ({"r.yaml": "routes: [\n"}, ["--routes", "r.yaml"], "invalid YAML"),
        ({}, ["--routes", "nope.yaml"], "cannot read the routes file"),
        ({"k": "# none\n"}, ["--api-keys-file", "k"], "holds no keys"),
        ({}, ["--model", "/no/such/model.gguf", "--served-model-name", "x"], "not found"),
        ({}, ["--model", "/no/such/model.gguf"], "not found"),
        ({}, ["--served-model-name", "bad name"], "route name"),
    ],
    ids=["bad-drafter", "bad-yaml", "missing-routes", "empty-keys", "missing-model", "path-model", "bad-name"],
)
def test_serve_rejects_bad_config(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    files: dict[str, str],
    args: list[str],
    why: str,
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(serve_cli.KEYS_ENV, raising=False)
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    assert main(["serve", *args]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("draftgate: error: ") and why in err[-1], err


def test_bad_port_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["serve", "--port", "70000"])
    assert e.value.code == 2
    assert "--port must be in" in capsys.readouterr().err


@pytest.mark.slow
def test_serve_subprocess_end_to_end(tiny_model_dir: Path) -> None:
    """The real command in its own process: answers, then exits 0 on SIGINT."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, serve_cli.KEYS_ENV: CLIENT_KEY}
    cmd = [
        sys.executable,
        "-c",
        "from draftgate.cli.main import entry; entry()",
        "serve",
        "--model",
        str(tiny_model_dir),
        "--port",
        str(port),
        "--kv-blocks",
        "64",
        "--log-level",
        "warning",
    ]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            assert proc.poll() is None, proc.communicate()
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                assert time.monotonic() < deadline
                time.sleep(0.2)
        body = {"model": tiny_model_dir.name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 3}
        r = httpx.post(
            f"http://127.0.0.1:{port}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {CLIENT_KEY}"},
            timeout=60,
        )
        assert r.status_code == 200, r.text
    finally:
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
