"""Turn raw benchmark records into the report: ``report.json``, ``report.md``, ``requests.jsonl``, plots.

``report.json`` (schema ``draftgate.bench/1``) has:

- ``meta``: model, device, threads, arms, baseline, loads, runs, sampling, prompt file...
- ``results``: one row per arm x category x load (category ``all`` aggregates all):
  ``requests``, ``errors``, ``tokens``, ``total_tps``, ``total_tps_per_run``,
  ``stream_tps``, ``ttft_s`` / ``itl_s`` / ``e2e_s`` as ``{p50, p90, p99, mean}``,
  ``acceptance_rate``, ``mean_accepted_length`` (null for arms without
  speculation counters), ``speedup`` (end to end, prefill included),
  ``decode_speedup`` (decoding alone) and ``e2e_ratio`` as ``{min, median, max}``
  over runs against the baseline arm;
- ``lossless``: ``{checked, reason, arms: {arm: {compared, mismatches, unit, examples}}}``;
- ``errors`` (the first few failed requests) and ``notes``.

Metric definitions are in :mod:`draftgate.bench.stats`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from draftgate.bench.lossless import lossless_check
from draftgate.bench.runner import BenchConfig, BenchResult
from draftgate.bench.stats import ALL, decode_speedups, group_by, latency_ratios, speedups, summarize_group

__all__ = ["SCHEMA", "build_report", "write_report", "markdown", "summary_table", "doc_summary"]

SCHEMA = "draftgate.bench/1"
MAX_ERRORS = 10


def build_report(result: BenchResult, cfg: BenchConfig, meta: dict[str, Any]) -> dict[str, Any]:
    arms = list(dict.fromkeys([*(w.arm for w in result.windows), cfg.baseline]))
    cats = list(dict.fromkeys(w.category for w in result.windows))
    reqs = group_by(result.requests, lambda r: (r.arm, r.category, r.load))
    wins = group_by(result.windows, lambda w: (w.arm, w.category, w.load))
    rows = []
    for load in [ld.label for ld in cfg.loads()]:
        for cat in [*cats, ALL]:

            def pick(groups: dict[Any, list[Any]], arm: str, cat: str = cat, load: str = load) -> list[Any]:
                keys = [(arm, c, load) for c in (cats if cat == ALL else [cat])]
                return [x for k in keys for x in groups.get(k, [])]

            for arm in arms:
                if not pick(wins, arm):
                    continue
                row = {"arm": arm, "category": cat, "load": load, **summarize_group(pick(reqs, arm), pick(wins, arm))}
                row["speedup"] = speedups(pick(wins, arm), pick(wins, cfg.baseline))
                row["decode_speedup"] = decode_speedups(pick(reqs, arm), pick(reqs, cfg.baseline))
                row["e2e_ratio"] = latency_ratios(pick(reqs, arm), pick(reqs, cfg.baseline))
                rows.append(row)
    greedy = cfg.params.greedy
    return {
        "schema": SCHEMA,
        "meta": {
            **meta,
            "arms": arms,
            "baseline": cfg.baseline,
            "categories": cats,
            "runs": cfg.runs,
            "loads": [ld.label for ld in cfg.loads()],
            "max_new_tokens": cfg.params.max_new_tokens,
            "temperature": cfg.params.temperature,
            "ignore_eos": cfg.params.ignore_eos,
        },
        "results": rows,
        "lossless": {
            "checked": greedy,
            "reason": "greedy: outputs must match the baseline token for token"
            if greedy
            else "sampling: outputs differ by design; use --temperature 0 for the check",
            "arms": lossless_check(result.requests, cfg.baseline) if greedy else {},
        },
        "errors": [f"{r.arm} {r.prompt_id}/{r.turn}: {r.error}" for r in result.requests if r.error][:MAX_ERRORS],
        "notes": list(result.notes),
    }


def _clean(x: Any) -> Any:
    """NaN -> null so the file is strict JSON."""
    if isinstance(x, float) and math.isnan(x):
        return None
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def write_report(report: dict[str, Any], result: BenchResult, out: Path, plots: bool = True) -> list[Path]:
    """Write every output file into ``out``; return their paths."""
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "report.json", out / "report.md", out / "requests.jsonl"]
    files[0].write_text(json.dumps(_clean(report), indent=2) + "\n")
    with files[2].open("w") as f:
        for r in result.requests:
            f.write(json.dumps(_clean(r.__dict__)) + "\n")
    if plots:
        from draftgate.bench.plots import write_plots

        files += write_plots(report, result, out)
    files[1].write_text(markdown(report, [p.name for p in files[3:]]))
    return files


def _f(x: float | None, fmt: str = ".1f", scale: float = 1.0) -> str:
    return "–" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x * scale, fmt)


def _ratio(r: dict[str, float]) -> str:
    if math.isnan(r["median"]):
        return "–"
    return f"{r['median']:.2f}x [{r['min']:.2f}–{r['max']:.2f}]"


def markdown(report: dict[str, Any], plot_files: Sequence[str] = ()) -> str:
    m = report["meta"]
    lines = [
        "# DraftGate benchmark",
        "",
        f"Model `{m.get('model')}` on {m.get('device')} ({m.get('threads')} threads, torch {m.get('torch')}), "
        f"{'greedy' if m['temperature'] == 0 else 'temperature ' + str(m['temperature'])}, "
        f"max_new_tokens {m['max_new_tokens']}{', ignore_eos' if m['ignore_eos'] else ''}, "
        f"{m['runs']} run(s), baseline `{m['baseline']}`, {m.get('prompts_count')} prompts from `{m.get('prompts')}`, "
        f"{m.get('created')}.",
        "",
        "Speedup = total tokens/s of the arm / of the baseline in the same run, arms interleaved; "
        "median [min–max] over runs. ITL per token = gap between chunks / tokens in the chunk.",
        "",
        "## Lossless check",
        "",
    ]
    ll = report["lossless"]
    if not ll["checked"]:
        lines += [f"Not checked ({ll['reason']}).", ""]
    else:
        lines += ["| arm | compared | mismatches | first difference |", "|---|---:|---:|---|"]
        for arm, e in ll["arms"].items():
            ex = e["examples"][0] if e["examples"] else None
            first = (
                f"prompt {ex['prompt_id']} turn {ex['turn']} at {e['unit']} {ex['position']}: "
                f"{ex['baseline']!r} vs {ex['arm']!r}"
                if ex
                else "–"
            )
            lines.append(f"| {arm} | {e['compared']} | {e['mismatches']} | {first} |")
        lines.append("")
    head = (
        "category",
        "arm",
        "tok/s total",
        "tok/s/stream",
        "TTFT p50 ms",
        "ITL p50/p90/p99 ms",
        "e2e p50 s",
        "acceptance",
        "mean acc. len",
        "speedup",
        "decode speedup",
        "e2e ratio",
    )
    for load, rows in group_by(report["results"], lambda r: r["load"]).items():
        lines += [f"## {load}", "", "| " + " | ".join(head) + " |", "|" + "|".join(["---"] * 2 + ["---:"] * 10) + "|"]
        for r in rows:
            itl = r["itl_s"]
            lines.append(
                f"| {r['category']} | {r['arm']} | {_f(r['total_tps'])} | {_f(r['stream_tps'])} | "
                f"{_f(r['ttft_s']['p50'], '.0f', 1e3)} | {_f(itl['p50'], '.1f', 1e3)}/{_f(itl['p90'], '.1f', 1e3)}/"
                f"{_f(itl['p99'], '.1f', 1e3)} | {_f(r['e2e_s']['p50'], '.2f')} | {_f(r['acceptance_rate'], '.2f')} | "
                f"{_f(r['mean_accepted_length'], '.2f')} | {_ratio(r['speedup'])} | {_ratio(r['decode_speedup'])} | "
                f"{_ratio(r['e2e_ratio'])} |"
            )
        lines.append("")
    if report["errors"]:
        lines += ["## Errors", "", *[f"- {e}" for e in report["errors"]], ""]
    if report["notes"]:
        lines += ["## Notes", "", *[f"- {n}" for n in report["notes"]], ""]
    if plot_files:
        lines += ["## Plots", "", *[f"![{Path(p).stem}]({p})" for p in plot_files], ""]
    return "\n".join(lines)


def summary_table(report: dict[str, Any]) -> str:
    """A short Markdown table for the terminal: the `all` rows of every load level, one line per arm."""
    lines = [
        "| load | arm | tok/s | speedup | decode speedup | acceptance | mean acc. len | lossless |",
        "|---|---|---:|---:|---:|---:|---:|---|",
    ]
    ll = report["lossless"]["arms"]
    for r in report["results"]:
        if r["category"] != "all":
            continue
        n_bad = ll[r["arm"]]["mismatches"] if r["arm"] in ll else None
        same = (
            "baseline"
            if r["arm"] == report["meta"]["baseline"]
            else ("n/a" if n_bad is None else "yes" if n_bad == 0 else f"NO ({n_bad})")
        )
        lines.append(
            f"| {r['load']} | {r['arm']} | {_f(r['total_tps'], '.1f')} | {_f(r['speedup']['median'], '.2f')}x | "
            f"{_f(r['decode_speedup']['median'], '.2f')}x | "
            f"{_f(r['acceptance_rate'], '.2f')} | {_f(r['mean_accepted_length'], '.2f')} | {same} |"
        )
    return "\n".join(lines)


def doc_summary(report: dict[str, Any]) -> str:
    """The page's form of a run (``--update-doc``): date, CPU, commit and command, then one row per
    arm and load with both ratios, and each category's end-to-end speedup; the full report stays in --out."""
    m, base = report["meta"], report["meta"]["baseline"]
    ll = report["lossless"]
    bad = sum(e["mismatches"] for e in ll["arms"].values())
    check = (
        f"{bad} of {sum(e['compared'] for e in ll['arms'].values())} outputs differ from `{base}`"
        if ll["checked"]
        else "sampling: no identity check"
    )
    lines = [
        f"*{m['created'][:10]} · {m.get('cpu') or m['machine']} · commit {m.get('commit') or 'unknown'} · "
        f"`{m['command']}`*: {m['prompts_count']} prompts ({m['prompts']}), {m['max_new_tokens']} new tokens, "
        f"{m['runs']} runs, each starting from fresh drafter memory; {check}.",
        "",
        "| load | arm | tok/s | speedup (end to end) | decode speedup | acceptance | tokens a round | "
        + " | ".join(c.replace("_", " ") for c in m["categories"])
        + " |",
        "|---|---|---:|---:|---:|---:|---:|" + "---:|" * len(m["categories"]),
    ]
    by = {(r["load"], r["arm"], r["category"]): r for r in report["results"]}
    for load in m["loads"]:
        for arm in m["arms"]:
            r = by.get((load, arm, "all"))
            if r is None or arm == base:
                continue
            cats = [by.get((load, arm, c)) for c in m["categories"]]
            lines.append(
                f"| {load} | {arm} | {_f(r['total_tps'])} | {_ratio(r['speedup'])} | {_ratio(r['decode_speedup'])} | "
                f"{_f(r['acceptance_rate'], '.2f')} | {_f(r['mean_accepted_length'], '.2f')} | "
                + " | ".join(f"{_f(c['speedup']['median'], '.2f')}x" if c else "–" for c in cats)
                + " |"
            )
    plain = [f"{load} {_f(by[(load, base, 'all')]['total_tps'])}" for load in m["loads"] if (load, base, "all") in by]
    lines += ["", f"`{base}` tok/s: {', '.join(plain)}. Speedups: median [min–max] over runs."]
    return "\n".join(lines)
