"""Whether a vLLM release still offers the interface DraftGate's proposer is loaded through, read from its source.

A vLLM that does not install here (the GPU packages pull a CUDA torch) is checked from its wheel
(or an unpacked tree) without importing it. The proposer needs, in that source:

1. ``--speculative-config`` accepting ``"method": "custom_class"`` (``vllm/config/speculative.py``);
2. ``create_custom_proposer`` building the class named by ``model`` with the engine's config and
   requiring a ``propose`` method (``vllm/v1/spec_decode/custom_class_proposer.py``);
3. the model runner's ``custom_class`` branch calling ``propose`` with arguments that bind to
   ``Proposer.propose`` (``vllm/v1/worker/gpu_model_runner.py``);
4. the runner's ``input_batch.req_ids`` and ``requests`` (which request a row is, its options).

    python -m draftgate.integrations.vllm.tools.interface_check vllm-0.34.0-*.whl [more wheels or trees]
"""

from __future__ import annotations

import argparse
import inspect
import re
import sys
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Finding", "check_source", "read_wheel", "read_tree"]

SPEC = "vllm/config/speculative.py"
FACTORY = "vllm/v1/spec_decode/custom_class_proposer.py"
RUNNER = "vllm/v1/worker/gpu_model_runner.py"
BATCH = "vllm/v1/worker/gpu_input_batch.py"
FILES = (SPEC, FACTORY, RUNNER, BATCH)

Reader = Callable[[str], str | None]


@dataclass(frozen=True)
class Finding:
    ok: bool
    what: str  # what holds, or what is missing


def read_wheel(path: Path) -> Reader:
    z = zipfile.ZipFile(path)
    names = set(z.namelist())
    return lambda name: z.read(name).decode() if name in names else None


def read_tree(root: Path) -> Reader:
    """A folder holding ``vllm/`` (an unpacked wheel, or site-packages)."""
    return lambda name: (root / name).read_text() if (root / name).is_file() else None


def _propose_call(runner: str) -> list[str] | None:
    """The arguments of the ``propose`` call in the runner's ``custom_class`` branch (None: no such branch)."""
    m = re.search(r'method == "custom_class":(.{0,600}?)\.propose\((.*?)\)\n', runner, re.S)
    if m is None:
        return None
    return [a.strip() for a in m.group(2).split(",") if a.strip()]


def _binds(args: list[str]) -> bool:
    """Whether the runner's call shape binds to ``Proposer.propose`` (positional, then ``name=...``)."""
    from draftgate.integrations.vllm.inside.proposer import Proposer

    sig = inspect.signature(Proposer.propose)
    positional = [a for a in args if "=" not in a]
    keywords = {a.split("=", 1)[0].strip(): None for a in args if "=" in a}
    try:
        sig.bind(None, *positional, **keywords)
    except TypeError:
        return False
    return True


def check_source(read: Reader) -> list[Finding]:
    """Each requirement of the module docstring, held or not."""
    spec, factory, runner, batch = (read(f) for f in FILES)
    out = [Finding(spec is not None and '"custom_class"' in spec, 'the "custom_class" speculative method')]
    out.append(
        Finding(
            factory is not None and "user_class(vllm_config)" in factory and "propose" in factory,
            "create_custom_proposer(vllm_config) building the class with the engine's config",
        )
    )
    args = _propose_call(runner or "")
    shape = ", ".join(args) if args else "no custom_class branch in the model runner"
    out.append(Finding(args is not None and _binds(args), f"the runner's propose({shape}) binding to Proposer.propose"))
    out.append(
        Finding(
            batch is not None and "self.req_ids" in batch and runner is not None and "self.requests" in runner,
            "the runner's input_batch.req_ids and requests",
        )
    )
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sources", nargs="+", type=Path, help="vLLM wheels, or folders holding vllm/")
    a = ap.parse_args(argv)
    ok = True
    for src in a.sources:
        read = read_wheel(src) if src.suffix == ".whl" else read_tree(src)
        findings = check_source(read)
        good = all(f.ok for f in findings)
        ok &= good
        print(f"{src.name}: {'the proposer interface is there' if good else 'the proposer cannot load'}")
        for f in findings:
            print(f"  {'ok     ' if f.ok else 'MISSING'} {f.what}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
