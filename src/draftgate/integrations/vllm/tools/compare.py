"""vLLM alone, vLLM's own ``ngram`` and vLLM with DraftGate's proposer, side by side on one machine.

    python -m draftgate.integrations.vllm.tools.compare --vllm-python PY --model HF_FOLDER \\
        --prompts benchmarks/prompts/heldout.jsonl --arms vllm,vllm-ngram,dg-auto

Each kind of server runs in its own vLLM process, all up at once (the others' engine cores still
take CPU on a small machine: compare few arms at a time for the cleanest ratios). Requests go one
arm at a time, the arms' order rotated per prompt, so drift on a shared machine falls on every arm
alike. Greedy; each arm's tokens are checked against vLLM alone (``identical``). Multi-turn prompts
are answered turn by turn, each arm on its own earlier answers. Each conversation carries its own
``cache_salt``: no arm or run reads KV another computed, so every arm pays its own prefill.
Throughput is output tokens over wall time of the requests, per category.

Arms: ``vllm`` (no speculation), ``vllm-ngram`` (vLLM's prompt lookup), ``dg-auto``, ``dg-suffix``,
``dg-ngram``, ``dg-remote`` (DraftGate's proposer, drafter picked per request through
``vllm_xargs``; ``dg-remote`` drafts from a ``draftgate serve-draft --drafter ngram`` worker this
tool starts; ``--draft-delay-ms`` puts a delay proxy between them, ``--prefetch off`` turns the
proposer's precomputation off). ``gw-suffix``, ``gw-auto``, ``gw-ngram``: a DraftGate gateway
(``draftgate serve --target vllm+http://...``, its own process) in front of vLLM alone, started
with ``--enable-scale-out``: the gateway drafts and verifies, vLLM scores its drafts and decodes
its plain stretches; outputs are compared with vLLM alone's as text (the gateway returns no token
ids), and vLLM's prefix-cache hits during each arm's requests are printed. A gateway keeps its
drafters' memory for the whole invocation, so a second run drafts answers it has seen: held-out
figures come from ``--runs 1``. ``gw-none`` (no drafter) isolates the gateway's own cost.
``make demo-vllm`` runs this on the built-in prompts.
"""

from __future__ import annotations

import argparse
import json
import secrets
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from draftgate.bench.prompts import BenchPrompt, builtin_prompts_path, load_prompts
from draftgate.integrations.vllm.tools.compare_servers import Arm, RemoteTier, start_servers
from draftgate.integrations.vllm.tools.launch import SERVED_NAME, VllmEnv
from draftgate.integrations.vllm.tools.probes import prefix_cache, round_cost

__all__ = ["ARMS", "Arm", "main"]


ARMS = {
    a.name: a
    for a in (
        Arm("vllm", "plain", what="vLLM alone"),
        Arm("vllm-ngram", "ngram", what="vLLM's own ngram speculation"),
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


@dataclass
class Tally:
    tokens: int = 0
    seconds: float = 0.0
    requests: int = 0
    identical: int = 0
    compared: int = 0

    @property
    def rate(self) -> float:
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


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


def _url(urls: Mapping[str, str], arm: Arm) -> str:
    return urls[arm.name] if arm.gateway else urls[arm.server]


def _same(a: tuple[Any, str], b: tuple[Any, str]) -> bool:
    """One turn's output equal: token ids where both arms returned them, else text."""
    return a[0] == b[0] if isinstance(a[0], list) and isinstance(b[0], list) else a[1] == b[1]


def run_compare(
    urls: Mapping[str, str],
    arms: Sequence[Arm],
    prompts: Sequence[BenchPrompt],
    runs: int,
    concurrency: int,
    max_tokens: int,
) -> tuple[dict[tuple[str, str], list[Tally]], dict[str, list[float]]]:
    """Tallies per (arm, category) per run, and vLLM's prefix-cache [hits, queries] during each arm's
    requests with the drafts they scored (prompt tokens no cache can hold)."""
    tallies: dict[tuple[str, str], list[Tally]] = defaultdict(lambda: [Tally() for _ in range(runs)])
    outputs: dict[str, dict[str, list[Any]]] = defaultdict(dict)
    cache: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    groups = [list(prompts[i : i + concurrency]) for i in range(0, len(prompts), concurrency)]
    total, done = runs * len(groups) * len(arms), 0
    with httpx.Client(timeout=600) as client, ThreadPoolExecutor(concurrency) as pool:
        for run in range(runs):
            for gi, group in enumerate(groups):
                shift = (run + gi) % len(arms)
                for arm in [*arms[shift:], *arms[:shift]]:
                    h0, q0 = prefix_cache(urls[arm.server])
                    t0 = time.perf_counter()
                    results = list(
                        pool.map(lambda p, a=arm: _conversation(client, _url(urls, a), p, a, max_tokens), group)
                    )
                    wall = time.perf_counter() - t0
                    h1, q1 = prefix_cache(urls[arm.server])
                    cache[arm.name][0] += h1 - h0
                    cache[arm.name][1] += q1 - q0
                    cache[arm.name][2] += sum(r[2] for r in results)
                    for p, (ids, _, _) in zip(group, results, strict=True):
                        t = tallies[(arm.name, p.category)][run]
                        t.tokens += sum(x if isinstance(x, int) else len(x) for x, _ in ids)
                        t.requests += len(ids)
                        t.seconds += wall / len(group)  # the group's wall time, shared by its requests
                        if run == 0:
                            outputs[arm.name][p.id] = ids
                    done += 1
                    print(f"\r{done}/{total} prompt groups", end="", file=sys.stderr, flush=True)
    print(file=sys.stderr)
    base = outputs.get("vllm", {})
    for arm in arms:
        for p in prompts:
            if p.id in base:
                t = tallies[(arm.name, p.category)][0]
                t.compared += 1
                mine = outputs[arm.name][p.id]
                t.identical += int(len(mine) == len(base[p.id]) and all(map(_same, mine, base[p.id])))
    return tallies, cache


# Rows that sum categories of the held-out prompt set: where drafts come from the context, and where they do not.
GROUPS = {"grounded": ("summarization", "rag_qa", "code_edit"), "open": ("open_chat", "writing", "translation", "qa")}


def render(
    tallies: Mapping[tuple[str, str], list[Tally]], arms: Sequence[Arm], categories: Sequence[str], concurrency: int
) -> str:
    """Markdown: output tokens/s per category and arm (median of runs), ratio to vLLM alone, identical outputs."""
    head = "| category | " + " | ".join(a.name for a in arms) + " |"
    lines = [
        f"concurrency {concurrency}; tokens/s (median of runs), x vLLM alone, greedy outputs identical to vLLM alone",
        "",
        head,
        "|" + "---|" * (len(arms) + 1),
    ]
    rows = [(c, [c]) for c in categories]
    rows += [
        (g, [c for c in cats if c in categories]) for g, cats in GROUPS.items() if any(c in categories for c in cats)
    ]
    rows.append(("all", list(categories)))
    for name, cats in rows:
        cells = []
        base = _rate(tallies, "vllm", cats)
        for a in arms:
            rate = _rate(tallies, a.name, cats)
            first = _runs(tallies, a.name, cats)[0]
            ident = f", {first.identical}/{first.compared} same" if a.name != "vllm" and first.compared else ""
            ratio = f" ({rate / base:.2f}x)" if base and a.name != "vllm" else ""
            cells.append(f"{rate:.1f}{ratio}{ident}")
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _runs(tallies: Mapping[tuple[str, str], list[Tally]], arm: str, cats: Sequence[str]) -> list[Tally]:
    per_run = [Tally() for _ in next(iter(tallies.values()))]
    for c in cats:
        for r, t in enumerate(tallies.get((arm, c), [])):
            per_run[r].tokens += t.tokens
            per_run[r].seconds += t.seconds
            per_run[r].identical += t.identical
            per_run[r].compared += t.compared
    return per_run


def _rate(tallies: Mapping[tuple[str, str], list[Tally]], arm: str, cats: Sequence[str]) -> float:
    return statistics.median(t.rate for t in _runs(tallies, arm, cats))


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
    ap.add_argument("--prompts", type=Path, default=None, help="JSONL prompt file (default: the built-in prompts)")
    ap.add_argument("--limit", type=int, default=None, help="at most N prompts")
    ap.add_argument("--arms", default="vllm,vllm-ngram,dg-auto", help="comma-separated arms (default: %(default)s)")
    ap.add_argument(
        "--runs", type=int, default=1, help="passes over the prompts, arms interleaved (default: %(default)s)"
    )
    ap.add_argument("--concurrency", type=int, default=1, help="requests in flight per arm (default: %(default)s)")
    ap.add_argument("--max-tokens", type=int, default=128, help="new tokens per turn (default: %(default)s)")
    ap.add_argument(
        "--k", type=int, default=8, help="DraftGate's largest K, num_speculative_tokens (default: %(default)s)"
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
    prompts = load_prompts(a.prompts or builtin_prompts_path(), limit=a.limit)
    a.out.mkdir(parents=True, exist_ok=True)
    with ExitStack() as stack:
        remote = RemoteTier(a.draft_delay_ms, a.prefetch == "on")
        urls, control = start_servers(stack, VllmEnv(a.vllm_python, a.model), arms, a.k, a.ngram_k, a.out, remote)
        tallies, cache = run_compare(urls, arms, prompts, a.runs, a.concurrency, a.max_tokens)
        cost = None
        if any(x.gateway for x in arms):
            from draftgate.models.loader import load_model_info

            tok = load_model_info(str(a.model)).tokenizer
            longest = max(prompts, key=lambda p: len(p.turns[0]))
            cost = round_cost(urls["plain"], tok.encode_chat(longest.messages(0, [])))
        stats = httpx.get(f"{control}/stats", timeout=10).json() if control else None
    cats = list(dict.fromkeys(p.category for p in prompts))
    table = render(tallies, arms, cats, a.concurrency)
    print(table)
    prefill = cache["vllm"][1] if "vllm" in cache else 0.0  # every conversation's first prompt (salted: new to vLLM)
    for arm in arms:
        h, q, drafted = cache.get(arm.name, (0.0, 0.0, 0.0))
        if q:
            line = f"{arm.name}: vLLM's prefix cache held {h:.0f} of the {q:.0f} prompt tokens asked for ({h / q:.1%})"
            rest = q - prefill - drafted
            if arm.gateway and rest > 0:
                line += f"; {h / rest:.1%} of those past the first prompts and the {drafted:.0f} drafts scored"
            print(line)
    if cost:
        print(
            f"a round on vLLM's token route ({cost['prompt_tokens']} prompt tokens + {cost['k']} drafts): "
            f"{cost['score_ms']:.1f} ms = {cost['score_ms'] / cost['token_ms']:.2f} plain tokens of "
            f"{cost['token_ms']:.1f} ms; any request (max_tokens 1): {cost['request_ms']:.1f} ms"
        )
    if stats:
        for name, s in stats["drafters"].items():
            if s["drafted"]:
                print(f"DraftGate {name}: {s['accepted']}/{s['drafted']} drafts accepted, {s['rounds']} rounds")
        if "remote" in stats:
            print(f"remote tier: {stats['remote']}")
    results = {
        "arms": [a.name for a in arms],
        "runs": a.runs,
        "concurrency": a.concurrency,
        "max_tokens": a.max_tokens,
        "tallies": {f"{arm}/{cat}": [vars(t) for t in ts] for (arm, cat), ts in tallies.items()},
        "proposer": stats,
        "table": table,
        "round_cost": cost,
        "prefix_cache": {k: {"hits": v[0], "queries": v[1], "drafts": v[2]} for k, v in cache.items()},
    }
    (a.out / "results.json").write_text(json.dumps(results, indent=1))
    same = all(t.identical == t.compared for (arm, _), ts in tallies.items() if arm != "vllm" for t in ts[:1])
    print("identical outputs: " + ("yes, every arm" if same else "NO (see the table)"))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
