"""The class vLLM loads: ``--speculative-config '{"method": "custom_class", "model":
"draftgate.integrations.vllm.Proposer", "num_speculative_tokens": 8}'``.

vLLM builds it in its worker with the engine's config and calls ``propose`` once per step.
The drafter is ``DRAFTGATE_VLLM_DRAFTER`` (default ``auto``), or fixed by the class named:
``AutoProposer``, ``SuffixProposer``, ``NgramProposer``, ``RemoteProposer``. Other settings:
`draftgate.integrations.vllm.inside.settings`.

vLLM's interface hands the proposer token ids only; which request a row belongs to, and its
``vllm_xargs``, are read from the model runner that makes the call (the caller's frame, found
once at the first call). A vLLM whose caller offers neither still gets drafts, told apart by
batch row, without per-request options; the proposer says so once in vLLM's log.

Nothing here may end vLLM's engine: any error inside ``propose`` costs that step its drafts
and is logged once.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar

from draftgate.drafters.auto import AutoDrafter
from draftgate.drafters.base import Drafter
from draftgate.drafters.http import HttpDrafter
from draftgate.drafters.ngram import NgramDrafter
from draftgate.drafters.suffix import SuffixDrafter
from draftgate.integrations.vllm.contract import DrafterName
from draftgate.integrations.vllm.inside.plugin import cpu_drafts_unverifiable
from draftgate.integrations.vllm.inside.remote import PrefetchingDrafter, RemoteCounters
from draftgate.integrations.vllm.inside.rounds import ProposerCore, Row
from draftgate.integrations.vllm.inside.settings import ProposerSettings
from draftgate.integrations.vllm.inside.sidecar import Sidecar

__all__ = ["AutoProposer", "NgramProposer", "Proposer", "RemoteProposer", "SuffixProposer", "build_drafters"]

log = logging.getLogger("draftgate.integrations.vllm")

# An HTTP call to the draft worker may finish after its round's deadline: it still lands, so the
# worker's session stays known; only a call this much slower is abandoned.
REMOTE_CALL_TIMEOUT_S = 2.0


def build_drafters(settings: ProposerSettings) -> tuple[dict[DrafterName, Drafter], RemoteCounters | None]:
    """Every drafter this deployment can use (requests may pick one), and the remote tier's counters."""
    drafters: dict[DrafterName, Drafter] = {
        DrafterName.AUTO: AutoDrafter(),
        DrafterName.SUFFIX: SuffixDrafter(),
        DrafterName.NGRAM: NgramDrafter(),
    }
    if settings.draft_url is None:
        return drafters, None
    timeout = max(REMOTE_CALL_TIMEOUT_S, 10 * settings.draft_timeout_s)
    remote = PrefetchingDrafter(
        HttpDrafter(settings.draft_url, timeout_s=timeout), settings.draft_timeout_s, settings.k_max, settings.prefetch
    )
    drafters[DrafterName.REMOTE] = remote
    return drafters, remote.counters


class _RunnerRows:
    """Request ids and options of the batch, read from vLLM's model runner."""

    def __init__(self, runner: Any) -> None:
        self.runner = runner

    def req_ids(self) -> Sequence[str]:
        return self.runner.input_batch.req_ids  # type: ignore[no-any-return]

    def extra_args(self, req_id: str) -> Mapping[str, Any] | None:
        state = self.runner.requests.get(req_id)
        params = None if state is None else state.sampling_params
        return None if params is None else params.extra_args  # type: ignore[no-any-return]


def _runner_of(frame: Any) -> _RunnerRows | None:
    """The model runner that called ``propose`` (vLLM's ``propose_draft_token_ids``), if it is one."""
    caller = frame.f_locals.get("self") if frame is not None else None
    has = hasattr(caller, "input_batch") and hasattr(caller, "requests")
    return _RunnerRows(caller) if has else None


class Proposer:
    """DraftGate's drafters as vLLM's proposer (``custom_class``)."""

    drafter: ClassVar[DrafterName | None] = None  # None: DRAFTGATE_VLLM_DRAFTER

    def __init__(self, vllm_config: Any) -> None:
        unverifiable = cpu_drafts_unverifiable()
        if unverifiable:
            raise RuntimeError(unverifiable)  # vLLM reports it at start, instead of dying at the first round
        spec = vllm_config.speculative_config
        self.settings = ProposerSettings.from_env(
            os.environ,
            k_max=int(spec.num_speculative_tokens),
            drafter=self.drafter,
            max_model_len=int(vllm_config.model_config.max_model_len),
        )
        drafters, self.remote = build_drafters(self.settings)
        self.core = ProposerCore(self.settings, drafters)
        self.sidecar: Sidecar | None = None
        if self.settings.control_port:
            side = Sidecar(self.core, self.remote, self.settings.control_host, self.settings.control_port)
            self.sidecar = side if side.start() else None
        self._rows: _RunnerRows | None = None
        self._looked = False
        self._failed = False
        s = self.settings
        log.info(
            "DraftGate proposer: drafter %s, K %s (max %d)%s",
            s.drafter.value,
            "auto" if s.k is None else s.k,
            s.k_max,
            f", draft worker {s.draft_url} (deadline {s.draft_timeout_s * 1000:g} ms, "
            f"prefetch {'on' if s.prefetch else 'off'})"
            if s.draft_url
            else "",
        )

    def load_model(self, *args: object, **kwargs: object) -> None:
        """vLLM hands the proposer the target model; DraftGate's drafters need none of it."""

    def propose(
        self,
        sampled_token_ids: list[list[int]],
        num_tokens_no_spec: Any,
        token_ids_cpu: Any,
        slot_mappings: object = None,
    ) -> list[list[int]]:
        """Draft ids per row of vLLM's batch (``[]``: none). Never raises."""
        try:
            if not self._looked:
                self._look_for_runner(sys._getframe(1))
            return self.core.step(self._batch(sampled_token_ids, num_tokens_no_spec, token_ids_cpu))
        except Exception:
            if not self._failed:
                self._failed = True
                log.exception("DraftGate proposer failed; this step (and any other that fails) proposes nothing")
            return [[] for _ in sampled_token_ids]

    def _look_for_runner(self, frame: Any) -> None:
        self._looked = True
        self._rows = _runner_of(frame)
        if self._rows is None:
            log.warning(
                "DraftGate proposer: the caller is not vLLM's model runner; requests are told apart by batch "
                "row and per-request options (vllm_xargs) are ignored"
            )

    def _batch(self, sampled: list[list[int]], num_tokens: Any, token_ids: Any) -> list[Row]:
        view = self._rows
        ids = view.req_ids() if view is not None else [f"row-{i}" for i in range(len(sampled))]
        rows = []
        for i, toks in enumerate(sampled):
            req_id = ids[i]
            n = int(num_tokens[i])
            extra = view.extra_args(req_id) if view is not None and not self.core.known(req_id) else None
            rows.append(Row(req_id, token_ids[i, :n].tolist(), len(toks), extra))
        return rows


class AutoProposer(Proposer):
    drafter = DrafterName.AUTO


class SuffixProposer(Proposer):
    drafter = DrafterName.SUFFIX


class NgramProposer(Proposer):
    drafter = DrafterName.NGRAM


class RemoteProposer(Proposer):
    drafter = DrafterName.REMOTE
