"""`sweep-k`: which drafter and K to run per category, from a benchmark report.

The sweep is an ordinary benchmark over the arms ``plain``, ``D:k=K`` for every
drafter D and K, and ``D:k=auto``; this module builds those arms and reads the
report into one recommendation per category and load level:

- arms that failed the lossless check, or had errors, are never recommended;
- the arm with the best median speedup wins; when that is below
  ``min_speedup`` speculation is disabled for the route (plain decoding);
- when the adaptive K of the winning drafter is within ``auto_tolerance`` of the
  best fixed K, ``auto`` is recommended (it also adapts to load and content).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from draftgate.bench.arms import ArmKind, ArmSpec, parse_arm
from draftgate.bench.stats import group_by

__all__ = ["sweep_arms", "recommend", "format_recommendations"]


def sweep_arms(drafters: Sequence[str], ks: Sequence[int], include_auto: bool = True) -> tuple[ArmSpec, ...]:
    specs = [parse_arm("plain")]
    for d in drafters:
        if d == "plain":
            continue
        specs += [parse_arm(f"{d}:k={k}") for k in ks]
        if include_auto:
            specs.append(parse_arm(f"{d}:k=auto"))
    if any(s.kind != ArmKind.ENGINE for s in specs):
        raise ValueError("sweep-k drafters must be engine drafters (ngram, suffix, auto, model, quant)")
    return tuple(specs)


def recommend(report: dict[str, Any], min_speedup: float = 1.05, auto_tolerance: float = 0.03) -> list[dict[str, Any]]:
    """One recommendation per (load, category) of the report (see the module docstring)."""
    base = report["meta"]["baseline"]
    lossy = {a for a, e in report["lossless"].get("arms", {}).items() if e["mismatches"]}
    out = []
    for (load, cat), rows in group_by(report["results"], lambda r: (r["load"], r["category"])).items():
        cands = [
            r
            for r in rows
            if r["arm"] != base
            and r["arm"] not in lossy
            and not r["errors"]
            and r["speedup"]["median"] is not None
            and not math.isnan(r["speedup"]["median"])
        ]
        rec: dict[str, Any] = {"load": load, "category": cat, "enable": False, "drafter": "none", "k": 0}
        if not cands:
            out.append({**rec, "expected_speedup": None, "arm": base, "reason": "no lossless candidate measured"})
            continue
        best = max(cands, key=lambda r: r["speedup"]["median"])
        spec = parse_arm(best["arm"])
        if best["speedup"]["median"] < min_speedup:
            reason = f"best arm {best['arm']} gave {best['speedup']['median']:.2f}x < {min_speedup:.2f}x"
            out.append({**rec, "expected_speedup": 1.0, "arm": base, "reason": reason})
            continue
        assert spec.drafter is not None
        auto = next((r for r in cands if r["arm"] == f"{spec.drafter.value}:k=auto"), None)
        if auto is not None and auto["speedup"]["median"] >= best["speedup"]["median"] * (1 - auto_tolerance):
            best, k, reason = auto, "auto", "adaptive K within tolerance of the best fixed K"
        else:
            k, reason = spec.k if spec.k is not None else "auto", "best median speedup"
        out.append(
            {
                **rec,
                "enable": True,
                "drafter": spec.drafter.value,
                "k": k,
                "expected_speedup": best["speedup"]["median"],
                "speedup_range": [best["speedup"]["min"], best["speedup"]["max"]],
                "acceptance_rate": best["acceptance_rate"],
                "mean_accepted_length": best["mean_accepted_length"],
                "arm": best["arm"],
                "reason": reason,
            }
        )
    return out


def format_recommendations(recs: Sequence[dict[str, Any]]) -> str:
    head = "| load | category | enable | drafter | K | expected speedup | acceptance | why |"
    lines = [head, "|---|---|---|---|---|---:|---:|---|"]
    for r in recs:
        sp = r["expected_speedup"]
        acc = r.get("acceptance_rate")
        lines.append(
            f"| {r['load']} | {r['category']} | {'yes' if r['enable'] else 'no'} | {r['drafter']} | {r['k']} | "
            f"{'–' if sp is None else f'{sp:.2f}x'} | {'–' if acc is None else f'{acc:.2f}'} | {r['reason']} |"
        )
    return "\n".join(lines)
