"""The benchmark loop: arms take turns on the same prompts, load level by load level.

Order of work (so ratios survive a machine whose speed drifts):

1. one warm-up request per arm (excluded from every number), on a prompt of its own: warming
   up on a measured prompt would put its answer in the suffix drafter's global cache;
2. for each load level (fixed concurrency c, or Poisson arrivals at a rate), for
   each run, for each category, the category's prompts are cut into *windows*
   (c prompts by default; 8 with ``rate``);
3. every arm runs the same window in turn, the order alternating between windows
   (A B, B A, ...), so each arm sees the same conditions within seconds.

In a window, each conversation's turns are answered in order and each next turn
carries the arm's own previous answers. Peers (``ArmSpec.sequential``) only run at
concurrency 1.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from draftgate.bench.arms import Arm, ArmError
from draftgate.bench.prompts import BenchPrompt
from draftgate.bench.stats import RequestRecord, WindowRecord, group_by, itl_from_chunks
from draftgate.types import SamplingParams

# Not in any prompt set: the warm-up must not prime a drafter's cache with a measured answer.
WARMUP_PROMPT = BenchPrompt("warmup", "warmup", ("Say hello and introduce yourself in one sentence.",))

__all__ = ["BenchConfig", "BenchResult", "Load", "run_bench"]

RATE_WINDOW = 8  # prompts per window in Poisson mode (long enough for arrivals to overlap)

Progress = Callable[[int, int, str], None]  # (done, total, description)


@dataclass(frozen=True)
class Load:
    label: str  # "c=4" or "rate=2.0"
    concurrency: int | None = None
    rate: float | None = None  # arrivals per second


@dataclass(frozen=True)
class BenchConfig:
    params: SamplingParams
    baseline: str = "plain"
    concurrency: tuple[int, ...] = (1,)
    rate: float | None = None  # Poisson arrivals/s instead of fixed concurrency
    runs: int = 1
    window: int | None = None  # prompts per interleaving window (default: c, or RATE_WINDOW)
    warmup: bool = True
    seed: int = 0  # for Poisson arrival times (the same for every arm)

    def validate(self) -> BenchConfig:
        if self.runs < 1:
            raise ValueError(f"--runs must be >= 1, got {self.runs}")
        if not self.concurrency or any(c < 1 for c in self.concurrency):
            raise ValueError(f"--concurrency values must be >= 1, got {list(self.concurrency)}")
        if self.rate is not None and not self.rate > 0:
            raise ValueError(f"--rate must be > 0 arrivals per second, got {self.rate}")
        if self.window is not None and self.window < 1:
            raise ValueError(f"--window must be >= 1, got {self.window}")
        self.params.validate()
        return self

    def loads(self) -> list[Load]:
        if self.rate is not None:
            return [Load(f"rate={self.rate:g}", rate=self.rate)]
        return [Load(f"c={c}", concurrency=c) for c in dict.fromkeys(self.concurrency)]

    def window_size(self, load: Load) -> int:
        return self.window or (load.concurrency if load.concurrency else RATE_WINDOW)


@dataclass
class BenchResult:
    requests: list[RequestRecord] = field(default_factory=list)
    windows: list[WindowRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def run_bench(
    arms: dict[str, Arm], prompts: Sequence[BenchPrompt], cfg: BenchConfig, progress: Progress | None = None
) -> BenchResult:
    """Run every arm over every prompt, load level and run; return the raw records."""
    cfg.validate()
    if cfg.baseline not in arms:
        raise ValueError(f"the baseline arm {cfg.baseline!r} is not among the arms {list(arms)}")
    return asyncio.run(_run(arms, list(prompts), cfg, progress))


def _plan(
    arms: dict[str, Arm], prompts: list[BenchPrompt], cfg: BenchConfig
) -> list[tuple[Load, int, list[BenchPrompt], list[str]]]:
    """Steps of (load, run, window, arm order); alternating arm order between windows."""
    steps = []
    flip = False
    for load in cfg.loads():
        names = [n for n, a in arms.items() if load.concurrency == 1 or not a.spec.sequential]
        size = cfg.window_size(load)
        for run in range(cfg.runs):
            for cat_prompts in group_by(prompts, lambda p: p.category).values():
                for i in range(0, len(cat_prompts), size):
                    steps.append((load, run, cat_prompts[i : i + size], names[::-1] if flip else names))
                    flip = not flip
    return steps


async def _run(
    arms: dict[str, Arm], prompts: list[BenchPrompt], cfg: BenchConfig, progress: Progress | None
) -> BenchResult:
    res = BenchResult()
    skipped = sorted(
        {n for n, a in arms.items() if a.spec.sequential} if any(ld.concurrency != 1 for ld in cfg.loads()) else set()
    )
    if skipped:
        res.notes.append(f"arms {skipped} run one request at a time, so they only take part at c=1")
    steps = _plan(arms, prompts, cfg)
    total = sum(len(order) for *_, order in steps) + (len(arms) if cfg.warmup else 0)
    done = 0
    try:
        if cfg.warmup:
            for name, arm in arms.items():
                rec = await _request(arm, WARMUP_PROMPT, 0, [], cfg.params, Load("warmup"), -1)
                if rec.error:
                    raise ArmError(f"warm-up request on arm {name} failed: {rec.error}")
                done += 1
                if progress:
                    progress(done, total, f"warm-up {name}")
        last_run = None
        for w, (load, run, window, order) in enumerate(steps):
            if (load.label, run) != last_run:
                # Every run starts from the same drafter memory: the same prompts again would otherwise be
                # drafted from the previous run's answers (measured: auto 1.34x in run 1, 3.6x median of 3).
                last_run = (load.label, run)
                for arm in arms.values():
                    arm.new_run()
            for name in order:
                reqs, wrec = await _window(arms[name], window, cfg, load, run, w)
                res.requests += reqs
                res.windows.append(wrec)
                done += 1
                if progress:
                    progress(done, total, f"{load.label} run {run + 1} {window[0].category} {name}")
    finally:
        for arm in arms.values():
            await arm.aclose()
    return res


async def _window(
    arm: Arm, window: list[BenchPrompt], cfg: BenchConfig, load: Load, run: int, w: int
) -> tuple[list[RequestRecord], WindowRecord]:
    out: list[RequestRecord] = []
    t0 = time.perf_counter()
    if load.rate is not None:
        rng = random.Random(f"{cfg.seed}:{run}:{w}")  # the same arrival times for every arm
        offsets = [0.0]
        for _ in window[1:]:
            offsets.append(offsets[-1] + rng.expovariate(load.rate))

        async def arrive(p: BenchPrompt, at: float) -> None:
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            out.extend(await _conversation(arm, p, cfg.params, load, run))

        await asyncio.gather(*(arrive(p, at) for p, at in zip(window, offsets, strict=True)))
    else:
        sem = asyncio.Semaphore(load.concurrency or 1)

        async def worker(p: BenchPrompt) -> None:
            async with sem:
                out.extend(await _conversation(arm, p, cfg.params, load, run))

        await asyncio.gather(*(worker(p) for p in window))
    wall = time.perf_counter() - t0
    toks = sum(r.n_tokens for r in out if r.error is None)
    return out, WindowRecord(arm.spec.name, window[0].category, load.label, run, wall, toks)


async def _conversation(arm: Arm, p: BenchPrompt, params: SamplingParams, load: Load, run: int) -> list[RequestRecord]:
    recs: list[RequestRecord] = []
    answers: list[str] = []
    for turn in range(len(p.turns)):
        rec = await _request(arm, p, turn, answers, params, load, run)
        recs.append(rec)
        if rec.error:  # later turns need this answer
            break
        answers.append(rec.text)
    return recs


async def _request(
    arm: Arm, p: BenchPrompt, turn: int, answers: list[str], params: SamplingParams, load: Load, run: int
) -> RequestRecord:
    """One turn: time every piece as it arrives (see ``stats`` for the metric definitions)."""
    rec = RequestRecord(arm.spec.name, p.category, p.id, turn, load.label, run, 0, 0.0, 0.0)
    times: list[float] = []
    counts: list[int] = []
    ids: list[int] | None = []
    text: list[str] = []
    total: int | None = None
    t0 = time.perf_counter()
    try:
        async for piece in arm.stream(p.messages(turn, answers), params):
            times.append(time.perf_counter())
            counts.append(piece.n_tokens)
            text.append(piece.text)
            if ids is not None and piece.token_ids is not None:
                ids.extend(piece.token_ids)
            elif piece.n_tokens:  # an arm that only sends text: no ids to compare
                ids = None
            total = piece.total_tokens if piece.total_tokens is not None else total
            if piece.stats is not None:
                st = piece.stats
                rec.rounds, rec.draft_tokens = st.rounds, st.draft_tokens
                rec.accepted_tokens, rec.emitted_tokens = st.accepted_tokens, st.emitted_tokens
    except Exception as e:  # recorded and reported; the run goes on
        rec.error = f"{type(e).__name__}: {e}"
        return rec
    first = next((t for t, n in zip(times, counts, strict=True) if n > 0), None)
    end = times[-1] if times else time.perf_counter()
    rec.n_tokens = total if total is not None else sum(counts)
    rec.ttft_s = (first if first is not None else end) - t0
    rec.e2e_s = end - t0
    rec.itl_s = itl_from_chunks(times, counts)
    rec.token_ids = ids if ids is not None and sum(counts) == len(ids) else None
    rec.text = "".join(text)
    return rec
