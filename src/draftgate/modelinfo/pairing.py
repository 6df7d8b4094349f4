"""Can this draft model serve this target? Vocabulary, special tokens, chat template, context.

The engine tokenizes every prompt with the *target's* tokenizer and template, and
the draft reads and proposes those token ids; its q is compared with the target's
p over the same vocabulary. So:

- errors (the pair is refused): a different vocabulary (an id would mean different
  text to each model), a different logit width (q and p must be the same length),
  a different bos id, end-of-sequence ids with nothing in common;
- warnings (lossless, but the draft will predict the target worse): end-of-sequence
  sets that overlap but differ, chat templates that render differently, a draft
  trained on a shorter context;
- info: a reduced output vocabulary (``draftgate.vocab_subset``), which is exact
  since q is zero outside the subset.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from draftgate.models.llama import VOCAB_SUBSET_KEY  # a distilled draft's output token ids [Vs]
from draftgate.models.loader import LoadedModel
from draftgate.models.tokenizer import Message, TextTokenizer

__all__ = ["Severity", "Finding", "PairReport", "check_pair", "SAMPLE_CHATS"]

Severity = Literal["error", "warning", "info"]
Check = Literal["vocab", "vocab_width", "bos", "eos", "chat_template", "context", "vocab_subset"]

SAMPLE_CHATS: dict[str, list[Message]] = {
    "user": [{"role": "user", "content": "What is the capital of France?"}],
    "system+user": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": "Write a haiku about the sea."},
    ],
    "multi-turn": [
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Add 2 and 3."},
    ],
}


@dataclass(frozen=True)
class Finding:
    severity: Severity
    check: Check
    reason: str


@dataclass(frozen=True)
class PairReport:
    target: str
    draft: str
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        """Compatible: no finding is an error (warnings and info allowed)."""
        return not self.errors

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == "error"]

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "draft": self.draft,
            "ok": self.ok,
            "findings": [{"severity": f.severity, "check": f.check, "reason": f.reason} for f in self.findings],
        }


def check_pair(target: LoadedModel, draft: LoadedModel, target_name: str = "", draft_name: str = "") -> PairReport:
    tt, dt = target.tokenizer, draft.tokenizer
    findings = _check_vocab(tt, dt)
    same_vocab = not findings
    tv, dv = target.config.vocab_size, draft.config.vocab_size
    if tv != dv:
        findings.append(
            Finding(
                "error",
                "vocab_width",
                f"logit widths differ: target config vocab_size {tv}, draft {dv}; the draft's q must "
                f"cover exactly the target's {tv} ids (resize the draft's embedding and head)",
            )
        )
    findings += _check_special(tt, dt)
    findings += _check_template(tt, dt, compare_ids=same_vocab)
    tc, dc = target.config.max_position_embeddings, draft.config.max_position_embeddings
    if dc < tc:
        findings.append(
            Finding(
                "warning",
                "context",
                f"draft max_position_embeddings {dc} < target's {tc}: past {dc} tokens the draft "
                "runs beyond its trained context and predicts worse (output stays lossless)",
            )
        )
    subset = draft.weights.get(VOCAB_SUBSET_KEY)
    if subset is not None:
        findings += _check_subset(subset, tt, tv)
    return PairReport(target_name or str(target.source), draft_name or str(draft.source), tuple(findings))


def _check_vocab(tt: TextTokenizer, dt: TextTokenizer) -> list[Finding]:
    tv, dv = tt.vocab(), dt.vocab()
    if tv == dv:
        return []
    diffs: list[str] = []
    for tok, i in sorted(tv.items(), key=lambda kv: kv[1]):
        j = dv.get(tok)
        if j != i:
            there = f"{j} in the draft" if j is not None else "absent from the draft"
            diffs.append(f"{tok!r} is id {i} in the target, {there}")
        if len(diffs) == 3:
            break
    only_draft = sorted((i, tok) for tok, i in dv.items() if tok not in tv)[: max(0, 3 - len(diffs))]
    diffs += [f"{tok!r} (id {i}) only in the draft" for i, tok in only_draft]
    n_diff = sum(1 for tok, i in tv.items() if dv.get(tok) != i) + sum(1 for tok in dv if tok not in tv)
    return [
        Finding(
            "error",
            "vocab",
            f"vocabularies differ: target {len(tv)} tokens, draft {len(dv)} ({len(dv) - len(tv):+d}), "
            f"{n_diff} entries differ, e.g. {'; '.join(diffs)}. The draft reads and proposes the "
            "target's token ids, so each id must mean the same text: use a draft with the target's tokenizer",
        )
    ]


def _describe(tok: TextTokenizer, ids: Sequence[int | None]) -> str:
    return ", ".join(f"{i} ({tok.id_to_token(i)!r})" if i is not None else "none" for i in ids) or "none"


def _check_special(tt: TextTokenizer, dt: TextTokenizer) -> list[Finding]:
    out: list[Finding] = []
    if tt.bos_id != dt.bos_id:
        out.append(
            Finding(
                "error",
                "bos",
                f"bos ids differ: target {_describe(tt, [tt.bos_id])}, draft {_describe(dt, [dt.bos_id])}; "
                "prompts start with the target's bos, which the draft was not trained to read",
            )
        )
    te, de = set(tt.eos_ids), set(dt.eos_ids)
    if te == de:
        return out
    where = f"target {_describe(tt, sorted(te))}, draft {_describe(dt, sorted(de))}"
    if not te & de:
        out.append(
            Finding(
                "error",
                "eos",
                f"end-of-sequence ids have nothing in common: {where}; the draft cannot predict where "
                "the target ends a turn (a different tokenizer or chat format)",
            )
        )
    else:
        # Instruct releases often add end-of-turn ids to the base ones (Llama 3.0 vs 3.1/3.2):
        # generation stops on the target's ids only, so this never changes the output.
        out.append(
            Finding(
                "warning",
                "eos",
                f"end-of-sequence ids differ: {where}; generation stops on the target's ids, so this "
                "only changes what the draft proposes at the end of a turn",
            )
        )
    return out


def _check_template(tt: TextTokenizer, dt: TextTokenizer, compare_ids: bool) -> list[Finding]:
    same_text = tt.chat_template == dt.chat_template
    if not same_text and (tt.chat_template is None or dt.chat_template is None):
        has = "target" if dt.chat_template is None else "draft"
        return [
            Finding(
                "warning",
                "chat_template",
                f"only the {has} has a chat template; chats are rendered with the target's, "
                "so the draft may not have been trained on that format",
            )
        ]
    if not compare_ids:
        why = "chat templates differ (not compared: vocabularies differ)"
        return [] if same_text else [Finding("warning", "chat_template", why)]
    # Rendered ids also depend on the bos/eos strings, so even one template text can differ.
    compared = 0
    for name, chat in SAMPLE_CHATS.items():
        try:
            t_ids = tt.encode_chat(chat)
        except Exception:  # the target's own template refuses this chat (e.g. a system role)
            continue
        try:
            d_ids = dt.encode_chat(chat)
        except Exception as e:  # jinja raises many types; any of them means "cannot render"
            return [_template_finding(f"the draft's template fails on the {name!r} sample ({type(e).__name__}: {e})")]
        if t_ids != d_ids:
            n = min(len(t_ids), len(d_ids))
            at = next((i for i in range(n) if t_ids[i] != d_ids[i]), n)
            return [
                _template_finding(
                    f"chat templates render the {name!r} sample differently (first difference at "
                    f"token {at}: target {_tok_at(tt, t_ids, at)}, draft {_tok_at(dt, d_ids, at)})"
                )
            ]
        compared += 1
    if same_text:
        return []
    if not compared:
        return [_template_finding("chat templates differ and the target's renders none of the sample chats")]
    return [
        Finding(
            "info",
            "chat_template",
            f"chat templates differ in text but render all {compared} sample chats the target "
            "accepts to the same token ids",
        )
    ]


def _template_finding(what: str) -> Finding:
    return Finding(
        "warning",
        "chat_template",
        f"{what}. Prompts are always rendered with the target's template and the draft reads "
        "those ids, so output stays lossless, but a draft trained on another chat format "
        "predicts the target worse (lower acceptance)",
    )


def _tok_at(tok: TextTokenizer, ids: Sequence[int], at: int) -> str:
    return repr(tok.id_to_token(ids[at])) if at < len(ids) else "end of prompt"


def _check_subset(subset: torch.Tensor, tt: TextTokenizer, vocab_size: int) -> list[Finding]:
    ids = subset.flatten().tolist()  # [Vs]
    if any(not 0 <= i < vocab_size for i in ids):
        return [Finding("error", "vocab_subset", f"{VOCAB_SUBSET_KEY} holds ids outside [0, {vocab_size})")]
    out = [
        Finding(
            "info",
            "vocab_subset",
            f"the draft predicts a subset of {len(set(ids))} of the {vocab_size} token ids (reduced "
            "output head; it still reads every id); q is zero outside the subset, which verification "
            "handles exactly",
        )
    ]
    missing = sorted(set(tt.eos_ids) - set(ids))
    if missing:
        out.append(
            Finding(
                "warning",
                "vocab_subset",
                f"the draft's output subset lacks end-of-sequence ids {_describe(tt, missing)}: it "
                "never proposes the end of a turn (lower acceptance there; output stays lossless)",
            )
        )
    return out
