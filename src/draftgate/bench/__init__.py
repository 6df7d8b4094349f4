"""Benchmarks: arms run side by side on the same prompts, reported as ratios.

``draftgate bench`` and ``draftgate sweep-k`` (``draftgate.cli.bench``) are thin
wrappers over this package: prompts -> arms -> runner -> report (+ sweep).
"""

from draftgate.bench.arms import ArmError, ArmSpec, build_arms, parse_arm, parse_arms
from draftgate.bench.prompts import BenchPrompt, PromptFileError, load_prompts
from draftgate.bench.report import build_report, write_report
from draftgate.bench.runner import BenchConfig, BenchResult, run_bench
from draftgate.bench.sweep import recommend, sweep_arms

__all__ = [
    "ArmError",
    "ArmSpec",
    "BenchConfig",
    "BenchPrompt",
    "BenchResult",
    "PromptFileError",
    "build_arms",
    "build_report",
    "load_prompts",
    "parse_arm",
    "parse_arms",
    "recommend",
    "run_bench",
    "sweep_arms",
    "write_report",
]
