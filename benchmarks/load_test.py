"""Load test: many concurrent streaming OpenAI clients against an in-process gateway (loopback only).

Bounded in count and time: ``--requests`` in all, ``--concurrency`` at once, stopping early
after ``--max-seconds``. Reports errors, throughput, TTFT and end-to-end latency
percentiles, and this process's resident memory before and after (the gateway runs in
it, so a leak shows up here).

    .venv/bin/python benchmarks/load_test.py --tiny --requests 40 --concurrency 8      # smoke
    .venv/bin/python benchmarks/load_test.py --requests 200 --concurrency 16 --max-tokens 64
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import socket
import statistics
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import uvicorn

from draftgate.engine import DrafterKind, EngineConfig, build_engine
from draftgate.models.loader import load_model
from draftgate.server import AuthConfig, Route, RouteTable, create_app

KEY = "sk-loadtest-0123456789"
PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number.",
    "Repeat after me: the quick brown fox jumps over the lazy dog. The quick brown fox",
    "List the days of the week, one per line.",
    "Explain what a hash map is in two sentences.",
]


def rss_mib() -> float:
    """Resident memory of this process (VmRSS), MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    try:
        import psutil

        return psutil.Process().memory_info().rss / 2**20
    except ImportError:
        return float("nan")


def tiny_model_dir() -> Path:
    """A tiny random Llama with a word-level tokenizer (for smoke runs without the bundled model)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    folder = Path(tempfile.mkdtemp(prefix="draftgate-load-"))
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        max_position_embeddings=512,
        bos_token_id=1,
        eos_token_id=2,
        tie_word_embeddings=False,
    )
    transformers.LlamaForCausalLM(cfg).float().save_pretrained(folder, safe_serialization=True)
    words = ["<pad>", "<s>", "</s>", "<unk>"] + [chr(c) for c in range(33, 127)]
    vocab = {w: i for i, w in enumerate(words[:96])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", behavior="isolated")
    tok.add_special_tokens(["<pad>", "<s>", "</s>"])
    tok.save(str(folder / "tokenizer.json"))
    template = (
        "{% for m in messages %}{{ bos_token }}{{ m['role'] }}:{{ m['content'] }}{{ eos_token }}{% endfor %}"
        "{% if add_generation_prompt %}{{ bos_token }}assistant:{% endif %}"
    )
    tcfg = {"bos_token": "<s>", "eos_token": "</s>", "pad_token": "<pad>", "chat_template": template}
    (folder / "tokenizer_config.json").write_text(json.dumps(tcfg))
    return folder


class Server:
    """uvicorn on a free 127.0.0.1 port, in a thread of this process."""

    def __init__(self, app: object) -> None:
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.bind(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="on"))  # type: ignore[arg-type]
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self) -> Server:
        self.thread.start()
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("the gateway never answered /health")
            time.sleep(0.05)

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)
        self.sock.close()


@dataclass
class Result:
    ok: bool
    error: str = ""
    ttft_s: float = 0.0
    e2e_s: float = 0.0
    tokens: int = 0


async def one(client: object, model: str, prompt: str, max_tokens: int) -> Result:
    t0 = time.perf_counter()
    ttft, tokens = 0.0, 0
    try:
        stream = await client.chat.completions.create(  # type: ignore[attr-defined]
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content and not ttft:
                ttft = time.perf_counter() - t0
            if chunk.usage is not None:
                tokens = chunk.usage.completion_tokens
    except Exception as e:  # counted and reported, never fatal to the run
        return Result(False, f"{type(e).__name__}: {e}"[:200])
    return Result(True, ttft_s=ttft, e2e_s=time.perf_counter() - t0, tokens=tokens)


async def drive(
    url: str, model: str, n: int, concurrency: int, max_tokens: int, max_s: float
) -> tuple[list[Result], float]:
    import openai

    client = openai.AsyncOpenAI(base_url=url + "/v1", api_key=KEY, max_retries=0, timeout=120)
    sem = asyncio.Semaphore(concurrency)
    deadline = time.monotonic() + max_s
    results: list[Result] = []

    async def task(i: int) -> None:
        async with sem:
            if time.monotonic() > deadline:
                return  # the time budget is spent: not started, not counted
            results.append(await one(client, model, PROMPTS[i % len(PROMPTS)], max_tokens))

    t0 = time.perf_counter()
    await asyncio.gather(*(task(i) for i in range(n)))
    elapsed = time.perf_counter() - t0
    await client.close()
    return results, elapsed


def pct(xs: list[float], q: float) -> float:
    if not xs:
        return float("nan")
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tiny", action="store_true", help="a tiny random model instead of smollm2-135m")
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--drafter", default="auto", choices=[d.value for d in DrafterKind])
    ap.add_argument("--requests", type=int, default=40)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-seconds", type=float, default=120.0, help="stop starting requests after this")
    ap.add_argument("--max-batch", type=int, default=16)
    ap.add_argument(
        "--passes",
        type=int,
        default=1,
        help="run the measured load this many times in one process; RSS after each (a leak keeps growing)",
    )
    ap.add_argument("--json", type=Path, help="also write the report here")
    a = ap.parse_args(argv)
    if not (
        1 <= a.requests <= 10_000 and 1 <= a.concurrency <= 512 and 1 <= a.max_tokens <= 4096 and 1 <= a.passes <= 20
    ):
        print("error: --requests 1..10000, --concurrency 1..512, --max-tokens 1..4096, --passes 1..20", file=sys.stderr)
        return 2

    loaded = load_model(str(tiny_model_dir()) if a.tiny else a.model)
    cfg = EngineConfig(drafter=DrafterKind(a.drafter), max_batch=a.max_batch, max_queue=max(256, a.requests))
    engine = build_engine(cfg, loaded=loaded)
    routes = RouteTable.of([Route("load", engine, model="tiny" if a.tiny else a.model)])
    app = create_app(routes, AuthConfig(api_keys=frozenset({KEY})))
    try:
        with Server(app) as srv:
            asyncio.run(drive(srv.url, "load", min(4, a.requests), a.concurrency, 4, 60))  # warm-up
            gc.collect()
            rss0 = rss_mib()
            results: list[Result] = []
            elapsed = 0.0
            rss_after: list[float] = []
            for _ in range(a.passes):
                res, el = asyncio.run(drive(srv.url, "load", a.requests, a.concurrency, a.max_tokens, a.max_seconds))
                results += res
                elapsed += el
                gc.collect()
                rss_after.append(round(rss_mib(), 1))
            rss1 = rss_after[-1]
            kv = engine.kv_stats()
    finally:
        routes.close()
    ok = [r for r in results if r.ok]
    errors = [r.error for r in results if not r.ok]
    tokens = sum(r.tokens for r in ok)
    report = {
        "model": "tiny" if a.tiny else a.model,
        "drafter": a.drafter,
        "passes": a.passes,
        "requests": len(results),
        "skipped_by_time_budget": a.requests * a.passes - len(results),
        "concurrency": a.concurrency,
        "errors": len(errors),
        "error_samples": errors[:5],
        "elapsed_s": round(elapsed, 3),
        "requests_per_s": round(len(ok) / elapsed, 2) if elapsed else 0.0,
        "completion_tokens_per_s": round(tokens / elapsed, 1) if elapsed else 0.0,
        "latency_p50_s": round(pct([r.e2e_s for r in ok], 0.50), 4),
        "latency_p99_s": round(pct([r.e2e_s for r in ok], 0.99), 4),
        "ttft_p50_s": round(pct([r.ttft_s for r in ok if r.ttft_s], 0.50), 4),
        "ttft_p99_s": round(pct([r.ttft_s for r in ok if r.ttft_s], 0.99), 4),
        "mean_completion_tokens": round(statistics.mean([r.tokens for r in ok]), 1) if ok else 0.0,
        "rss_before_mib": round(rss0, 1),
        "rss_after_mib": round(rss1, 1),
        "rss_after_each_pass_mib": rss_after,
        "kv_blocks_used_after": kv.get("used_blocks", 0),
        "kv_blocks_cached_after": kv.get("cached_blocks", 0),  # prefix cache (reusable, evictable)
        "kv_sequences_after": kv.get("sequences", 0),
    }
    for k, v in report.items():
        print(f"{k:>26}: {v}")
    if a.json:
        a.json.write_text(json.dumps(report, indent=2) + "\n")
    return 0 if not errors else 1


if __name__ == "__main__":
    sys.exit(main())
