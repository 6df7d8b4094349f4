"""Plain greedy decoding: DraftGate's engine vs transformers generate() (and llama.cpp), each in its own warm process.

Why separate processes: two libraries' thread pools in one process slow each other down (measured:
in one process transformers ran at 0.6x of its own speed next to our engine, which turned a 0.62x
into a reported 1.09x). Here each system runs in a worker process of its own that loads the model
and warms up once; the parent sends every worker the same prompt token ids, one request at a time,
alternating the order of the workers each round, so a drifting shared machine hits all alike.

Reported per system: decode ms/token (time after the first token / tokens after it), end-to-end
tokens/s (prefill included), the output tokens compared with ours, and the fp32 bandwidth floor:
bytes of weights read per token / this machine's measured read bandwidth (also in its own process).

    .venv/bin/python benchmarks/plain_vs_hf.py --rounds 3 --max-new-tokens 48
    .venv/bin/python benchmarks/plain_vs_hf.py --systems ours,ours-torch,hf   # + PyTorch kernels
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

# Held-out prompts: none of them is in the project's data files or tests.
PROMPTS = [
    "Summarize in two sentences: The city council voted on Tuesday to convert the old rail yard into a public park "
    "with a community garden, a skate area and a small amphitheater. Construction starts next spring and is "
    "funded by a state grant and private donations.",
    "Read the passage and answer the question. Passage: Honeybees communicate the location of food through a "
    "waggle dance whose angle encodes direction relative to the sun and whose duration encodes distance. "
    "Question: What does the duration of the dance tell other bees?",
    "Write a haiku about a train station at night.",
    "Give three tips for keeping a sourdough starter healthy.",
    "Translate to French: The museum opens at nine and closes at six on weekdays.",
    "Explain the difference between a list and a tuple in Python to a beginner.",
    "Change the variable name `tmp` to `buffer` in this code and return it:\n"
    "def read(path):\n    tmp = []\n    for line in open(path):\n        tmp.append(line.strip())\n    return tmp",
    "What are the main causes of ocean tides?",
]


# ---------------------------------------------------------------------------------------------- workers


def _worker_ours(a: argparse.Namespace, kernels: str) -> Any:
    from draftgate.engine import DrafterKind, EngineConfig, build_engine
    from draftgate.models.runner import Kernels
    from draftgate.paths import default_cache_dir
    from draftgate.types import SamplingParams

    engine = build_engine(
        EngineConfig(drafter=DrafterKind.NONE, kernels=Kernels(kernels), dtype=a.dtype, cache_dir=default_cache_dir())
    ).start()

    def run(ids: list[int], n: int) -> dict[str, Any]:
        c = engine.complete(ids, SamplingParams(max_new_tokens=n, ignore_eos=True))
        return {"tokens": c.token_ids, "elapsed_s": c.elapsed_s, "first_token_s": c.first_token_s}

    return run


def _worker_hf(a: argparse.Namespace) -> Any:
    import torch

    sys.path.insert(0, "tests")
    from conftest import (
        build_hf_reference,  # transformers' LlamaForCausalLM with our (bitwise GGUF) weights
    )
    from draftgate.models.loader import load_model
    from draftgate.paths import default_cache_dir

    hf = build_hf_reference(load_model("smollm2-135m", cache_dir=default_cache_dir()))
    hf = hf.to(getattr(torch, a.dtype))

    def gen(x: torch.Tensor, n: int) -> torch.Tensor:
        with torch.inference_mode():
            return hf.generate(x, max_new_tokens=n, min_new_tokens=n, do_sample=False)

    def run(ids: list[int], n: int) -> dict[str, Any]:
        x = torch.tensor([ids])
        t0 = time.perf_counter()
        gen(x, 1)  # the prefill alone: its time is the time to the first token
        t1 = time.perf_counter()
        out = gen(x, n)
        t2 = time.perf_counter()
        return {"tokens": out[0, len(ids) :].tolist(), "elapsed_s": t2 - t1, "first_token_s": t1 - t0}

    return run


def _worker_llamacpp(a: argparse.Namespace) -> Any:
    from llama_cpp import Llama

    from draftgate.models.loader import resolve_model_path

    llm = Llama(model_path=str(resolve_model_path("smollm2-135m")), n_ctx=2048, n_threads=a.threads, verbose=False)

    def run(ids: list[int], n: int) -> dict[str, Any]:
        out: list[int] = []
        t0 = time.perf_counter()
        first = 0.0
        for tok in llm.generate(ids, top_k=1, top_p=1.0, temp=0.0, repeat_penalty=1.0, reset=True):
            if not out:
                first = time.perf_counter() - t0
            out.append(int(tok))
            if len(out) == n:
                break
        return {"tokens": out, "elapsed_s": time.perf_counter() - t0, "first_token_s": first}

    return run


def _worker_bandwidth() -> dict[str, float]:
    """GB/s reading a 1 GiB fp32 matrix: torch.mv (the decode access pattern) and a plain sum."""
    import torch

    a = torch.randn(16384, 16384)
    x = torch.randn(16384)
    out = {}
    for name, f in (("mv", lambda: torch.mv(a, x)), ("sum", lambda: a.sum())):
        f()
        ts = []
        for _ in range(7):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
        out[name] = a.numel() * 4 / statistics.median(ts) / 1e9
    return out


def worker(a: argparse.Namespace) -> int:
    import torch

    torch.set_num_threads(a.threads)
    if a.worker == "bandwidth":
        print(json.dumps(_worker_bandwidth()), flush=True)
        return 0
    run = {
        "ours": lambda: _worker_ours(a, "auto"),
        "ours-torch": lambda: _worker_ours(a, "torch"),
        "hf": lambda: _worker_hf(a),
        "llamacpp": lambda: _worker_llamacpp(a),
    }[a.worker]()
    run(list(range(10, 60)), 8)  # warm-up
    print(json.dumps({"ready": True}), flush=True)
    for line in sys.stdin:
        req = json.loads(line)
        print(json.dumps(run(req["ids"], req["n"])), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------- parent


class Worker:
    def __init__(self, system: str, threads: int, dtype: str) -> None:
        cmd = [sys.executable, __file__, "--worker", system, "--threads", str(threads), "--dtype", dtype]
        self.system = system
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = self._read()
        assert ready.get("ready"), ready

    def _read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"worker {self.system} died (exit {self.proc.wait()})")
        return json.loads(line)

    def run(self, ids: list[int], n: int) -> dict[str, Any]:
        assert self.proc.stdin is not None
        self.proc.stdin.write(json.dumps({"ids": ids, "n": n}) + "\n")
        self.proc.stdin.flush()
        return self._read()

    def close(self) -> None:
        if self.proc.stdin:
            self.proc.stdin.close()
        self.proc.wait(timeout=60)


def _available(system: str) -> bool:
    if system != "llamacpp":
        return True
    import importlib.util

    return importlib.util.find_spec("llama_cpp") is not None


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--systems", default="ours,hf,llamacpp", help="ours, ours-torch, hf, llamacpp (skipped if not installed)"
    )
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16"],
        help="weights of ours and transformers (llama.cpp runs its Q4_1 GGUF either way)",
    )
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.worker:
        return worker(a)

    from draftgate.models.loader import load_model_info

    info = load_model_info("smollm2-135m")
    tok = info.tokenizer
    prompts = [tok.encode_chat([{"role": "user", "content": p}]) for p in PROMPTS]
    systems = [s for s in a.systems.split(",") if _available(s)]
    print(f"starting {', '.join(systems)} (one warm process each) ...", file=sys.stderr, flush=True)
    workers = [Worker(s, a.threads, a.dtype) for s in systems]
    results: dict[str, list[dict[str, Any]]] = {s: [] for s in systems}
    for r in range(a.rounds):
        order = workers if r % 2 == 0 else workers[::-1]
        for i, ids in enumerate(prompts):
            for w in order if i % 2 == 0 else order[::-1]:
                res = w.run(ids, a.max_new_tokens)
                res["prompt"] = i
                results[w.system].append(res)
        print(f"round {r + 1}/{a.rounds} done", file=sys.stderr, flush=True)
    for w in workers:
        w.close()
    bw = json.loads(
        subprocess.run(
            [sys.executable, __file__, "--worker", "bandwidth", "--threads", str(a.threads)],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    from draftgate.models.loader import resolve_model_path

    nbytes = {s: info.config.num_params * (4 if a.dtype == "float32" else 2) for s in systems}
    if "llamacpp" in nbytes:  # it reads its quantized GGUF tensors
        nbytes["llamacpp"] = resolve_model_path("smollm2-135m").stat().st_size
    report(results, nbytes, bw, a)
    return 0


def report(
    results: dict[str, list[dict[str, Any]]], nbytes: dict[str, int], bw: dict[str, float], a: argparse.Namespace
) -> None:
    def decode_ms(r: dict[str, Any]) -> float:
        return (r["elapsed_s"] - r["first_token_s"]) / (len(r["tokens"]) - 1) * 1e3

    stats = {}
    for s, rs in results.items():
        stats[s] = {
            "decode_ms": statistics.median(decode_ms(r) for r in rs),
            "e2e_tps": sum(len(r["tokens"]) for r in rs) / sum(r["elapsed_s"] for r in rs),
            "ttft_ms": statistics.median(r["first_token_s"] for r in rs) * 1e3,
        }
    ours = {r["prompt"]: r["tokens"] for r in results.get("ours", [])}
    best_bw = max(bw.values())
    floor = {s: n / (best_bw * 1e9) * 1e3 for s, n in nbytes.items()}  # ms/token reading each system's weights
    base = stats.get("hf")
    names = {
        "ours": "DraftGate plain (native kernels)",
        "ours-torch": "DraftGate plain (--kernels torch)",
        "hf": "transformers generate()",
        "llamacpp": "llama.cpp (Q4_1 GGUF)",
    }
    n_req = len(next(iter(results.values())))
    print(
        f"\n{len(PROMPTS)} held-out prompts x {a.rounds} rounds, greedy, {a.dtype}, {a.max_new_tokens} new tokens, "
        f"{a.threads} threads, each system in its own warm process ({n_req} requests each)\n"
    )
    print(
        "| system | decode ms/token | decode speed vs transformers | end-to-end tok/s | e2e vs transformers "
        "| TTFT p50 ms | same tokens as ours | x its bandwidth floor |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for s, st in stats.items():
        same = sum(r["tokens"] == ours.get(r["prompt"]) for r in results[s]) if ours else 0
        vs = f"{base['decode_ms'] / st['decode_ms']:.2f}x" if base else "-"
        vs_e2e = f"{st['e2e_tps'] / base['e2e_tps']:.2f}x" if base else "-"
        print(
            f"| {names[s]} | {st['decode_ms']:.1f} | {vs} | {st['e2e_tps']:.1f} | {vs_e2e} | {st['ttft_ms']:.0f} "
            f"| {same}/{len(results[s])} | {st['decode_ms'] / floor[s]:.2f} ({floor[s]:.1f} ms) |"
        )
    sizes = ", ".join(f"{names[s]} {n / 1e6:.0f} MB" for s, n in nbytes.items())
    print(
        f"\nweights read per token: {sizes}; read bandwidth (1 GiB, own process): mv {bw['mv']:.1f} GB/s, "
        f"sum {bw['sum']:.1f} GB/s; floor = bytes / the better of the two"
    )


if __name__ == "__main__":
    sys.exit(main())
