"""The lossless check: under greedy decoding every arm must reproduce the baseline's output.

Requests are matched on (load, run, prompt, turn). Token ids are compared where
both arms report them; otherwise (external servers, llama.cpp) the text is
compared and positions are characters.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from draftgate.bench.stats import RequestRecord
from draftgate.engine.compare import first_difference

__all__ = ["lossless_check"]

MAX_EXAMPLES = 5


def _key(r: RequestRecord) -> tuple[str, int, str, int]:
    return (r.load, r.run, r.prompt_id, r.turn)


def lossless_check(requests: Sequence[RequestRecord], baseline: str) -> dict[str, dict[str, Any]]:
    """Per arm (other than the baseline): compared, mismatches, and the first few differences."""
    base = {_key(r): r for r in requests if r.arm == baseline and r.error is None}
    out: dict[str, dict[str, Any]] = {}
    for r in requests:
        if r.arm == baseline or r.error is not None or _key(r) not in base:
            continue
        b = base[_key(r)]
        entry = out.setdefault(r.arm, {"compared": 0, "mismatches": 0, "unit": "token", "examples": []})
        if b.token_ids is not None and r.token_ids is not None:
            x, y = b.token_ids, r.token_ids
        else:
            x, y, entry["unit"] = b.text, r.text, "char"
        entry["compared"] += 1
        pos = first_difference(x, y)
        if pos is None:
            continue
        entry["mismatches"] += 1
        if len(entry["examples"]) < MAX_EXAMPLES:
            entry["examples"].append(
                {
                    "prompt_id": r.prompt_id,
                    "turn": r.turn,
                    "load": r.load,
                    "run": r.run,
                    "position": pos,
                    "baseline": x[pos] if pos < len(x) else None,
                    "arm": y[pos] if pos < len(y) else None,
                    "baseline_len": len(x),
                    "arm_len": len(y),
                }
            )
    return out
