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
Why this back end is slow on llama-cpp-python (its echo path sorts the whole
vocabulary in Python for every prompt position, every round): docs/BENCHMARKS.md.

Part B (``--part split``): the embedded Engine vs a RemoteTargetEngine on an
in-process gRPC target worker (loopback), same model, same drafter, greedy with
a fixed K (``--k``, default 4; no adaptive controller), interleaved per prompt
and repeat: bytes on the wire per verification round (RemoteTargetEngine.wire:
mean and the largest round), per-round wall time of each arm and the added
latency of the split deployment (p50), and end-to-end tokens/s ratio
split/embedded. A round's time is the gap between two consecutive chunks of a
request (one chunk per round; the first chunk, prefill, is excluded), stamped
in the engine's sink. Greedy and the same drafter make both arms run the same
rounds (same drafts, same acceptances): rounds are paired one to one and the
added latency is the p50 of the paired differences (also reported: p50 split
minus p50 embedded, and both restricted to rounds that carried a full K drafts).

    .venv/bin/python benchmarks/gateway_vs_llamacpp.py --limit 1 --max-tokens 32 --repeats 1   # smoke
    .venv/bin/python benchmarks/gateway_vs_llamacpp.py --max-tokens 128 --repeats 3 --json out.json
    .venv/bin/python benchmarks/gateway_vs_llamacpp.py --part split --max-tokens 128 --repeats 3
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
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import httpx

from draftgate.drafters import NgramDrafter, SuffixDrafter
from draftgate.drafters.base import Draft, Drafter, DraftRequest
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
    cmd = [
        sys.executable,
        "-m",
        "llama_cpp.server",
        "--model",
        gguf,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--n_threads",
        str(threads),
        "--logits_all",
        "true",
        "--n_ctx",
        str(n_ctx),
    ]
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


class RecordingDrafter:
    """A drafter that notes how many tokens each proposal carried (one request at a time here)."""

    def __init__(self, inner: Drafter) -> None:
        self.inner = inner
        self.name = inner.name
        self.lengths: list[int] = []

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = self.inner.propose(requests)
        self.lengths.extend(len(d.token_ids) for d in out)
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        self.inner.observe(seq_id, tokens, num_drafted, num_accepted)

    def release(self, seq_id: int) -> None:
        self.inner.release(seq_id)


def run_engine(engine: Any, ids: list[int], params: SamplingParams) -> dict[str, Any]:
    """One request; chunk arrival times are stamped in the sink (the engine's thread)."""
    q: queue.SimpleQueue[Any] = queue.SimpleQueue()
    t0 = time.perf_counter()
    engine.submit(ids, params, lambda c: q.put((time.perf_counter(), c)))
    n = 0
    toks: list[int] = []
    stamps: list[float] = []
    while True:
        t, c = q.get(timeout=600)
        stamps.append(t)
        n += len(c.token_ids)
        toks.extend(c.token_ids)
        if c.finish_reason is not None:
            el = t - t0
            s = c.stats
            return {
                "tokens": n,
                "seconds": el,
                "error": c.error if c.finish_reason == "error" else None,
                "rounds": getattr(s, "rounds", 0),
                "draft_tokens": getattr(s, "draft_tokens", 0),
                "accepted_tokens": getattr(s, "accepted_tokens", 0),
                "token_ids": toks,
                "round_s": [b - a for a, b in zip(stamps, stamps[1:], strict=False)],  # chunk 0 is the prefill's
            }


def part_llamacpp(a: argparse.Namespace) -> dict[str, Any]:
    from draftgate.server.targets.openai_engine import OpenAITargetEngine

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
                        res.pop("round_s")
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
        summary[cat] = {
            "server_tok_s": round(s, 2),
            "gateway_tok_s": round(g, 2),
            "ratio": round(g / s, 3) if s else None,
            "gateway_errors": errors[cat],
            "same_text_as_server": f"{sum(same[cat])}/{len(same[cat])}",
        }
    return {"rows": rows, "summary": summary}


def _p50_ms(xs: list[float]) -> float | None:
    return round(statistics.median(xs) * 1e3, 3) if xs else None


def _ratio(rows: list[dict[str, Any]], rep: int) -> float:
    """split/embedded tokens/s over one repeat's requests."""
    tps = {}
    for who in ("embedded", "split"):
        rs = [r for r in rows if r["who"] == who and r["repeat"] == rep]
        tps[who] = sum(r["tokens"] for r in rs) / sum(r["seconds"] for r in rs)
    return round(tps["split"] / tps["embedded"], 3)


def part_split(a: argparse.Namespace) -> dict[str, Any]:
    from draftgate.engine import Engine
    from draftgate.engine.session_host import SessionHost
    from draftgate.models.runner import ModelRunner
    from draftgate.server.targets.grpc_engine import RemoteTargetEngine
    from draftgate.server.workers.target_server import TargetWorkerServer

    loaded = load_model(a.model)
    tok = loaded.tokenizer

    def drafter() -> RecordingDrafter:
        return RecordingDrafter(NgramDrafter() if a.drafter == "ngram" else SuffixDrafter())

    # Same drafter kind, same fixed K, same KV geometry on both sides; k fixed means no K controller.
    d_emb, d_split = drafter(), drafter()
    emb = Engine(ModelRunner(loaded, num_blocks=512, block_size=16), d_emb, k=a.k).start()
    worker = TargetWorkerServer(SessionHost(ModelRunner(loaded, num_blocks=512, block_size=16), a.model)).start()
    split = RemoteTargetEngine(["grpc://" + worker.target], tok, d_split, k=a.k).start()
    arms = {"embedded": (emb, d_emb), "split": (split, d_split)}
    params = SamplingParams(temperature=0.0, max_new_tokens=a.max_tokens, ignore_eos=True)
    assert params.greedy
    rows: list[dict[str, Any]] = []
    rounds: dict[str, list[tuple[float, int]]] = {"embedded": [], "split": []}  # (seconds, drafts carried)
    paired: list[tuple[float, float, int]] = []  # (embedded s, split s, drafts) for the same round
    mismatched = 0
    try:
        for rep in range(a.repeats):
            for p in load_prompts(a.limit):
                ids = tok.encode_chat([{"role": "user", "content": p["turns"][0]}])
                order = ("embedded", "split") if rep % 2 == 0 else ("split", "embedded")
                got: dict[str, tuple[list[int], list[tuple[float, int]]]] = {}
                for who in order:
                    eng, rec = arms[who]
                    rec.lengths.clear()
                    res = run_engine(eng, ids, params)
                    # Round i (chunk i) drafted rec.lengths[i - 1]; rounds past the last proposal drafted none.
                    ks = rec.lengths + [0] * max(0, len(res["round_s"]) - len(rec.lengths))
                    per = list(zip(res.pop("round_s"), ks, strict=False))
                    rounds[who].extend(per)
                    got[who] = (res.pop("token_ids"), per)
                    res.update(who=who, category=p["category"], question_id=p["question_id"], repeat=rep)
                    res["s_per_round"] = res["seconds"] / res["rounds"] if res["rounds"] else None
                    res["round_ms_p50"] = _p50_ms([t for t, _ in per])
                    rows.append(res)
                    print(json.dumps(res), file=sys.stderr)
                (te, pe), (ts, ps) = got["embedded"], got["split"]
                if te == ts and [k for _, k in pe] == [k for _, k in ps]:
                    paired.extend((x, y, k) for (x, k), (y, _) in zip(pe, ps, strict=True))
                else:
                    mismatched += 1  # not the same rounds: left out of the paired figures
        w = split.wire
        tok_s = {
            who: sum(r["tokens"] for r in rows if r["who"] == who) / sum(r["seconds"] for r in rows if r["who"] == who)
            for who in ("embedded", "split")
        }
        full = [x for x in paired if x[2] == a.k]
        all_k = [k for _, k in rounds["split"]]
        summary = {
            "k": a.k,
            "greedy": True,
            "wire_rounds": w.rounds,
            "wire_bytes_per_round": round(w.bytes_per_round, 1),
            "wire_max_round_bytes": w.max_round_bytes,
            "rounds_measured": {who: len(v) for who, v in rounds.items()},
            "rounds_with_full_k": sum(1 for k in all_k if k == a.k),
            "drafts_per_round_mean": round(sum(all_k) / len(all_k), 2) if all_k else 0.0,
            "embedded_round_ms_p50": _p50_ms([t for t, _ in rounds["embedded"]]),
            "split_round_ms_p50": _p50_ms([t for t, _ in rounds["split"]]),
            "added_ms_per_round_p50_paired": _p50_ms([y - x for x, y, _ in paired]),
            "added_ms_per_round_p50_full_k_paired": _p50_ms([y - x for x, y, _ in full]),
            "embedded_round_ms_p50_full_k": _p50_ms([x for x, _, _ in full]),
            "split_round_ms_p50_full_k": _p50_ms([y for _, y, _ in full]),
            "paired_rounds": len(paired),
            "paired_full_k_rounds": len(full),
            "requests_not_paired": mismatched,
            "added_ms_per_round_mean": round(
                (
                    sum(r["seconds"] for r in rows if r["who"] == "split")
                    / max(1, sum(r["rounds"] for r in rows if r["who"] == "split"))
                    - sum(r["seconds"] for r in rows if r["who"] == "embedded")
                    / max(1, sum(r["rounds"] for r in rows if r["who"] == "embedded"))
                )
                * 1e3,
                3,
            ),
            "tok_s": {k: round(v, 2) for k, v in tok_s.items()},
            "split_over_embedded": round(tok_s["split"] / tok_s["embedded"], 3),
            "split_over_embedded_per_repeat": [_ratio(rows, rep) for rep in range(a.repeats)],
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
        print(
            "llama.cpp server alone vs gateway (openai+http target):", json.dumps(out["llamacpp"]["summary"], indent=2)
        )
    if a.part in ("split", "both"):
        out["split"] = part_split(a)
        print("gRPC split vs embedded:", json.dumps(out["split"]["summary"], indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
