"""ProposerCore against a simulated vLLM: rows, outcomes, switches, failures, release."""

from __future__ import annotations

from collections.abc import Sequence

from draftgate.drafters.base import Abilities, Draft, DraftRequest
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter
from draftgate.integrations.vllm.contract import DrafterName
from draftgate.integrations.vllm.inside.rounds import ProposerCore, Row
from draftgate.integrations.vllm.inside.settings import ProposerSettings

# The target's greedy text: a repeated phrase, so lookup drafts pay.
TEXT = [5, 6, 7, 8, 9, 10, 11, 12] * 12


class Failing:
    name, sampled_q, abilities = "ngram", False, Abilities()

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        raise RuntimeError("drafter down")

    def observe(self, *a: object) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


def _core(k: int | None = None, drafters: dict | None = None, **kw: object) -> ProposerCore:  # type: ignore[type-arg]
    s = ProposerSettings(k_max=4, drafter=DrafterName.SUFFIX, k=k, **kw)  # type: ignore[arg-type]
    return ProposerCore(s, drafters or {DrafterName.SUFFIX: SuffixDrafter(), DrafterName.NGRAM: NgramDrafter()})


def _decode(core: ProposerCore, reqs: dict[str, dict], prompt_len: int = 16, steps: int = 40) -> dict[str, list[int]]:  # type: ignore[type-arg]
    """vLLM's loop for greedy requests whose target text is TEXT: verify drafts by matching, emit accepted + 1."""
    hist = {r: TEXT[: prompt_len + 1] for r in reqs}  # prefill sampled the first token
    sampled = dict.fromkeys(reqs, 1)
    drafted: dict[str, list[list[int]]] = {r: [] for r in reqs}
    for _ in range(steps):
        live = [r for r in reqs if len(hist[r]) < len(TEXT) - 6]
        if not live:
            break
        rows = [Row(r, list(hist[r]), sampled[r], reqs[r]) for r in live]
        for r, d in zip(live, core.step(rows), strict=True):
            n = len(hist[r])
            a = 0
            while a < len(d) and d[a] == TEXT[n + a]:
                a += 1
            hist[r] = TEXT[: n + a + 1]
            sampled[r] = a + 1
            drafted[r].append(d)
    core.step([])  # every request left
    return drafted


def test_fixed_k_drafts_and_scores() -> None:
    core = _core(k=3)
    drafted = _decode(core, {"a": None})
    lens = [len(d) for d in drafted["a"]]
    assert max(lens) == 3 and sum(lens) > 0
    s = core.stats["suffix"]
    assert s.drafted == sum(lens) - lens[-1]  # a request's last round is never seen verified: it left
    assert s.accepted == s.drafted  # the text repeats exactly: every lookup draft is right
    assert core.num_requests == 0  # released when they left


def test_adaptive_k_speculates_on_repetitive_text() -> None:
    core = _core()
    drafted = _decode(core, {"a": None})
    assert sum(len(d) for d in drafted["a"]) > 0
    assert any(core.cost.measured(n) for n in range(1, 6))  # steady decode steps were priced (1 + k rows)


def test_switches_turn_drafting_off() -> None:
    core = _core(k=3)
    drafted = _decode(core, {"on": None, "off": {"draftgate_speculate": "off"}})
    assert sum(map(len, drafted["on"])) > 0 and sum(map(len, drafted["off"])) == 0
    assert core.requests_off == 1
    core = _core(k=3)
    core.control.enabled = False
    assert sum(map(len, _decode(core, {"a": None})["a"])) == 0


def test_request_picks_drafter_and_k() -> None:
    core = _core(k=3)
    drafted = _decode(core, {"a": {"draftgate_drafter": "ngram", "draftgate_k": 2}})
    assert max(map(len, drafted["a"])) == 2
    assert core.stats["ngram"].drafted > 0 and core.stats["suffix"].drafted == 0


def test_bad_option_costs_only_its_request() -> None:
    core = _core(k=3)
    drafted = _decode(core, {"bad": {"draftgate_k": "lots"}, "other": {"draftgate_drafter": "remote"}, "ok": None})
    assert sum(map(len, drafted["bad"])) == 0 and sum(map(len, drafted["other"])) == 0  # remote: not configured
    assert sum(map(len, drafted["ok"])) > 0
    assert core.bad_requests == 2


def test_failing_drafter_proposes_nothing_and_never_raises() -> None:
    core = _core(k=3, drafters={DrafterName.SUFFIX: SuffixDrafter(), DrafterName.NGRAM: Failing()})  # type: ignore[dict-item]
    drafted = _decode(core, {"a": {"draftgate_drafter": "ngram"}, "b": None})
    assert sum(map(len, drafted["a"])) == 0 and sum(map(len, drafted["b"])) > 0
    assert core.stats["ngram"].failures > 0


def test_draft_never_runs_past_the_context() -> None:
    """A context two tokens short of vLLM's limit: one draft fits (the bonus token takes the last place)."""
    core = _core(k=4, max_model_len=len(TEXT[:17]) + 2)
    (d,) = core.step([Row("a", TEXT[:17], 1)])
    assert d == TEXT[17:18]  # the repeated text has its next token to draft: exactly the one that fits
    core = _core(k=4, max_model_len=len(TEXT[:17]) + 1)
    assert core.step([Row("a", TEXT[:17], 1)]) == [[]]  # at the limit: nothing


def test_adaptive_k_prices_lookup_drafts_by_their_evidence() -> None:
    """Adaptive K: the suffix drafter offers every draft it has and the policy keeps what its evidence
    pays for; repeated text is accepted whole, so drafts grow to k_max and every drafted token is kept."""
    core = _core()
    drafted = _decode(core, {"a": None})
    lens = [len(d) for d in drafted["a"]]
    assert max(lens) == 4
    s = core.stats["suffix"]
    assert s.accepted == s.drafted > 0
    assert core.policies[DrafterName.SUFFIX].num_requests == 0  # released with the request
