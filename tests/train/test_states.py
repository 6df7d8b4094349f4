"""The one-pass training states: what the engine's plain decoding generates and a second forward would record."""

from __future__ import annotations

import torch

from draftgate.models.loader import LoadedModel
from draftgate.models.runner import ForwardItem, ModelRunner
from draftgate.train.data import Record, build_corpus
from draftgate.train.states import generate_states, sample_rows

LAYERS = (1, 2)


def _records() -> list[Record]:
    prompts = ["hello world", "the a b c", "an is of and", "x y z 1 2 3", "one", "two three"]
    return [Record(messages=({"role": "user", "content": p},)) for p in prompts] + [Record(text="a b c d e f g")]


def test_greedy_states_are_plain_decoding_and_the_full_forwards_rows(tiny_model: LoadedModel) -> None:
    recs = _records()
    states = generate_states(
        tiny_model, recs, LAYERS, top_k=5, max_new_tokens=12, max_len=96, batch=3, chunk=4, progress=False
    )
    plain = build_corpus(tiny_model, recs, max_new_tokens=12, max_len=96, progress=False)
    assert len(states) == len(plain) == len(recs)
    runner = ModelRunner(tiny_model, num_blocks=32, enable_prefix_cache=False)
    for s, e in zip(states, plain, strict=True):
        toks = s.tokens.tolist()
        n = len(toks) - 1
        assert s.start == e.start and s.feats.shape[0] == s.top_v.shape[0] == n
        eos = set(tiny_model.config.eos_token_ids)
        # the engine's greedy continuation (an EOS it stops at is kept here: the head learns to say it)
        assert toks[: len(e.tokens)] == list(e.tokens) and (len(toks) == len(e.tokens) or toks[-1] in eos)
        runner.add_sequence(0, toks)
        try:
            full = runner.forward_flat([ForwardItem(0, toks[:-1], n)], LAYERS)  # the second pass it replaces
        finally:
            runner.free(0)
        assert full.features is not None
        v, i = full.logits.topk(5, dim=-1)  # [n, 5]
        assert torch.equal(s.top_i, i.int()) and torch.equal(s.top_v, v.half())
        assert torch.equal(s.feats, full.features.half())
    runner.kv.check_no_leaks()


def test_sampled_continuations_are_more_of_the_targets_text_and_seeded(tiny_model: LoadedModel) -> None:
    recs = _records()[:3]
    kw = dict(top_k=5, max_new_tokens=16, max_len=96, continuations=3, temperature=1.0, progress=False)
    a = generate_states(tiny_model, recs, LAYERS, seed=1, **kw)  # type: ignore[arg-type]
    b = generate_states(tiny_model, recs, LAYERS, seed=1, **kw)  # type: ignore[arg-type]
    c = generate_states(tiny_model, recs, LAYERS, seed=2, **kw)  # type: ignore[arg-type]
    greedy = generate_states(tiny_model, recs, LAYERS, top_k=5, max_new_tokens=16, max_len=96, progress=False)
    assert len(a) == 9
    assert [s.tokens.tolist() for s in a[::3]] == [s.tokens.tolist() for s in greedy]  # continuation 0: greedy
    assert [s.tokens.tolist() for s in a] == [s.tokens.tolist() for s in b]
    assert [s.tokens.tolist() for s in a] != [s.tokens.tolist() for s in c]
    assert any(x.tokens.tolist() != y.tokens.tolist() for x, y in zip(a[1::3], a[::3], strict=True))


def test_a_deadline_stops_new_sequences_and_keeps_a_random_sample_in_order(tiny_model: LoadedModel) -> None:
    """Past the deadline no sequence starts (after a first batch); the finished ones come back whole,
    in file order, drawn from a seeded shuffle rather than the first prompts; ``tally`` counts them."""
    recs = _records()
    kw = dict(top_k=5, max_new_tokens=12, max_len=96, batch=3, chunk=4, progress=False)
    whole = generate_states(tiny_model, recs, LAYERS, **kw)  # type: ignore[arg-type]
    by_prompt = {tuple(s.tokens.tolist()): s for s in whole}
    picked = []
    for seed in (0, 1, 2):
        tally: dict[str, int] = {}
        cut = generate_states(tiny_model, recs, LAYERS, seed=seed, deadline=0.0, tally=tally, **kw)  # type: ignore[arg-type]
        # one batch, then the deadline (a text record is done on admission and frees its place at once)
        assert tally["requested"] == len(recs) and 3 <= tally["generated"] == len(cut) < len(recs)
        keys = [tuple(s.tokens.tolist()) for s in cut]
        for k, s in zip(keys, cut, strict=True):  # each one as the whole run made it
            assert torch.equal(s.feats, by_prompt[k].feats) and torch.equal(s.top_i, by_prompt[k].top_i)
        idx = [list(by_prompt).index(k) for k in keys]
        assert idx == sorted(idx)  # file order
        picked.append(idx)
    assert any(p != [0, 1, 2] for p in picked) and len({tuple(p) for p in picked}) > 1  # shuffled by the seed
    tally = {}
    assert len(generate_states(tiny_model, recs, LAYERS, deadline=float("inf"), tally=tally, **kw)) == len(recs)  # type: ignore[arg-type]
    assert tally == {"requested": len(recs), "generated": len(recs)}


def test_sample_rows_draws_each_rows_softmax() -> None:
    logits = torch.tensor([[0.0, 1.0, 2.0, -30.0], [3.0, 0.0, 0.0, 0.0]])  # [2, 4]
    t, n = 0.8, 20000
    got = torch.tensor(sample_rows(logits.repeat(n, 1), t, torch.Generator().manual_seed(0))).view(n, 2)
    counts = torch.stack([torch.bincount(got[:, r], minlength=4) for r in range(2)]).float()  # [2, 4]
    p = torch.softmax(logits / t, dim=-1)  # [2, 4]
    expected = p * n
    chi2 = ((counts - expected) ** 2 / expected.clamp_min(1e-9)).sum(dim=-1)  # [2]
    assert counts[0, 3] == 0  # p = 1e-17: never drawn
    assert bool((chi2 < 16.3).all()), chi2  # 3 degrees of freedom, p = 0.001
    a = sample_rows(logits, t, torch.Generator().manual_seed(5))
    assert a == sample_rows(logits, t, torch.Generator().manual_seed(5))
