"""The vLLM comparison's report (``integrations.vllm.tools.compare``): per (arm, category) tallies,
what each arm's passes saw besides throughput, the markdown table and the lines printed under it."""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from draftgate.integrations.vllm.tools.compare_servers import Arm

__all__ = ["GROUPS", "PASSED", "ArmReport", "Tally", "print_reports", "render"]


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


PASSED = "draftgate:vllm_rounds_passed_through_requests_total"


@dataclass
class ArmReport:
    """What one arm's passes saw besides throughput: vLLM's prefix cache during its requests (prompt
    tokens), drafts the gateway scored, the proposer's per-drafter totals."""

    cache_hits: float = 0.0
    cache_queries: float = 0.0
    spec: list[float] = field(default_factory=lambda: [0.0, 0.0, 0.0])  # vLLM's drafts, draft tokens, accepted
    gateway_drafts: int = 0
    passed_through: float = 0.0  # greedy requests the gateway relayed because its rounds did not pay
    drafters: dict[str, dict[str, float]] = field(default_factory=dict)
    remote: list[Any] = field(default_factory=list)

    def add_stats(self, stats: Mapping[str, Any]) -> None:
        for name, d in stats.get("drafters", {}).items():
            mine = self.drafters.setdefault(name, {})
            for key, value in d.items():
                if isinstance(value, int | float):
                    mine[key] = mine.get(key, 0) + value
        if "remote" in stats:
            self.remote.append(stats["remote"])


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


def print_reports(arms: Sequence[Arm], reports: Mapping[str, ArmReport], cost: Mapping[str, float] | None) -> None:
    base = reports.get("vllm")
    prefill = base.cache_queries if base else 0.0  # every conversation's first prompts (salted: new to vLLM)
    for arm in arms:
        r = reports[arm.name]
        if r.cache_queries:
            h, q = r.cache_hits, r.cache_queries
            line = f"{arm.name}: vLLM's prefix cache held {h:.0f} of the {q:.0f} prompt tokens asked for ({h / q:.1%})"
            rest = q - prefill - r.gateway_drafts
            if arm.gateway and rest > 0:
                line += f"; {h / rest:.1%} of those past the first prompts and the {r.gateway_drafts} drafts scored"
            print(line)
        if arm.gateway is not None:
            print(f"{arm.name}: {r.passed_through:.0f} greedy requests relayed untouched: rounds did not pay")
        drafts, drafted, accepted = r.spec
        if drafts:
            print(
                f"{arm.name}: vLLM verified {drafts:.0f} drafts, {drafted / drafts:.1f} tokens each, "
                f"{accepted / drafted:.1%} accepted ({accepted / drafts:.2f} a draft)"
            )
        for name, d in r.drafters.items():
            if d.get("drafted"):
                print(
                    f"{arm.name}: DraftGate {name}: {d['accepted']:.0f}/{d['drafted']:.0f} drafts accepted, "
                    f"{d['rounds']:.0f} rounds"
                )
        for remote in r.remote:
            print(f"{arm.name}: remote tier: {remote}")
    if cost:
        print(
            f"a round on vLLM's token route ({cost['prompt_tokens']} prompt tokens + {cost['k']} drafts): "
            f"{cost['score_ms']:.1f} ms = {cost['score_ms'] / cost['token_ms']:.2f} plain tokens of "
            f"{cost['token_ms']:.1f} ms; any request (max_tokens 1): {cost['request_ms']:.1f} ms"
        )
