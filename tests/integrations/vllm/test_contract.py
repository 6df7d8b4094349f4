"""The contract between the gateway and the proposer in vLLM: what one writes into vllm_xargs the other reads."""

from __future__ import annotations

import pytest

from draftgate.integrations.vllm.contract import DRAFTER, OPTIONS, SPECULATE, DrafterName, K, SettingsError
from draftgate.integrations.vllm.gateway.plugin_route import PROPOSER_DRAFTERS
from draftgate.integrations.vllm.inside.settings import RequestOptions


@pytest.mark.parametrize("name", PROPOSER_DRAFTERS)
def test_every_drafter_the_gateway_may_send_is_one_the_proposer_reads(name: str) -> None:
    opts = RequestOptions.parse({SPECULATE: 1, DRAFTER: name, K: 2}, k_max=4)
    assert opts.speculate and opts.drafter is DrafterName(name) and opts.k == 2


def test_the_switch_off_and_an_unknown_option_named_with_the_known_ones() -> None:
    assert RequestOptions.parse({SPECULATE: 0}, k_max=4).speculate is False
    with pytest.raises(SettingsError, match=", ".join(OPTIONS)):
        RequestOptions.parse({"draftgate_kk": 1}, k_max=4)
