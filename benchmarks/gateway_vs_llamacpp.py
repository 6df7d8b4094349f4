"""Gateway vs llama.cpp server alone, and the gRPC split deployment vs the embedded engine.

Part A (``--part llamacpp``): a llama-cpp-python server is started on the bundled
GGUF (``--logits_all true``; loopback only). For each built-in prompt
(src/draftgate/data/prompts.jsonl, first turn, chat template), interleaved per
prompt and repeat: (1) the server alone, greedy ``/v1/completions`` on the
templated text; (2) the openai+http target back end (``OpenAITargetEngine``:
draft loop in this process with the n-gram or suffix drafter, verification
through the server's echoed prompt log-probabilities), greedy. Reports tokens/s
per category and the ratio gateway/server. A gateway request that ends with a
verification error (see openai_target: re-tokenization, ambiguous strings) is
counted in ``errors``; its tokens/s are those it produced before the error.
The gateway's HTTP hop is not included (the back end is driven directly).

Part B (``--part split``): the embedded Engine vs a RemoteTargetEngine on an
in-process gRPC target worker (loopback), same model, same drafter, greedy:
bytes on the wire per verification round (RemoteTargetEngine.wire), mean time
per round of each and the difference (added latency per round, mean, not p50),
and end-to-end tokens/s ratio split/embedded.

    .venv/bin/python benchmarks/gateway_vs_llamacpp.py --limit 1 --max-tokens 32 --repeats 1   # smoke
    .venv/bin/python benchmarks/gateway_vs_llamacpp.py --max-tokens 128 --repeats 3 --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import socket
import statistics
import subprocess
import sys
import time
from collections import defaultdict
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from draftgate.drafters import NgramDrafter, SuffixDrafter
from draftgate.models.loader import load_model, resolve_model_path
from draftgate.types import SamplingParams


def load_prompts(limit: int | None) -> list[dict[str, Any]]:
    text = resources.files("draftgate.data").joinpath("prompts.jsonl").read_text(encoding="utf-8")
    rows = [json.loads(line) for line in text.splitlines() if line.strip()]
    return rows[:limit] if limit else rows


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_llama_server(gguf: str, threads: int, n_ctx: int) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", gguf, "--host", "127.0.0.1", "--port", str(port),
           "--n_threads", str(threads), "--logits_all", "true", "--n_ctx", str(n_ctx)]  # fmt: skip
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        try:
            if httpx.get(url + "/v1/models", timeout=1).status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            raise SystemExit("the llama.cpp server did not start")
        time.sleep(0.2)


def run_engine(engine: Any, ids: list[int], params: SamplingParams) -> dict[str, Any]:
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    t0 = time.perf_counter()
    engine.submit(ids, params, q.put)
    n = 0
    toks: list[int] = []
    while True:
        c = q.get(timeout=600)
        n += len(c.token_ids)
        toks.extend(c.token_ids)
        if c.finish_reason is not None:
            el = time.perf_counter() - t0
            s = c.stats
            return {
                "tokens": n,
                "seconds": el,
                "error": c.error if c.finish_reason == "error" else None,
                "rounds": getattr(s, "rounds", 0),
                "draft_tokens": getattr(s, "draft_tokens", 0),
                "accepted_tokens": getattr(s, "accepted_tokens", 0),
                "token_ids": toks,
            }


def part_llamacpp(a: argparse.Namespace) -> dict[str, Any]:
    from draftgate.server.backends.openai_target import OpenAITargetEngine

    gguf = str(resolve_model_path(a.model))
    loaded = load_model(a.model)
    tok = loaded.tokenizer
    proc, url = start_llama_server(gguf, a.threads, a.n_ctx)
    drafter = NgramDrafter() if a.drafter == "ngram" else SuffixDrafter()
    eng = OpenAITargetEngine(url, tok, drafter, k=a.k)
    params = SamplingParams(temperature=0.0, max_new_tokens=a.max_tokens, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(a.repeats):
            for p in load_prompts(a.limit):
                ids = tok.encode_chat([{"role": "user", "content": p["turns"][0]}])
                text = tok.decode(ids, skip_special=False)
                order = ("server", "gateway") if rep % 2 == 0 else ("gateway", "server")  # interleaved
                for who in order:
                    if who == "server":
                        t0 = time.perf_counter()
                        r = httpx.post(
                            url + "/v1/completions",
                            json={"prompt": text, "max_tokens": a.max_tokens, "temperature": 0.0},
                            timeout=600,
                        ).json()
                        el = time.perf_counter() - t0
                        res = {"tokens": r["usage"]["completion_tokens"], "seconds": el, "error": None}
                        server_text = r["choices"][0]["text"]
                    else:
                        res = run_engine(eng, ids, params)
                        res["text"] = tok.decode(res.pop("token_ids"))
                    res.update(who=who, category=p["category"], question_id=p["question_id"], repeat=rep)
                    res["tok_s"] = res["tokens"] / res["seconds"] if res["seconds"] else 0.0
                    rows.append(res)
                for res in rows[-2:]:  # same text as the server's own greedy run? (see openai_target's notes)
                    if res["who"] == "gateway":
                        res["same_text_as_server"] = res.pop("text") == server_text
                    print(json.dumps(res), file=sys.stderr)
    finally:
        eng.shutdown()
        proc.terminate()
        proc.wait(timeout=10)
    by: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    errors: dict[str, int] = defaultdict(int)
    same: dict[str, list[bool]] = defaultdict(list)
    for r in rows:
        if "same_text_as_server" in r:
            same[r["category"]].append(r["same_text_as_server"])
        by[r["category"]][r["who"]].append(r["tok_s"])
        if r.get("error"):
            errors[r["category"]] += 1
    summary = {}
    for cat, d in by.items():
        s = statistics.median(d["server"]) if d["server"] else 0.0
        g = statistics.median(d["gateway"]) if d["gateway"] else 0.0
        summary[cat] = {"server_tok_s": round(s, 2), "gateway_tok_s": round(g, 2),
                        "ratio": round(g / s, 3) if s else None, "gateway_errors": errors[cat],
                        "same_text_as_server": f"{sum(same[cat])}/{len(same[cat])}"}  # fmt: skip
    return {"rows": rows, "summary": summary}


def part_split(a: argparse.Namespace) -> dict[str, Any]:
    from draftgate.engine import DrafterKind, EngineConfig, build_engine
    from draftgate.models.runner import ModelRunner
    from draftgate.server.rpc.client import RemoteTargetEngine
    from draftgate.server.rpc.host import SessionHost
    from draftgate.server.rpc.target_server import TargetWorkerServer

    loaded = load_model(a.model)
    tok = loaded.tokenizer
    kind = DrafterKind(a.drafter)
    cfg = EngineConfig(model=a.model, drafter=kind, k=a.k, num_blocks=512, block_size=16)
    emb = build_engine(cfg, loaded=loaded).start()
    worker = TargetWorkerServer(SessionHost(ModelRunner(loaded, num_blocks=512, block_size=16), a.model)).start()
    drafter = NgramDrafter() if a.drafter == "ngram" else SuffixDrafter()
    split = RemoteTargetEngine(["grpc://" + worker.target], tok, drafter, k=a.k).start()
    params = SamplingParams(temperature=0.0, max_new_tokens=a.max_tokens, ignore_eos=True)
    rows: list[dict[str, Any]] = []
    try:
        for rep in range(a.repeats):
            for p in load_prompts(a.limit):
                ids = tok.encode_chat([{"role": "user", "content": p["turns"][0]}])
                order = ("embedded", "split") if rep % 2 == 0 else ("split", "embedded")
                for who in order:
                    res = run_engine(emb if who == "embedded" else split, ids, params)
                    res.pop("token_ids")
                    res.update(who=who, category=p["category"], question_id=p["question_id"], repeat=rep)
                    res["s_per_round"] = res["seconds"] / res["rounds"] if res["rounds"] else None
                    rows.append(res)
                    print(json.dumps(res), file=sys.stderr)
        w = split.wire
        per_round = {who: statistics.median([r["s_per_round"] for r in rows if r["who"] == who and r["s_per_round"]])
                     for who in ("embedded", "split")}  # fmt: skip
        tok_s = {who: sum(r["tokens"] for r in rows if r["who"] == who) / sum(r["seconds"] for r in rows if r["who"] == who)
                 for who in ("embedded", "split")}  # fmt: skip
        summary = {
            "wire_rounds": w.rounds,
            "wire_bytes_per_round": round(w.bytes_per_round, 1),
            "wire_max_round_bytes": w.max_round_bytes,
            "embedded_ms_per_round_median": round(per_round["embedded"] * 1e3, 3),
            "split_ms_per_round_median": round(per_round["split"] * 1e3, 3),
            "added_ms_per_round": round((per_round["split"] - per_round["embedded"]) * 1e3, 3),
            "tok_s": {k: round(v, 2) for k, v in tok_s.items()},
            "split_over_embedded": round(tok_s["split"] / tok_s["embedded"], 3),
        }
    finally:
        split.shutdown()
        emb.shutdown()
        worker.stop(grace=0)
    return {"rows": rows, "summary": summary}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=["llamacpp", "split", "both"], default="both")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter", choices=["ngram", "suffix"], default="ngram")
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--limit", type=int, default=None, help="first N prompts only")
    ap.add_argument("--threads", type=int, default=2, help="llama.cpp server threads")
    ap.add_argument("--n-ctx", type=int, default=4096)
    ap.add_argument("--json", type=Path, default=None, help="write all rows and summaries here")
    a = ap.parse_args()
    out: dict[str, Any] = {"args": vars(a) | {"json": str(a.json) if a.json else None}}
    if a.part in ("llamacpp", "both"):
        out["llamacpp"] = part_llamacpp(a)
        print("llama.cpp server alone vs gateway (openai+http target):", json.dumps(out["llamacpp"]["summary"], indent=2))
    if a.part in ("split", "both"):
        out["split"] = part_split(a)
        print("gRPC split vs embedded:", json.dumps(out["split"]["summary"], indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
