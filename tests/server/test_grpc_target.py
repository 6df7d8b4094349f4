"""gRPC target worker + RemoteTargetEngine: lossless through the wire, small rounds, scale-out, failures.

Every worker here is a real grpc.aio server on a loopback port over the tiny
model; the reference is the embedded Engine decoding plainly on the same weights.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable, Iterator, Sequence

import grpc
import pytest
import torch

from draftgate.drafters import NgramDrafter
from draftgate.drafters.auto import AutoDrafter
from draftgate.drafters.base import Abilities, Draft, DraftRequest, SparseQ
from draftgate.engine import Chunk, Completion, DrafterKind, Engine, EngineConfig, build_engine
from draftgate.engine.session_host import SessionHost
from draftgate.errors import BadRequestError
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.server.proto import target_pb2 as pb
from draftgate.server.proto import target_pb2_grpc as pb_grpc
from draftgate.server.proto.wire import round_to_pb
from draftgate.server.targets.grpc_engine import RemoteTargetEngine
from draftgate.server.workers.target_server import TargetWorkerServer
from draftgate.types import SamplingParams

WAIT_S = 30.0
PROMPTS = ["hello world the", "a b c a b c a b", "the world is an of the world", "1 2 3 1 2 3 1"]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)


# ------------------------------------------------------------------ fixtures and helpers


class Plain:
    """The embedded engine decoding plainly: the reference output, memoized per (prompt, params)."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self._memo: dict[tuple[str, SamplingParams], Completion] = {}

    def complete(self, prompt: str, params: SamplingParams) -> Completion:
        key = (prompt, params)
        if key not in self._memo:
            self._memo[key] = self.engine.complete(prompt, params)
        return self._memo[key]


@pytest.fixture(scope="module")
def plain(tiny_model: LoadedModel) -> Iterator[Plain]:
    cfg = EngineConfig(model="tiny", drafter=DrafterKind.NONE, num_blocks=256, block_size=8)
    engine = build_engine(cfg, loaded=tiny_model)
    yield Plain(engine)
    engine.shutdown()


@pytest.fixture
def start_worker(tiny_model: LoadedModel) -> Iterator[Callable[[], TargetWorkerServer]]:
    """Target workers on free ports; at teardown each is stopped and its KV checked for leaks."""
    made: list[TargetWorkerServer] = []

    def start() -> TargetWorkerServer:
        runner = ModelRunner(tiny_model, num_blocks=256, block_size=8)
        server = TargetWorkerServer(SessionHost(runner, "tiny")).start()
        made.append(server)
        return server

    yield start
    for s in made:
        s.stop(grace=0)
        s.host.runner.kv.check_no_leaks()


@pytest.fixture
def make_remote(tiny_model: LoadedModel) -> Iterator[Callable[..., RemoteTargetEngine]]:
    made: list[RemoteTargetEngine] = []

    def make(targets: Sequence[TargetWorkerServer | str], drafter=None, **kw) -> RemoteTargetEngine:  # type: ignore[no-untyped-def]
        addrs = [t if isinstance(t, str) else t.target for t in targets]
        eng = RemoteTargetEngine(addrs, tiny_model.tokenizer, drafter, **kw)
        made.append(eng)
        return eng

    yield make
    for e in made:
        e.shutdown()
        assert e.num_running == 0 and e.num_waiting == 0


def wait_closed(*servers: TargetWorkerServer) -> None:
    """Sessions close asynchronously after the client's stream ends; wait for the workers to see it."""
    deadline = time.monotonic() + WAIT_S
    while any(s.host.open_sessions for s in servers):
        assert time.monotonic() < deadline, "a worker still holds sessions"
        time.sleep(0.01)


class Collect:
    def __init__(self) -> None:
        self.chunks: list[Chunk] = []
        self.first = threading.Event()
        self.done = threading.Event()

    def __call__(self, c: Chunk) -> None:
        self.chunks.append(c)
        self.first.set()
        if c.finish_reason is not None:
            self.done.set()

    @property
    def tokens(self) -> list[int]:
        return [t for c in self.chunks for t in c.token_ids]


class SlowDrafter(NgramDrafter):
    """n-gram drafts, each after a pause (keeps a request in flight long enough to kill its worker)."""

    def __init__(self, pause_s: float) -> None:
        super().__init__()
        self.pause_s = pause_s

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        time.sleep(self.pause_s)
        return super().propose(requests)


class DyadicDrafter:
    """Sampled drafts with a sparse q (probs 1/2, 1/4, 1/8, 1/8: exact in float32), a function of the history.

    Two instances propose the same drafts for the same history, so the embedded
    engine and a remote session can be compared token for token.
    """

    name = "dyadic"
    sampled_q = True
    abilities = Abilities()
    PROBS = torch.tensor([0.5, 0.25, 0.125, 0.125])

    def __init__(self, V: int) -> None:
        self.V = V

    def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
        out = []
        for r in requests:
            gen = torch.Generator().manual_seed(hash(tuple(r.tokens)) % 2**31)
            ids = torch.stack([torch.randperm(self.V, generator=gen)[:4] for _ in range(r.k)])  # [k, 4]
            probs = self.PROBS.expand(r.k, 4).contiguous()  # [k, 4]
            pick = torch.multinomial(probs, 1, generator=gen).squeeze(1)  # [k]
            out.append(Draft(ids.gather(1, pick[:, None]).squeeze(1).tolist(), SparseQ(ids, probs)))
        return out

    def observe(self, seq_id: int, tokens: Sequence[int], num_drafted: int, num_accepted: int) -> None:
        pass

    def release(self, seq_id: int) -> None:
        pass


# ------------------------------------------------------------------ lossless through the wire


@pytest.mark.parametrize("kind", ["ngram-k4", "auto"])
def test_greedy_output_equals_embedded_plain(kind, plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    drafter, k = (NgramDrafter(), 4) if kind == "ngram-k4" else (AutoDrafter(), None)
    remote = make_remote([worker], drafter, k=k)
    drafted = accepted = 0
    for prompt in PROMPTS:
        want = plain.complete(prompt, GREEDY)
        got = remote.complete(prompt, GREEDY)
        assert got.token_ids == want.token_ids, prompt
        assert got.text == want.text and got.finish_reason == want.finish_reason
        drafted += got.stats.draft_tokens
        accepted += got.stats.accepted_tokens
    assert drafted > 0 and accepted > 0, "speculation never ran: the test would prove nothing"
    # A prompt that stops on EOS (no ignore_eos) ends the same way too.
    p = SamplingParams(max_new_tokens=60)
    assert remote.complete("hello", p).token_ids == plain.complete("hello", p).token_ids
    wait_closed(worker)


def test_seeded_sampling_equals_embedded_plain(plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    remote = make_remote([worker], NgramDrafter(), k=4)
    for seed, prompt in enumerate(PROMPTS):
        params = SamplingParams(temperature=0.9, top_k=30, top_p=0.95, seed=seed, max_new_tokens=40, ignore_eos=True)
        assert remote.complete(prompt, params).token_ids == plain.complete(prompt, params).token_ids
    wait_closed(worker)


def test_sparse_q_rounds_verify_exactly_as_the_engine(tiny_model, plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    """Sampled drafts with sparse q: the worker's verification is the engine's, token for token."""
    V = tiny_model.config.vocab_size
    worker = start_worker()
    remote = make_remote([worker], DyadicDrafter(V), k=3)
    runner = ModelRunner(tiny_model, num_blocks=256, block_size=8)
    embedded = Engine(runner, DyadicDrafter(V), k=3)
    try:
        got = remote.complete(PROMPTS[0], GREEDY)  # greedy ignores q: still plain's output
        assert got.token_ids == plain.complete(PROMPTS[0], GREEDY).token_ids
        drafted = 0
        for seed, prompt in enumerate(PROMPTS):
            params = SamplingParams(temperature=1.0, seed=seed, max_new_tokens=30, ignore_eos=True)
            want, got = embedded.complete(prompt, params), remote.complete(prompt, params)
            assert got.token_ids == want.token_ids, prompt
            assert (got.stats.draft_tokens, got.stats.accepted_tokens) == (
                want.stats.draft_tokens,
                want.stats.accepted_tokens,
            )
            drafted += got.stats.draft_tokens
        assert drafted > 0 and remote.stats.accepted_tokens > 0  # both verify paths ran
        assert remote.wire.max_round_bytes > 40  # q rows travelled
    finally:
        embedded.shutdown()
    runner.kv.check_no_leaks()
    wait_closed(worker)


# ------------------------------------------------------------------ bytes on the wire


def test_greedy_k4_round_is_well_under_1kb(start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    # Worst case ids for a 49k vocabulary (3-byte varints): 4 drafts out, 5 tokens back.
    req = round_to_pb(Draft([49151, 49150, 49149, 49148]))
    resp = pb.SessionResponse(tokens=[49151, 49150, 49149, 49148, 49147], num_accepted=4, finish_reason="")
    assert req.ByteSize() + resp.ByteSize() + 10 <= 64
    # Measured on live sessions (payload + gRPC framing, both directions).
    worker = start_worker()
    remote = make_remote([worker], NgramDrafter(), k=4)
    for prompt in PROMPTS:
        remote.complete(prompt, GREEDY)
    assert remote.wire.rounds > 0
    assert remote.wire.max_round_bytes <= 1024
    assert remote.wire.bytes_per_round <= 64
    wait_closed(worker)


# ------------------------------------------------------------------ scale-out and failures


def test_sessions_spread_over_workers(plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    a, b = start_worker(), start_worker()
    remote = make_remote([a, b], NgramDrafter(), k=4)
    for prompt in PROMPTS:  # sequential: the tie-break spreads them round-robin
        assert remote.complete(prompt, GREEDY).token_ids == plain.complete(prompt, GREEDY).token_ids
    assert (a.host.sessions_total, b.host.sessions_total) == (2, 2)

    async def concurrent() -> list[list[int]]:
        async def one(p: str) -> list[int]:
            return [t async for c in remote.generate(p, GREEDY) for t in c.token_ids]

        return await asyncio.gather(*(one(p) for p in PROMPTS))

    outs = asyncio.run(concurrent())
    assert outs == [plain.complete(p, GREEDY).token_ids for p in PROMPTS]
    assert (a.host.sessions_total, b.host.sessions_total) == (4, 4)  # least-loaded: 2 and 2 at once
    wait_closed(a, b)


def test_dead_worker_fails_its_request_and_new_ones_go_elsewhere(plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    a, b = start_worker(), start_worker()
    remote = make_remote([a, b], SlowDrafter(0.02), k=2)
    long = SamplingParams(max_new_tokens=200, ignore_eos=True)
    sink = Collect()
    remote.submit(remote.encode(PROMPTS[0]), long, sink)
    assert sink.first.wait(WAIT_S)
    victim, other = (a, b) if a.host.open_sessions else (b, a)
    assert victim.host.open_sessions == 1
    victim.stop(grace=0)
    assert sink.done.wait(WAIT_S), "the request hung after its worker died"
    last = sink.chunks[-1]
    assert last.finish_reason == "error" and last.error and "target worker" in last.error
    assert len(sink.tokens) < 200
    victim.host.runner.kv.check_no_leaks()  # stop() freed the dead session's KV
    assert [w.down for w in remote.pool.workers if w.address == victim.target] == [True]
    # New requests go to the live worker and are still exact.
    for prompt in PROMPTS[:2]:
        assert remote.complete(prompt, GREEDY).token_ids == plain.complete(prompt, GREEDY).token_ids
    assert other.host.sessions_total == 2
    wait_closed(other)


def test_no_live_worker_is_a_clear_error(start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    dead = start_worker()
    dead.stop(grace=0)
    remote = make_remote([dead], NgramDrafter(), k=4)
    with pytest.raises(RuntimeError, match="no healthy target worker"):
        remote.complete("hello", GREEDY)


def test_a_worker_back_after_its_back_off_takes_sessions_again(tiny_model, plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    first = start_worker()
    address = first.target
    remote = make_remote([address], NgramDrafter(), k=4, retry_s=0.05)
    assert remote.complete(PROMPTS[0], GREEDY).token_ids == plain.complete(PROMPTS[0], GREEDY).token_ids
    first.stop(grace=0)
    with pytest.raises(RuntimeError, match="target worker"):
        remote.complete(PROMPTS[0], GREEDY)
    assert remote.pool.workers[0].down
    runner = ModelRunner(tiny_model, num_blocks=256, block_size=8)
    again = TargetWorkerServer(SessionHost(runner, "tiny"), address).start()  # same address, new process
    try:
        time.sleep(0.1)  # past the back-off: the next request probes it with Health
        assert remote.complete(PROMPTS[1], GREEDY).token_ids == plain.complete(PROMPTS[1], GREEDY).token_ids
        assert not remote.pool.workers[0].down
        wait_closed(again)
    finally:
        again.stop(grace=0)
        runner.kv.check_no_leaks()


def test_drafter_failure_or_timeout_continues_plainly(plain, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    class Flaky(NgramDrafter):
        def __init__(self) -> None:
            super().__init__()
            self.calls = 0

        def propose(self, requests: Sequence[DraftRequest]) -> list[Draft]:
            self.calls += 1
            if self.calls == 3:
                raise ConnectionError("draft tier down")
            return super().propose(requests)

    worker = start_worker()
    flaky = make_remote([worker], Flaky(), k=4)
    slow = make_remote([worker], SlowDrafter(0.5), k=4, draft_timeout_s=0.05)
    for remote in (flaky, slow):
        for prompt in PROMPTS[:2]:
            got = remote.complete(prompt, GREEDY)
            assert got.token_ids == plain.complete(prompt, GREEDY).token_ids
    wait_closed(worker)


def test_cancel_closes_the_session(start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    remote = make_remote([worker], SlowDrafter(0.01), k=2)

    async def read_two() -> int:
        n = 0
        async for _ in remote.generate("hello world", SamplingParams(max_new_tokens=200, ignore_eos=True)):
            n += 1
            if n == 2:
                break
        return n

    assert asyncio.run(read_two()) == 2
    wait_closed(worker)
    deadline = time.monotonic() + WAIT_S
    while remote.num_running:
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_bad_input(tiny_model, start_worker, make_remote) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    remote = make_remote([worker], NgramDrafter(), k=4)
    with pytest.raises(BadRequestError):
        remote.submit([1, 2, 10_000], GREEDY, lambda c: None)
    with pytest.raises(ValueError):
        remote.submit([1, 2], SamplingParams(temperature=-1.0), lambda c: None)
    V = tiny_model.config.vocab_size
    with grpc.insecure_channel(worker.target) as ch:
        stub = pb_grpc.TargetWorkerStub(ch)
        params = pb.SamplingParams(max_new_tokens=5)
        bad_open = [pb.SessionRequest(open=pb.Open(prompt=[1, V + 5], params=params))]
        with pytest.raises(grpc.RpcError) as e:
            list(stub.Session(iter(bad_open)))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        # A draft that cannot be verified exactly (a token outside its own q, a q that does not sum
        # to 1, an id outside the vocabulary) costs its round's drafts, as in the embedded engine:
        # the round decodes plainly and the session goes on.
        opened = pb.SessionRequest(open=pb.Open(prompt=[1, 5], params=params, max_draft_tokens=2))
        plain = list(stub.Session(iter([opened, pb.SessionRequest(round=pb.Round())])))
        for bad in (
            pb.Round(draft=[7], q=[pb.SparseRow(ids=[8, 9], probs=[0.5, 0.5])]),
            pb.Round(draft=[7], q=[pb.SparseRow(ids=[7, 9], probs=[0.5, 0.9])]),
            pb.Round(draft=[V + 3]),
        ):
            got = list(stub.Session(iter([opened, pb.SessionRequest(round=bad)])))
            assert [list(r.tokens) for r in got] == [list(r.tokens) for r in plain]
            assert got[1].num_accepted == 0
    wait_closed(worker)


# ------------------------------------------------------------------ Score


def test_score_returns_logprobs_for_the_suffix_only(tiny_model, start_worker) -> None:  # type: ignore[no-untyped-def]
    worker = start_worker()
    tokens = [1, 7, 9, 11, 13, 5, 8, 21, 30, 4]
    offset, top_n = 6, 3
    with grpc.insecure_channel(worker.target) as ch:
        resp = pb_grpc.TargetWorkerStub(ch).Score(pb.ScoreRequest(tokens=tokens, validation_offset=offset, top_n=top_n))
    assert [p.position for p in resp.positions] == list(range(offset, len(tokens) + 1))
    # Reference: one plain forward over all tokens on a separate runner.
    ref = ModelRunner(tiny_model, num_blocks=32, block_size=8)
    ref.add_sequence(99, tokens)
    logp = ref.forward([ForwardItem(99, tokens, len(tokens))])[0].log_softmax(-1)  # [n, V]
    ref.free(99)
    for p in resp.positions:
        row = logp[p.position - 1]
        if p.position < len(tokens):
            assert p.has_token and p.token == tokens[p.position]
            assert p.logprob == pytest.approx(float(row[p.token]), abs=1e-4)
        else:
            assert not p.has_token  # the next-token distribution (where a bonus token comes from)
        assert list(p.top_ids) == row.topk(top_n).indices.tolist()
        assert list(p.top_logprobs) == pytest.approx(row.topk(top_n).values.tolist(), abs=1e-4)
    with grpc.insecure_channel(worker.target) as ch:
        with pytest.raises(grpc.RpcError) as e:
            pb_grpc.TargetWorkerStub(ch).Score(pb.ScoreRequest(tokens=tokens, validation_offset=50))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT


@pytest.mark.parametrize("ending", ["length", "abort", "error"])
def test_a_request_has_released_its_session_when_its_last_chunk_arrives(start_worker, make_remote, ending: str) -> None:  # type: ignore[no-untyped-def]
    """The flaky "the gateway still counts sessions": the old client delivered the last
    chunk and counted the request finished, then released its pool session in a ``finally``; a
    caller that saw the end and looked at the pool raced the release. Every way out now closes the
    session first, so at the last chunk nothing is counted any more."""
    worker = start_worker()
    remote = make_remote([worker], SlowDrafter(0.01), k=2)
    seen: list[tuple[str | None, int, int]] = []
    done = threading.Event()

    def sink(c: Chunk) -> None:
        if c.finish_reason is not None:
            seen.append((c.finish_reason, sum(w.sessions for w in remote.pool.workers), remote.num_running))
            done.set()

    params = SamplingParams(max_new_tokens=12 if ending == "length" else 200, ignore_eos=True)
    cancel = remote.submit(remote.encode(PROMPTS[0]), params, sink)
    if ending != "length":
        deadline = time.monotonic() + WAIT_S
        while not worker.host.open_sessions and not done.is_set():  # the session is open, rounds run
            assert time.monotonic() < deadline
            time.sleep(0.005)
        if ending == "abort":
            cancel()
        else:
            worker.stop(grace=0)
    assert done.wait(WAIT_S)
    assert seen == [(ending, 0, 0)]
