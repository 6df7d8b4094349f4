"""ModelRunner on the tiny model: prefix reuse, fork/copy-on-write, no leaks, all-or-nothing forwards."""

from __future__ import annotations

import random

import pytest
import torch

from draftgate.kv import OutOfBlocks
from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, Kernels, ModelRunner

BS = 4


@pytest.fixture
def hf(tiny_model: LoadedModel, hf_reference):
    return hf_reference(tiny_model)


def hf_logits(hf, tokens: list[int]) -> torch.Tensor:  # [T, V]
    with torch.no_grad():
        return hf(torch.tensor([tokens])).logits[0].float()


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return (a - b).abs().max().item()


def tokens(n: int, seed: int) -> list[int]:
    return random.Random(seed).choices(range(3, 96), k=n)


@pytest.mark.parametrize("shared", [17, 22], ids=["partial-prefix", "whole-prompt"])
def test_prefix_cache_reuse_matches_uncached(tiny_model: LoadedModel, shared: int) -> None:
    first = tokens(22, seed=1)
    second = first[:shared] + tokens(6, seed=2)[: 22 + 1 - shared]  # 23 tokens either way
    cached_runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    cached_runner.prefill(0, first)
    hit = cached_runner.add_sequence(1, second)
    # Only full blocks of the common prefix are reused, and never the last prompt token.
    assert hit == min(shared // BS, (len(second) - 1) // BS) * BS > 0
    assert cached_runner.kv.block_table(1)[: hit // BS] == cached_runner.kv.block_table(0)[: hit // BS]
    rest = second[hit:]
    (got,) = cached_runner.forward([ForwardItem(1, rest, num_logits=len(rest))])

    plain = ModelRunner(tiny_model, num_blocks=32, block_size=BS, enable_prefix_cache=False)
    assert plain.add_sequence(1, second) == 0
    (want,) = plain.forward([ForwardItem(1, second, num_logits=len(rest))])
    assert max_diff(got, want) <= 1e-5


def test_fork_copy_on_write_both_match_hf(tiny_model: LoadedModel, hf) -> None:
    prompt = tokens(10, seed=3)  # 2 full blocks + a half-full shared block after the fork
    runner = ModelRunner(tiny_model, num_blocks=32, block_size=BS)
    runner.prefill(0, prompt)
    runner.fork(0, 1)
    assert runner.kv.block_table(1) == runner.kv.block_table(0)
    a, b = [7, 8, 9], [40, 41]
    out = runner.forward([ForwardItem(0, a, num_logits=3), ForwardItem(1, b, num_logits=2)])
    assert max_diff(out[0], hf_logits(hf, prompt + a)[-3:]) <= 1e-4
    assert max_diff(out[1], hf_logits(hf, prompt + b)[-2:]) <= 1e-4
    t0, t1 = runner.kv.block_table(0), runner.kv.block_table(1)
    assert t0[:2] == t1[:2] and t0[2] != t1[2]  # full blocks still shared, the partial one copied
    # Roll the child back into the shared full blocks and grow it again: the parent is untouched.
    runner.truncate(1, 6)
    c = [50, 51, 52, 53]
    (got_c,) = runner.forward([ForwardItem(1, c, num_logits=4)])
    assert max_diff(got_c, hf_logits(hf, prompt[:6] + c)[-4:]) <= 1e-4
    (got_a,) = runner.forward([ForwardItem(0, [60])])
    assert max_diff(got_a, hf_logits(hf, prompt + a + [60])[-1:]) <= 1e-4


def test_random_workload_matches_hf_and_leaks_nothing(tiny_model: LoadedModel, hf) -> None:
    rng = random.Random(1234)
    runner = ModelRunner(tiny_model, num_blocks=40, block_size=BS)
    live: dict[int, list[int]] = {}  # seq id -> token history whose KV is written
    next_id = 0
    pending: list[tuple[list[int], torch.Tensor]] = []  # (history, its last logits) for HF

    def check(sid: int, logits: torch.Tensor) -> None:
        pending.append((list(live[sid]), logits))

    while next_id < 40 or live:
        op = rng.choice(["new", "extend", "extend", "truncate", "fork", "free"])
        if next_id >= 40 and op in ("new", "fork"):
            op = "free"
        try:
            if op == "new" or not live:
                if next_id >= 40:
                    continue
                base = live[rng.choice(list(live))] if live and rng.random() < 0.5 else []
                prompt = base[: rng.randint(0, len(base))] + tokens(rng.randint(1, 12), rng.random())
                last = runner.prefill(next_id, prompt)  # frees the sequence itself if it fails
                live[next_id] = prompt
                check(next_id, last[None])
                next_id += 1
            elif op == "extend":
                sids = rng.sample(list(live), rng.randint(1, min(3, len(live))))
                new = {s: tokens(rng.randint(1, 5), rng.random()) for s in sids}
                out = runner.forward([ForwardItem(s, new[s], num_logits=len(new[s])) for s in sids])
                for s, logits in zip(sids, out, strict=True):
                    live[s] = live[s] + new[s]
                    runner.commit(s, live[s])
                    check(s, logits)
            elif op == "truncate":
                s = rng.choice(list(live))
                n = rng.randint(0, len(live[s]))
                runner.truncate(s, n)
                live[s] = live[s][:n]
            elif op == "fork":
                s = rng.choice(list(live))
                runner.fork(s, next_id)
                live[next_id] = list(live[s])
                next_id += 1
            else:
                s = rng.choice(list(live))
                runner.free(s)
                del live[s]
        except OutOfBlocks:
            assert live, "a single short request cannot exhaust the pool"
            s = rng.choice(list(live))  # make room the way a scheduler would: preempt one
            runner.free(s)
            del live[s]
        for s, hist in live.items():
            assert runner.length(s) == len(hist)
    runner.kv.check_no_leaks()
    assert runner.kv.num_sequences == 0 and runner.kv.stats()["prefix_hit_tokens"] > 0
    # One right-padded HF batch checks every forward of the run (causal: padding never leaks left).
    assert len(pending) > 40
    T = max(len(h) for h, _ in pending)
    ids = torch.tensor([h + [0] * (T - len(h)) for h, _ in pending])
    mask = torch.tensor([[1] * len(h) + [0] * (T - len(h)) for h, _ in pending])
    with torch.no_grad():
        ref = hf(ids, attention_mask=mask).logits.float()  # [n, T, V]
    for i, (h, logits) in enumerate(pending):
        n = logits.shape[0]
        assert max_diff(logits, ref[i, len(h) - n : len(h)]) <= 1e-4, f"check {i}, history {h}"
    assert runner.kv.num_sequences == 0


def test_out_of_blocks_forward_changes_nothing(tiny_model: LoadedModel, hf) -> None:
    runner = ModelRunner(tiny_model, num_blocks=5, block_size=BS, enable_prefix_cache=False)
    p0, p1 = tokens(8, seed=5), tokens(6, seed=6)
    runner.prefill(0, p0)  # 2 blocks
    runner.prefill(1, p1)  # 2 blocks, 1 left
    free_before = runner.kv.num_free_blocks
    # Item 0 alone fits (takes the last block); item 1 then needs 2 more: the batch fails whole.
    with pytest.raises(OutOfBlocks):
        runner.forward([ForwardItem(0, [10, 11]), ForwardItem(1, [12, 13, 14, 15, 16])])
    assert (runner.length(0), runner.length(1)) == (8, 6)
    assert runner.kv.num_free_blocks == free_before
    (logits,) = runner.forward([ForwardItem(1, [12, 13])])  # still usable afterwards
    assert max_diff(logits, hf_logits(hf, p1 + [12, 13])[-1:]) <= 1e-4


def test_failed_forward_rolls_back_reserved_slots(tiny_model: LoadedModel, hf) -> None:
    runner = ModelRunner(tiny_model, num_blocks=8, block_size=BS)
    prompt = tokens(6, seed=7)
    runner.prefill(0, prompt)
    with pytest.raises(IndexError):  # an id outside the vocabulary fails inside the forward
        runner.forward([ForwardItem(0, [5, tiny_model.config.vocab_size + 3])])
    assert runner.length(0) == 6
    (logits,) = runner.forward([ForwardItem(0, [5])])
    assert max_diff(logits, hf_logits(hf, prompt + [5])[-1:]) <= 1e-4


def test_runners_on_one_loaded_model_share_its_packed_weights(tiny_model_dir) -> None:  # noqa: ANN001
    """One packed copy per loaded model (native kernels); another load packs its own; KV stays per runner."""
    from draftgate.models.loader import load_model

    loaded = load_model(str(tiny_model_dir))
    a, b = ModelRunner(loaded, num_blocks=8), ModelRunner(loaded, num_blocks=8)
    assert a.kernels is Kernels.NATIVE  # the CPU default (a runner without them fails to build: NativeUnavailable)
    assert a.model is b.model and a.cache is not b.cache
    assert ModelRunner(load_model(str(tiny_model_dir)), num_blocks=8).model is not a.model
    a.prefill(1, [1, 2, 3])
    b.prefill(1, [4, 5, 6])  # the same sequence id in two runners: separate KV, separate answers
    (la,) = a.forward([ForwardItem(1, [7])])
    (lb,) = b.forward([ForwardItem(1, [7])])
    assert not torch.equal(la, lb)
