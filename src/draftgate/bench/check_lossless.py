"""`draftgate check-lossless`: the lossless guarantee as something a user runs against a back end.

Three checks on any ``Backend`` (the embedded engine, the engine over gRPC target workers, over
an OpenAI-compatible server), each comparing the back end's speculative output with its own
plain decoding (``submit(speculate=False)``: the same target, no drafts):

1. **greedy**: per prompt, speculative tokens bit-identical to plain tokens;
2. **seeded**: per prompt and seed, the same seeded sampled request twice gives the same tokens;
   when every round's drafts were deterministic (no sampled q: ``SpecStats.sampled_rounds``
   is 0) the tokens must also equal plain sampling with that seed (matching verification
   couples the two exactly);
3. **distribution**: ``samples`` seeded requests per arm on one prompt, ``sample_tokens``
   tokens each (past EOS: every sample has every position), and a chi-square homogeneity test
   of speculative against plain per output position at a fixed alpha (Bonferroni over
   positions). Whatever verifier the back end really runs (in this process, in a gRPC worker,
   over a scorer) is what is tested.

A back end that refuses sampling (an openai+http route without ``allow_approximate``) has its
sampling checks skipped with the reason; one that verifies sampling approximately fails them,
since approximate is not lossless. The same comparison (``engine.compare``) is the gateway's
lossless canary.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from draftgate.engine import Chunk
from draftgate.engine.backend import Backend
from draftgate.engine.compare import collect, first_difference
from draftgate.errors import BadRequestError
from draftgate.types import SamplingParams
from draftgate.verify.fidelity import positional_homogeneity

__all__ = ["CheckConfig", "CheckPrompt", "Finding", "LosslessReport", "check_lossless"]

Progress = Callable[[str], None]  # called once per request finished, with the check's name


@dataclass(frozen=True)
class CheckConfig:
    max_new_tokens: int = 48
    seeds: tuple[int, ...] = (1, 2)  # per prompt, for the seeded check
    temperature: float = 0.8
    top_k: int = 0
    top_p: float = 0.95
    samples: int = 300  # requests per arm for the distribution test (0: skip it)
    sample_tokens: int = 4  # tokens per request in the distribution test
    alpha: float = 1e-3  # significance level of the distribution test (over all its positions)
    concurrency: int = 8  # requests in flight in the distribution test
    sampling: bool = True  # False: the greedy check only
    ignore_eos: bool = False  # greedy and seeded requests run to max_new_tokens (distribution ones always do)

    def validate(self) -> CheckConfig:
        if self.max_new_tokens < 1 or self.sample_tokens < 1:
            raise ValueError("--max-new-tokens and --sample-tokens must be >= 1")
        if self.samples < 0 or self.samples == 1:
            raise ValueError("--samples must be 0 (skip the distribution test) or >= 2")
        if not 0 < self.temperature or not 0 < self.top_p <= 1 or self.top_k < 0:
            raise ValueError("sampling checks need --temperature > 0, --top-p in (0, 1], --top-k >= 0")
        if not 0 < self.alpha < 1 or self.concurrency < 1:
            raise ValueError("--alpha must be in (0, 1) and --concurrency >= 1")
        return self


@dataclass(frozen=True)
class CheckPrompt:
    id: str
    token_ids: list[int]


@dataclass(frozen=True)
class Finding:
    check: str  # greedy | seeded | distribution
    prompt_id: str
    passed: bool
    detail: str
    skipped: bool = False
    position: int | None = None  # first differing output position, when tokens differ
    expected: list[int] | None = None  # plain (or first run) tokens around the difference
    got: list[int] | None = None


@dataclass
class LosslessReport:
    backend: str
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(f.passed for f in self.findings)

    @property
    def first_failure(self) -> Finding | None:
        return next((f for f in self.findings if not f.passed), None)

    def to_json(self) -> dict[str, object]:
        return {"backend": self.backend, "passed": self.passed, "findings": [asdict(f) for f in self.findings]}


def _params(cfg: CheckConfig, seed: int | None, max_new_tokens: int, ignore_eos: bool) -> SamplingParams:
    if seed is None:
        return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, ignore_eos=ignore_eos).validate()
    return SamplingParams(
        temperature=cfg.temperature,
        top_k=cfg.top_k,
        top_p=cfg.top_p,
        seed=seed,
        max_new_tokens=max_new_tokens,
        ignore_eos=ignore_eos,
    ).validate()


def _run(backend: Backend, ids: list[int], params: SamplingParams, speculate: bool) -> tuple[list[int], Chunk]:
    tokens, last = collect(backend, ids, params, speculate=speculate)
    if last.finish_reason not in ("stop", "length"):
        raise RuntimeError(f"the request ended with {last.finish_reason}: {last.error or 'no reason given'}")
    return tokens, last


def _diff(check: str, pid: str, what: str, a: list[int], b: list[int]) -> Finding:
    pos = first_difference(a, b)
    if pos is None:
        return Finding(check, pid, True, f"{what}: {len(a)} tokens identical")
    lo = max(0, pos - 3)
    return Finding(
        check,
        pid,
        False,
        f"{what}: first difference at output token {pos} ({len(a)} vs {len(b)} tokens)",
        position=pos,
        expected=a[lo : pos + 4],
        got=b[lo : pos + 4],
    )


def _greedy(backend: Backend, p: CheckPrompt, cfg: CheckConfig) -> Finding:
    params = _params(cfg, None, cfg.max_new_tokens, cfg.ignore_eos)
    plain, _ = _run(backend, p.token_ids, params, speculate=False)
    spec, _ = _run(backend, p.token_ids, params, speculate=True)
    return _diff("greedy", p.id, "speculative vs plain greedy", plain, spec)


def _seeded(backend: Backend, p: CheckPrompt, seed: int, cfg: CheckConfig) -> list[Finding]:
    params = _params(cfg, seed, cfg.max_new_tokens, cfg.ignore_eos)
    first, last = _run(backend, p.token_ids, params, speculate=True)
    if last.stats is not None and last.stats.approximate:
        return [Finding("seeded", p.id, False, "this back end verified sampling approximately: not lossless")]
    again, _ = _run(backend, p.token_ids, params, speculate=True)
    out = [_diff("seeded", p.id, f"seed {seed}, run twice", first, again)]
    if last.stats is not None and last.stats.sampled_rounds == 0:
        plain, _ = _run(backend, p.token_ids, params, speculate=False)
        out.append(_diff("seeded", p.id, f"seed {seed}, deterministic drafts vs plain sampling", plain, first))
    return out


def _distribution(backend: Backend, p: CheckPrompt, cfg: CheckConfig, progress: Progress) -> Finding:
    """Chi-square homogeneity of speculative vs plain sampling, per output position."""
    n, m = cfg.samples, cfg.sample_tokens
    jobs = [(seed, True) for seed in range(1, n + 1)] + [(seed, False) for seed in range(n + 1, 2 * n + 1)]

    def one(job: tuple[int, bool]) -> list[int]:
        tokens, _ = _run(backend, p.token_ids, _params(cfg, job[0], m, ignore_eos=True), speculate=job[1])
        progress("distribution")
        return tokens

    with ThreadPoolExecutor(cfg.concurrency) as pool:
        outs = list(pool.map(one, jobs))
    spec, plain = outs[:n], outs[n:]
    tests = list(enumerate(positional_homogeneity(spec, plain, m, cfg.alpha)))
    worst_i, worst = max(tests, key=lambda t: t[1].ratio)
    summary = ", ".join(f"pos {i}: {t.statistic:.1f}/{t.threshold:.1f} (dof {t.dof})" for i, t in tests)
    verdict = "same distribution" if worst.passed else f"differ at output position {worst_i}"
    return Finding(
        "distribution",
        p.id,
        worst.passed,
        f"{n} + {n} seeded requests, chi-square speculative vs plain at alpha {cfg.alpha:g}: {verdict} [{summary}]",
        position=None if worst.passed else worst_i,
    )


def _refuses_sampling(backend: Backend, p: CheckPrompt, cfg: CheckConfig) -> str | None:
    try:
        _run(backend, p.token_ids, _params(cfg, 1, 1, ignore_eos=True), speculate=True)
    except BadRequestError as e:
        return str(e)
    except (RuntimeError, TimeoutError):
        return None  # not a refusal: the seeded checks run and report the failure
    return None


def check_lossless(
    backend: Backend, name: str, prompts: Sequence[CheckPrompt], cfg: CheckConfig, progress: Progress | None = None
) -> LosslessReport:
    """Run every check on ``backend``; a check that cannot run (the request fails) is a failure."""
    cfg = cfg.validate()
    tick = progress or (lambda _check: None)
    report = LosslessReport(name)

    def guarded(check: str, pid: str, f: Callable[[], Finding | list[Finding]]) -> None:
        try:
            out = f()
        except (RuntimeError, TimeoutError, BadRequestError) as e:
            out = Finding(check, pid, False, f"could not run: {e}")
        report.findings.extend(out if isinstance(out, list) else [out])
        tick(check)

    for p in prompts:
        guarded("greedy", p.id, lambda p=p: _greedy(backend, p, cfg))  # type: ignore[misc]
    if not cfg.sampling or not prompts:
        return report
    refused = _refuses_sampling(backend, prompts[0], cfg)
    if refused is not None:
        report.findings.append(
            Finding("seeded", "*", True, f"skipped: the back end refuses sampling ({refused})", True)
        )
        return report
    for p in prompts:
        for seed in cfg.seeds:
            guarded("seeded", p.id, lambda p=p, seed=seed: _seeded(backend, p, seed, cfg))  # type: ignore[misc]
    if cfg.samples:
        guarded("distribution", prompts[0].id, lambda: _distribution(backend, prompts[0], cfg, tick))
    return report


def planned_requests(n_prompts: int, cfg: CheckConfig) -> int:
    """How many progress ticks ``check_lossless`` makes (for a progress bar)."""
    if not cfg.sampling:
        return n_prompts
    return n_prompts * (1 + len(cfg.seeds)) + (2 * cfg.samples + 1 if cfg.samples else 0)


def render(report: LosslessReport) -> str:
    """A readable report: one line per check kind, then every failure with its tokens."""
    lines = [f"check-lossless: {report.backend}"]
    for check in ("greedy", "seeded", "distribution"):
        fs = [f for f in report.findings if f.check == check]
        if not fs:
            continue
        if all(f.skipped for f in fs):
            lines.append(f"  {check:<13} {fs[0].detail}")
            continue
        ok = sum(f.passed for f in fs)
        lines.append(f"  {check:<13} {ok}/{len(fs)} passed")
        if check == "distribution":
            lines.extend(f"      {f.detail}" for f in fs)
    for f in report.findings:
        if not f.passed:
            lines.append(f"  FAIL {f.check} [{f.prompt_id}]: {f.detail}")
            if f.expected is not None:
                lines.append(f"       expected {f.expected}\n       got      {f.got}")
    lines.append("PASSED" if report.passed else "FAILED")
    return "\n".join(lines)
