"""A short live benchmark on the tiny random Llama: report files, documented fields, lossless."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from draftgate.bench import BenchConfig, build_arms, build_report, parse_arms, run_bench, write_report
from draftgate.bench.docs import markers
from draftgate.bench.prompts import load_prompts
from draftgate.engine import EngineConfig
from draftgate.types import SamplingParams

ROW_FIELDS = {
    "arm",
    "category",
    "load",
    "requests",
    "errors",
    "tokens",
    "total_tps",
    "total_tps_per_run",
    "stream_tps",
    "ttft_s",
    "itl_s",
    "e2e_s",
    "acceptance_rate",
    "mean_accepted_length",
    "speedup",
    "decode_speedup",
    "e2e_ratio",
}
DIST_FIELDS = {"p50", "p90", "p99", "mean"}
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def prompt_file(tmp_path: Path) -> Path:
    lines = [
        {"question_id": 1, "category": "echo", "turns": ["hello world the world", "and the hello"]},
        {"question_id": 2, "category": "echo", "turns": ["the an is of and the an is of"]},
        {"prompt": "hello hello world", "category": "chat"},
        {"messages": [{"role": "system", "content": "an"}, {"role": "user", "content": "world of the"}]},
    ]
    f = tmp_path / "prompts.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return f


def run(tiny_model, prompt_file, arms: str, concurrency=(1, 2), **kw):
    specs = parse_arms(arms)
    base = EngineConfig(model="tiny", num_blocks=128, max_batch=4)
    built = build_arms(specs, base, tiny_model)
    params = SamplingParams(max_new_tokens=8, ignore_eos=True)
    cfg = BenchConfig(params, "plain", concurrency, runs=kw.pop("runs", 1), **kw)
    try:
        result = run_bench(built, load_prompts(prompt_file), cfg)
    finally:
        for a in built.values():
            a.close()
    return result, cfg


def test_live_bench_plain_vs_ngram(tiny_model, prompt_file, tmp_path):
    result, cfg = run(tiny_model, prompt_file, "plain,ngram", runs=2)
    meta = {"model": "tiny", "device": "cpu", "prompts": str(prompt_file), "prompts_count": 4}
    report = build_report(result, cfg, meta)
    files = write_report(report, result, tmp_path / "out")
    names = {f.name for f in files}
    assert {
        "report.json",
        "report.md",
        "requests.jsonl",
        "speedup_by_category.png",
        "itl_distribution.png",
        "throughput_vs_concurrency.png",
    } <= names
    assert all(f.stat().st_size > 0 for f in files)

    data = json.loads((tmp_path / "out" / "report.json").read_text())  # strict JSON (no NaN)
    assert data["schema"] == "draftgate.bench/1"
    assert data["meta"]["loads"] == ["c=1", "c=2"] and data["meta"]["arms"] == ["plain", "ngram"]
    assert data["errors"] == []
    # 4 conversations, 5 turns: every turn answered on both arms, at both loads, in both runs
    assert len(result.requests) == 5 * 2 * 2 * 2
    rows = data["results"]
    keys = {(r["arm"], r["category"], r["load"]) for r in rows}
    assert keys == {
        (a, c, ld) for a in ("plain", "ngram") for c in ("echo", "chat", "default", "all") for ld in ("c=1", "c=2")
    }
    for r in rows:
        assert ROW_FIELDS <= set(r)
        assert DIST_FIELDS == set(r["ttft_s"]) == set(r["itl_s"]) == set(r["e2e_s"])
        assert set(r["speedup"]) == {"min", "median", "max"}
        assert r["errors"] == 0 and r["total_tps"] > 0
        assert r["speedup"]["min"] <= r["speedup"]["median"] <= r["speedup"]["max"]
        assert len(r["total_tps_per_run"]) == 2
    all_c1 = {r["arm"]: r for r in rows if r["category"] == "all" and r["load"] == "c=1"}
    assert all_c1["plain"]["tokens"] == all_c1["ngram"]["tokens"] == 5 * 8 * 2  # ignore_eos: 8 per turn
    assert all_c1["plain"]["speedup"]["median"] == 1.0
    assert all_c1["plain"]["mean_accepted_length"] == 1.0  # plain decoding: one token per round
    assert all_c1["ngram"]["mean_accepted_length"] >= 1.0
    # lossless: the speculative arm reproduces plain greedy decoding token for token
    ll = data["lossless"]
    assert ll["checked"] is True
    assert ll["arms"]["ngram"]["compared"] == 5 * 2 * 2 and ll["arms"]["ngram"]["mismatches"] == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "## c=1" in md and "## c=2" in md and "| ngram | 20 | 0 |" in md


def test_live_bench_poisson_and_fixed_k(tiny_model, prompt_file):
    result, cfg = run(tiny_model, prompt_file, "plain,suffix:k=3", concurrency=(1,), rate=50.0)
    report = build_report(result, cfg, {})
    assert report["meta"]["loads"] == ["rate=50"]
    assert report["lossless"]["arms"]["suffix:k=3"]["mismatches"] == 0
    assert {r["load"] for r in report["results"]} == {"rate=50"}


def test_live_peers_hf_match_plain(tiny_model, prompt_file):
    pytest.importorskip("transformers")
    result, cfg = run(tiny_model, prompt_file, "plain,hf,hf-lookup:k=3", concurrency=(1, 2))
    report = build_report(result, cfg, {})
    assert report["errors"] == []
    for arm in ("hf", "hf-lookup:k=3"):
        assert report["lossless"]["arms"][arm]["compared"] == 5
        assert report["lossless"]["arms"][arm]["mismatches"] == 0, report["lossless"]["arms"][arm]
    assert not [r for r in report["results"] if r["arm"] == "hf" and r["load"] == "c=2"]
    assert any("only take part at c=1" in n for n in report["notes"])


def test_cli_bench_and_sweep(tiny_model_dir, prompt_file, tmp_path, capsys):
    from draftgate.cli.main import main

    common = [
        "--model",
        str(tiny_model_dir),
        "--prompts",
        str(prompt_file),
        "--max-new-tokens",
        "8",
        "--runs",
        "1",
        "--kv-blocks",
        "128",
        "--device",
        "cpu",
        "--no-plots",
        "--ignore-eos",
    ]
    doc = tmp_path / "BENCHMARKS.md"  # the real page's markers must work
    doc.write_text((REPO / "docs" / "BENCHMARKS.md").read_text())
    out = tmp_path / "bench"
    bench = [
        "bench",
        "--arms",
        "plain,ngram:k=2",
        "--out",
        str(out),
        "--update-doc",
        str(doc),
        "--doc-section",
        "engine",
    ]
    assert main([*bench, *common]) == 0
    assert (out / "report.json").is_file() and (out / "report.md").is_file()
    assert "ngram:k=2" in capsys.readouterr().out
    text = doc.read_text()
    section = text[text.index(markers("engine")[0]) : text.index(markers("engine")[1])]
    # The page's form: provenance (date, CPU, commit, command), then one row per arm and load.
    assert "`draftgate bench --arms plain,ngram:k=2" in section and "outputs differ from `plain`" in section
    assert "| c=1 | ngram:k=2 |" in section and "decode speedup" in section and "family" in section
    assert "Not measured yet: run command 3" in text

    sweep = tmp_path / "sweep"
    cmd = [
        "sweep-k",
        "--drafters",
        "ngram",
        "--ks",
        "1,2",
        "--out",
        str(sweep),
        "--update-doc",
        str(doc),
        "--doc-section",
        "sweep",
    ]
    assert main([*cmd, *common]) == 0
    assert "Recommended configuration per category" in doc.read_text()
    recs = json.loads((sweep / "sweep.json").read_text())["recommendations"]
    assert {r["category"] for r in recs} == {"echo", "chat", "default", "all"}
    for r in recs:
        assert {"enable", "drafter", "k", "expected_speedup", "reason"} <= set(r)
        assert r["drafter"] in ("none", "ngram") and (r["enable"] or r["k"] == 0)
    assert "per-route configuration" in capsys.readouterr().out


def test_cli_bad_arm_is_a_clear_error(capsys):
    from draftgate.cli.main import main

    assert main(["bench", "--arms", "plain,warp"]) == 2
    assert "unknown arm 'warp'" in capsys.readouterr().err


@pytest.mark.real_model
def test_real_model_auto_is_lossless(real_model, tmp_path):
    f = tmp_path / "p.jsonl"
    f.write_text(
        json.dumps({"prompt": "Repeat exactly: the quick brown fox jumps over the lazy dog.", "category": "echo"})
    )
    specs = parse_arms("plain,auto")
    built = build_arms(specs, EngineConfig(num_blocks=64), real_model)
    try:
        result = run_bench(built, load_prompts(f), BenchConfig(SamplingParams(max_new_tokens=16), "plain"))
    finally:
        for a in built.values():
            a.close()
    report = build_report(result, BenchConfig(SamplingParams(max_new_tokens=16), "plain"), {})
    assert report["errors"] == []
    assert report["lossless"]["arms"]["auto"] == {"compared": 1, "mismatches": 0, "unit": "token", "examples": []}


def test_every_run_starts_from_the_same_drafter_memory(tiny_model, prompt_file):
    """Repeated prompts: run 2 must not draft from run 1's answers (suffix keeps finished outputs)."""
    result, _ = run(tiny_model, prompt_file, "plain,suffix:k=4", concurrency=(1,), runs=2, warmup=False)
    by_run: dict[int, list[tuple[str, int, int, int]]] = {0: [], 1: []}
    for r in result.requests:
        if r.arm == "suffix:k=4":  # a fixed K: the controller's warm costs and pool do not move it
            by_run[r.run].append((r.prompt_id, r.turn, r.draft_tokens, r.accepted_tokens))
    assert by_run[0] and sorted(by_run[0]) == sorted(by_run[1])


def test_suffix_forgets_finished_outputs() -> None:
    from draftgate.drafters import DraftRequest
    from draftgate.drafters.suffix import SuffixDrafter

    d = SuffixDrafter()
    d.observe(1, [1, 2], 0, 0)  # the prompt
    d.observe(1, [1, 2, 5, 6, 7, 8, 9], 0, 0)  # its output
    d.release(1)  # the output goes to the global trie
    req = DraftRequest(2, [3, 5, 6, 7], 2, SamplingParams())
    assert d.propose([req])[0].token_ids == [8, 9] and d.global_tokens > 0
    d.forget()
    assert d.propose([req])[0].token_ids == [] and d.global_tokens == 0
