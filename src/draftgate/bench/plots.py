"""PNG plots of a benchmark report (matplotlib, Agg backend: no display needed).

- ``speedup_by_category.png``: median speedup per category and arm (bars), min-max over runs (whiskers);
- ``itl_distribution.png``: the empirical CDF of inter-token latency per arm, all categories;
- ``throughput_vs_concurrency.png``: total tokens/s per arm at each load level, all categories.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from draftgate.bench.runner import BenchResult
from draftgate.bench.stats import ALL, group_by

__all__ = ["write_plots"]


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        from draftgate.bench.arms import ArmError

        raise ArmError("plots need matplotlib: pip install 'draftgate[bench]' (or pass --no-plots)") from None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def write_plots(report: dict[str, Any], result: BenchResult, out: Path) -> list[Path]:
    plt = _pyplot()
    files = [
        _speedup(plt, report, out / "speedup_by_category.png"),
        _itl(plt, report, result, out / "itl_distribution.png"),
        _throughput(plt, report, out / "throughput_vs_concurrency.png"),
    ]
    return files


def _nan(x: float | None) -> float:
    return math.nan if x is None else x


def _speedup(plt: Any, report: dict[str, Any], path: Path) -> Path:
    base = report["meta"]["baseline"]
    by_load = group_by([r for r in report["results"] if r["arm"] != base], lambda r: r["load"])
    n = max(1, len(by_load))
    fig, axes = plt.subplots(1, n, figsize=(max(6, 2 + 1.6 * len(report["meta"]["categories"])) * n, 4), squeeze=False)
    for ax, (load, rows) in zip(axes[0], by_load.items(), strict=False):
        cats = list(dict.fromkeys(r["category"] for r in rows))
        arms = list(dict.fromkeys(r["arm"] for r in rows))
        width = 0.8 / max(1, len(arms))
        for j, arm in enumerate(arms):
            sel = {r["category"]: r["speedup"] for r in rows if r["arm"] == arm}
            med = [_nan(sel.get(c, {}).get("median")) for c in cats]
            lo = [m - _nan(sel.get(c, {}).get("min")) for c, m in zip(cats, med, strict=True)]
            hi = [_nan(sel.get(c, {}).get("max")) - m for c, m in zip(cats, med, strict=True)]
            xs = [i + (j - (len(arms) - 1) / 2) * width for i in range(len(cats))]
            ax.bar(xs, med, width, yerr=[lo, hi], capsize=2, label=arm)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks(range(len(cats)), cats, rotation=30, ha="right")
        ax.set_ylabel(f"speedup vs {base}")
        ax.set_title(load)
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _itl(plt: Any, report: dict[str, Any], result: BenchResult, path: Path) -> Path:
    loads = report["meta"]["loads"]
    fig, axes = plt.subplots(1, len(loads), figsize=(6 * len(loads), 4), squeeze=False)
    for ax, load in zip(axes[0], loads, strict=True):
        by_arm = group_by([r for r in result.requests if r.load == load and r.error is None], lambda r: r.arm)
        for arm, rs in by_arm.items():
            xs = sorted(x * 1e3 for r in rs for x in r.itl_s if x > 0)
            if xs:
                ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", label=arm)
        ax.set_xscale("log")
        ax.set_xlabel("inter-token latency (ms, log scale)")
        ax.set_ylabel("fraction of tokens")
        ax.set_title(f"ITL CDF, {load}")
        ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _throughput(plt: Any, report: dict[str, Any], path: Path) -> Path:
    loads = report["meta"]["loads"]
    rows = [r for r in report["results"] if r["category"] == ALL]
    fig, ax = plt.subplots(figsize=(6, 4))
    for arm, rs in group_by(rows, lambda r: r["arm"]).items():
        tps = {r["load"]: _nan(r["total_tps"]) for r in rs}
        ax.plot(range(len(loads)), [tps.get(ld, math.nan) for ld in loads], marker="o", label=arm)
    ax.set_xticks(range(len(loads)), loads)
    ax.set_xlabel("load (c = concurrent streams)")
    ax.set_ylabel("total tokens/s (all categories)")
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
