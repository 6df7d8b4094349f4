"""Load time, peak memory, ms/token and pass cost at real sizes: DraftGate's engine against llama-server.

On one GGUF file (a named model, or a random-weight file at a real shape from
``python -m draftgate.bench.real_shapes SHAPE``), each system in its own process, one at a time,
--reps times interleaved, medians reported:

- DraftGate: a fresh process loads the model and builds its runner (``load s``: the GGUF parsed, its
  blocks repacked into the native kernels' tiles, the KV cache allocated), prefills a 64-token prompt,
  then decodes --tokens tokens one forward of one token each with a greedy pick (``ms/token``: median
  step); its peak RSS (``getrusage``); with --pass-cost, forward(n)/forward(1) at n = 3, 5, 9.
- llama-server: started on the same file with the same threads (``load s``: from the process start to
  its first healthy ``/health``), one ``/completion`` of --tokens tokens with EOS ignored on the same
  prompt ids (``ms/token``: its own ``timings.predicted_per_token_ms``), peak RSS from ``VmHWM``.

Random weights make text meaningless: these files are for memory, time and pass cost only.

    .venv/bin/python benchmarks/studies/real_sizes.py ~/.cache/draftgate/real-shapes/llama-3.2-1b-Q4_K_M-*.gguf
    .venv/bin/python benchmarks/studies/real_sizes.py gemma3-270m --reps 5 --pass-cost
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

PROMPT_LEN = 64
WIDTHS = (1, 3, 5, 9)


def _engine_child(model: str, threads: int, tokens: int, level: str | None, pass_cost: bool) -> None:
    """Runs in the child process: prints one JSON line."""
    t0 = time.perf_counter()
    import torch

    from draftgate.engine.config import DrafterKind, EngineConfig
    from draftgate.engine.factory import build_runner
    from draftgate.models.native_llama import NativeLlama
    from draftgate.models.runner import ForwardItem
    from draftgate.paths import default_cache_dir

    torch.set_num_threads(threads)
    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    cfg = EngineConfig(
        model=model,
        drafter=DrafterKind.NONE,
        num_blocks=64,
        enable_prefix_cache=False,
        cache_dir=default_cache_dir(),
        kernel_level=level,
    ).validate()
    runner = build_runner(cfg)
    load_s = time.perf_counter() - t1
    vocab = runner.config.vocab_size
    prompt = [(7 * i) % (vocab - 200) + 100 for i in range(PROMPT_LEN)]
    out: dict[str, object] = {}

    def engine_thread() -> None:  # the forwards run in a thread of their own, as in Engine
        runner.prefill(1, prompt)
        step = []
        tok = prompt[-1]
        for i in range(tokens + 2):
            t = time.perf_counter()
            logits = runner.forward([ForwardItem(1, [tok], 1)])[0]
            tok = int(logits[-1].argmax())
            if i >= 2:  # two warm-up steps
                step.append(time.perf_counter() - t)
        out["ms_per_token"] = statistics.median(step) * 1e3
        if pass_cost:
            ctx = PROMPT_LEN + tokens + 2
            times: dict[int, list[float]] = {n: [] for n in WIDTHS}
            for _ in range(5):
                for n in WIDTHS:
                    t = time.perf_counter()
                    runner.forward([ForwardItem(1, [tok] * n, n)])
                    times[n].append(time.perf_counter() - t)
                    runner.truncate(1, ctx)
            base = statistics.median(times[1])
            out["pass_cost"] = {str(n): statistics.median(v) / base for n, v in times.items()}
        runner.free(1)

    th = threading.Thread(target=engine_thread, name="draftgate-engine")
    th.start()
    th.join()
    level_used = runner.model.lib.level if isinstance(runner.model, NativeLlama) else "torch"
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    print(json.dumps({"import_s": t_import, "load_s": load_s, "peak_rss": rss, "level": level_used, **out}))


def run_engine(model: str, threads: int, tokens: int, level: str | None, pass_cost: bool) -> dict:
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]); import real_sizes; "
        "real_sizes._engine_child(sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), "
        "sys.argv[5] or None, sys.argv[6] == '1')"
    )
    here = str(Path(__file__).resolve().parent)
    args = [sys.executable, "-c", code, here, model, str(threads), str(tokens), level or "", "1" if pass_cost else "0"]
    proc = subprocess.run(args, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"engine child failed:\n{proc.stderr[-3000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def run_llama_server(path: Path, threads: int, tokens: int, vocab: int) -> dict:
    from draftgate.bench.llama_server import LlamaServer, find_llama_server

    t0 = time.perf_counter()
    server = LlamaServer(find_llama_server(), path, threads=threads, ctx_size=512)
    load_s = time.perf_counter() - t0
    try:
        prompt = [(7 * i) % (vocab - 200) + 100 for i in range(PROMPT_LEN)]
        body = {"prompt": prompt, "n_predict": tokens, "ignore_eos": True, "temperature": 0.0, "cache_prompt": False}
        req = urllib.request.Request(
            f"{server.url}/completion", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=600) as r:
            timings = json.loads(r.read())["timings"]
        status = Path(f"/proc/{server.proc.pid}/status").read_text()
        hwm = next(int(line.split()[1]) * 1024 for line in status.splitlines() if line.startswith("VmHWM:"))
    finally:
        server.close()
    return {"load_s": load_s, "peak_rss": hwm, "ms_per_token": timings["predicted_per_token_ms"]}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", help="a GGUF file or a named model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32, help="decode steps measured (default 32)")
    ap.add_argument("--reps", type=int, default=3, help="interleaved repetitions per system (default 3)")
    ap.add_argument("--level", default=None, help="DraftGate's native kernel level (default: this CPU's best)")
    ap.add_argument("--pass-cost", action="store_true", help="also forward(n)/forward(1) at n = 3, 5, 9")
    ap.add_argument("--no-llama-server", action="store_true", help="DraftGate only")
    a = ap.parse_args()

    from draftgate.models.gguf_file import GGUFFile
    from draftgate.models.gguf_model import gguf_config
    from draftgate.models.loader import resolve_model_path

    path = resolve_model_path(a.model)
    cfg = gguf_config(GGUFFile(path).fields, path)
    size = path.stat().st_size
    print(f"{path.name}: {size / 2**30:.2f} GiB, {cfg.family.name}, {cfg.num_layers} layers, vocab {cfg.vocab_size}")
    rows: dict[str, list[dict]] = {"draftgate": [], "llama-server": []}
    for rep in range(a.reps):
        rows["draftgate"].append(run_engine(str(path), a.threads, a.tokens, a.level, a.pass_cost and rep == 0))
        print(f"rep {rep} draftgate {rows['draftgate'][-1]}", file=sys.stderr)
        if not a.no_llama_server:
            rows["llama-server"].append(run_llama_server(path, a.threads, a.tokens, cfg.vocab_size))
            print(f"rep {rep} llama-server {rows['llama-server'][-1]}", file=sys.stderr)
    print(
        f"\n| system | load s | peak RSS GiB | RSS - file GiB | ms/token | (median of {a.reps}, {a.threads} threads) |"
    )
    print("|---|---:|---:|---:|---:|---|")
    med: dict[str, dict[str, float]] = {}
    for name, rs in rows.items():
        if not rs:
            continue
        m = {k: statistics.median(float(r[k]) for r in rs) for k in ("load_s", "peak_rss", "ms_per_token")}
        med[name] = m
        extra = f"level {rs[0]['level']}" if "level" in rs[0] else ""
        print(
            f"| {name} | {m['load_s']:.2f} | {m['peak_rss'] / 2**30:.2f} | {(m['peak_rss'] - size) / 2**30:+.2f} "
            f"| {m['ms_per_token']:.1f} | {extra} |"
        )
    if len(med) == 2:
        d, ll = med["draftgate"], med["llama-server"]
        print(
            f"\nload time {d['load_s'] / ll['load_s']:.2f}x llama-server's start-up; "
            f"ms/token {d['ms_per_token'] / ll['ms_per_token']:.2f}x llama-server's"
        )
    pc = rows["draftgate"][0].get("pass_cost")
    if pc:
        print("forward(n)/forward(1): " + ", ".join(f"n={n} {v:.2f}" for n, v in pc.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
