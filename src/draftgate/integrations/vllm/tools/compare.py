"""vLLM alone, vLLM's own speculation (``ngram``, ``suffix``) and DraftGate inside or in front of
vLLM, side by side on one machine, one vLLM up at a time.

    python -m draftgate.integrations.vllm.tools.compare --vllm-python PY --model HF_FOLDER \\
        --prompts benchmarks/prompts/heldout.jsonl --arms vllm,vllm-suffix,dg-auto --runs 2

Each arm runs in its own vLLM process, started for the arm and stopped after it, with nothing else
up (an idle vLLM's engine core still takes CPU on a small machine): a pass is every prompt through
one arm, and each run passes every arm once, the arms' order reversed on odd runs so drift on a
shared machine falls on every arm alike. Every run starts each arm cold: no arm or run reads
another's KV (each conversation also carries its own ``cache_salt``), and DraftGate's cross-request
memory holds only what the same pass has seen, so every run is a first run. Greedy; each arm's
tokens are checked against vLLM alone's first run (``identical``). Multi-turn prompts are answered
turn by turn, each arm on its own earlier answers. Throughput is output tokens over wall time of
the requests, per category; the table quotes the median of runs.

Arms: ``vllm`` (no speculation), ``vllm-ngram`` (vLLM's prompt lookup), ``vllm-suffix`` (vLLM's
suffix decoding, Arctic Inference's suffix trees; needs ``arctic-inference`` in vLLM's
environment: ``VLLM_SUFFIX=1 scripts/vllm_env.sh``), ``dg-auto``, ``dg-suffix``, ``dg-ngram``,
``dg-remote`` (DraftGate's proposer, drafter picked per request through ``vllm_xargs``;
``dg-remote`` drafts from a ``draftgate serve-draft --drafter ngram`` worker this tool starts;
``--draft-delay-ms`` puts a delay proxy between them, ``--prefetch off`` turns the proposer's
precomputation off). ``gw-suffix``, ``gw-auto``, ``gw-ngram``: a DraftGate gateway (``draftgate
serve --target vllm+http://...``, its own process) in front of vLLM alone started with
``--enable-scale-out``: the gateway drafts and verifies, vLLM scores its drafts and decodes its
plain stretches; outputs are compared with vLLM alone's as text (the gateway returns no token ids),
and vLLM's prefix-cache hits during each arm's requests are printed. ``gw-none`` (no drafter)
isolates the gateway's own cost. ``make demo-vllm`` runs this on the built-in prompts.
"""

from __future__ import annotations

import argparse
import json
import secrets
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

import httpx

from draftgate.bench.prompts import BenchPrompt, builtin_prompts_path, load_prompts
from draftgate.integrations.vllm.tools.compare_report import PASSED, ArmReport, Tally, print_reports, render
from draftgate.integrations.vllm.tools.compare_servers import Arm, ArmServers, RemoteTier, arm_servers
from draftgate.integrations.vllm.tools.launch import SERVED_NAME, VllmEnv
from draftgate.integrations.vllm.tools.probes import counters, prefix_cache, round_cost, spec_decode

__all__ = ["ARMS", "Arm", "Tally", "main", "render"]


ARMS = {
    a.name: a
    for a in (
        Arm("vllm", "plain", what="vLLM alone"),
        Arm("vllm-ngram", "ngram", what="vLLM's own ngram speculation"),
        Arm("vllm-suffix", "suffix", what="vLLM's own suffix decoding (Arctic Inference)"),
        Arm(
            "dg-auto",
            "draftgate",
            {"draftgate_drafter": "auto"},
            "DraftGate auto (suffix + n-gram, goodput controller)",
        ),
        Arm("dg-suffix", "draftgate", {"draftgate_drafter": "suffix"}, "DraftGate suffix store, controller K"),
        Arm("dg-ngram", "draftgate", {"draftgate_drafter": "ngram"}, "DraftGate n-gram lookup, controller K"),
        Arm("dg-remote", "draftgate", {"draftgate_drafter": "remote"}, "DraftGate remote draft worker (n-gram)"),
        *(
            Arm(f"gw-{d}", "plain", what=f"DraftGate gateway, its own rounds ({d}), vLLM alone scoring", gateway=d)
            for d in ("suffix", "auto", "ngram", "none")
        ),
    )
}


def _chat(
    client: httpx.Client, url: str, messages: list[dict[str, str]], arm: Arm, max_tokens: int, salt: str
) -> tuple[list[int] | int, str, float, int]:
    """(token ids, or their count where the server returns none: the gateway), text, seconds, drafts
    scored (the gateway's ``speculative`` stats; 0 elsewhere)."""
    body: dict[str, Any] = {
        "model": SERVED_NAME,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "return_token_ids": True,
        "cache_salt": salt,
    }
    if arm.xargs:
        body["vllm_xargs"] = dict(arm.xargs)
    t0 = time.perf_counter()
    r = client.post(f"{url}/v1/chat/completions", json=body)
    seconds = time.perf_counter() - t0
    r.raise_for_status()
    obj = r.json()
    choice = obj["choices"][0]
    ids = choice.get("token_ids")
    drafted = int((obj.get("speculative") or {}).get("draft_tokens", 0))
    toks = list(ids) if ids is not None else int(obj["usage"]["completion_tokens"])
    return toks, choice["message"]["content"] or "", seconds, drafted


def _conversation(
    client: httpx.Client, url: str, p: BenchPrompt, arm: Arm, max_tokens: int
) -> tuple[list[Any], float, int]:
    """Every turn of ``p``, answered in order on the arm's own answers: (token ids or count, text) per
    turn, seconds, drafts scored."""
    answers: list[str] = []
    ids: list[Any] = []
    total, drafted = 0.0, 0
    salt = secrets.token_urlsafe(16)  # each conversation is new to the server: no arm reads another's KV
    for turn in range(len(p.turns)):
        toks, text, s, d = _chat(client, url, p.messages(turn, answers), arm, max_tokens, salt)
        answers.append(text)
        ids.append((toks, text))
        total += s
        drafted += d
    return ids, total, drafted


def _same(a: tuple[Any, str], b: tuple[Any, str]) -> bool:
    """One turn's output equal: token ids where both arms returned them, else text."""
    return a[0] == b[0] if isinstance(a[0], list) and isinstance(b[0], list) else a[1] == b[1]


def run_compare(
    start: Callable[[Arm], AbstractContextManager[ArmServers]],
    arms: Sequence[Arm],
    prompts: Sequence[BenchPrompt],
    runs: int,
    concurrency: int,
    max_tokens: int,
    after: Callable[[Arm, ArmServers], None] | None = None,
) -> tuple[dict[tuple[str, str], list[Tally]], dict[str, ArmReport]]:
    """Tallies per (arm, category) per run, and each arm's report. ``start(arm)`` brings up the
    arm's servers for one pass; ``after(arm, servers)`` runs at the end of each pass, servers up."""
    tallies: dict[tuple[str, str], list[Tally]] = defaultdict(lambda: [Tally() for _ in range(runs)])
    outputs: dict[tuple[str, int], dict[str, list[Any]]] = defaultdict(dict)
    reports = {arm.name: ArmReport() for arm in arms}
    groups = [list(prompts[i : i + concurrency]) for i in range(0, len(prompts), concurrency)]
    passes = [(run, arm) for run in range(runs) for arm in (arms if run % 2 == 0 else arms[::-1])]
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(concurrency) as pool:
        for done, (run, arm) in enumerate(passes):
            print(f"[{done + 1}/{len(passes)}] run {run + 1}: starting {arm.name} ...", file=sys.stderr, flush=True)
            with start(arm) as srv:
                report = reports[arm.name]
                h0, q0 = prefix_cache(srv.vllm)
                s0 = spec_decode(srv.vllm)
                for gi, group in enumerate(groups):
                    t0 = time.perf_counter()
                    results = list(
                        pool.map(lambda p, a=arm, u=srv.url: _conversation(client, u, p, a, max_tokens), group)
                    )
                    wall = time.perf_counter() - t0
                    report.gateway_drafts += sum(r[2] for r in results)
                    for p, (ids, _, _) in zip(group, results, strict=True):
                        t = tallies[(arm.name, p.category)][run]
                        t.tokens += sum(x if isinstance(x, int) else len(x) for x, _ in ids)
                        t.requests += len(ids)
                        t.seconds += wall / len(group)  # the group's wall time, shared by its requests
                        outputs[(arm.name, run)][p.id] = ids
                    print(f"\r  {gi + 1}/{len(groups)} prompt groups", end="", file=sys.stderr, flush=True)
                print(file=sys.stderr)
                h1, q1 = prefix_cache(srv.vllm)
                report.cache_hits += h1 - h0
                report.cache_queries += q1 - q0
                report.spec = [a + b - c for a, b, c in zip(report.spec, spec_decode(srv.vllm), s0, strict=True)]
                if arm.gateway is not None:
                    report.passed_through += counters(srv.url, [PASSED])[PASSED]
                if srv.control:
                    report.add_stats(httpx.get(f"{srv.control}/stats", timeout=10).json())
                if after is not None:
                    after(arm, srv)
    base = outputs.get(("vllm", 0), {})
    for (name, run), mine in outputs.items():
        for p in prompts:
            if p.id in base and p.id in mine:
                t = tallies[(name, p.category)][run]
                t.compared += 1
                t.identical += int(len(mine[p.id]) == len(base[p.id]) and all(map(_same, mine[p.id], base[p.id])))
    return tallies, reports


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m draftgate.integrations.vllm.tools.compare",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="arms: " + "; ".join(f"{a.name}: {a.what}" for a in ARMS.values()),
    )
    ap.add_argument(
        "--vllm-python", type=Path, required=True, help="python of the vLLM virtualenv (scripts/vllm_env.sh prints it)"
    )
    ap.add_argument(
        "--model", type=Path, required=True, help="the model's Hugging Face folder (scripts/vllm_env.sh prints it)"
    )
    ap.add_argument(
        "--prompts", type=Path, action="append", help="JSONL prompt file, repeatable (default: the built-in prompts)"
    )
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts")
    ap.add_argument("--arms", default="vllm,vllm-ngram,dg-auto", help="comma-separated arms (default: %(default)s)")
    ap.add_argument(
        "--runs",
        type=int,
        default=1,
        help="runs; each passes every arm once, in its own fresh vLLM (default: %(default)s)",
    )
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight per arm (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per turn (default: %(default)s)")
    ap.add_argument(
        "--k",
        type=int,
        default=24,
        help="DraftGate's largest K, num_speculative_tokens (default: %(default)s, vLLM suffix's own default)",
    )
    ap.add_argument("--ngram-k", type=int, default=8, help="K of vLLM's own ngram arm (default: %(default)s)")
    ap.add_argument(
        "--draft-delay-ms",
        type=float,
        default=0.0,
        help="dg-remote: milliseconds added each way between vLLM and the draft worker (a delay proxy; default: none)",
    )
    ap.add_argument(
        "--prefetch",
        choices=("on", "off"),
        default="on",
        help="dg-remote: draft the next round while vLLM verifies (default: %(default)s)",
    )
    ap.add_argument(
        "--out", type=Path, default=Path("vllm-compare"), help="folder for logs and results (default: %(default)s)"
    )
    a = ap.parse_args(argv)
    unknown = [n for n in a.arms.split(",") if n not in ARMS]
    if unknown:
        ap.error(f"unknown arm {unknown[0]!r}; arms are {', '.join(ARMS)}")
    arms = [ARMS[n] for n in a.arms.split(",")]
    if arms[0].name != "vllm" and "vllm" in a.arms.split(","):
        arms.remove(ARMS["vllm"])
        arms.insert(0, ARMS["vllm"])
    prompts = [p for f in a.prompts or [builtin_prompts_path()] for p in load_prompts(f)][: a.limit]
    a.out.mkdir(parents=True, exist_ok=True)
    env, remote = VllmEnv(a.vllm_python, a.model), RemoteTier(a.draft_delay_ms, a.prefetch == "on")
    costs: list[dict[str, float]] = []

    def start(arm: Arm) -> AbstractContextManager[ArmServers]:
        return arm_servers(env, arm, a.k, a.ngram_k, a.out, remote)

    def after(arm: Arm, srv: ArmServers) -> None:
        if arm.gateway is not None and not costs:  # what a round costs on the vLLM behind a gateway, once
            from draftgate.models.loader import load_model_info

            tok = load_model_info(str(a.model)).tokenizer
            longest = max(prompts, key=lambda p: len(p.turns[0]))
            costs.append(round_cost(srv.vllm, tok.encode_chat(longest.messages(0, []))))

    tallies, reports = run_compare(start, arms, prompts, a.runs, a.concurrency, a.max_tokens, after)
    cats = list(dict.fromkeys(p.category for p in prompts))
    table = render(tallies, arms, cats, a.concurrency)
    print(table)
    print_reports(arms, reports, costs[0] if costs else None)
    results = {
        "arms": [a.name for a in arms],
        "runs": a.runs,
        "concurrency": a.concurrency,
        "max_tokens": a.max_tokens,
        "tallies": {f"{arm}/{cat}": [vars(t) for t in ts] for (arm, cat), ts in tallies.items()},
        "reports": {name: vars(r) for name, r in reports.items()},
        "table": table,
        "round_cost": costs[0] if costs else None,
    }
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    same = all(t.identical == t.compared for (arm, _), ts in tallies.items() if arm != "vllm" for t in ts)
    print("identical outputs: " + ("yes, every arm and run" if same else "NO (see the table)"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
